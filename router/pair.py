"""Load a drafter/verifier pair on any engine's backend (router/backends/): hub ids, local folders, GGUF files, or
the embedded default (router/infra/embedded.py assembles it from installed packages), and tell pairs apart by the
fingerprints of their weights and tokenizer. Loading from a spec is router/loading.py's (re-exported here).
"""

from __future__ import annotations

import hashlib
import json

import torch

from router.backends import DEFAULT_ENGINE, backend_named, backend_of, engine_names, get_engine
from router.infra.config import ConfigError
from router.loading import (  # noqa: F401 (re-exported: router.pair is where users and stages load pairs from)
    END_OF_TEXT,
    Pair,
    check_device,
    check_same_tokenizer,
    gguf_end_tokens,
    load_model,
    resolve_model_path,
    same_files,
    tiny_pair,
    tokenizer_fingerprint,
)
from router.records import Manifest, RecordsError

DEFAULT_DRAFTER = "embedded:drafter"
DEFAULT_VERIFIER = "embedded:verifier"


def check_engine(engine: str, threads: int, device: str, device_map: str | None, served: bool = False) -> None:
    """The engine's settings (router.backends.ENGINES): a CPU-only engine on the CPU, `threads` >= 0 (0: chosen from
    the machine); `served`: an engine with its own loop is allowed too (eval), which places the models itself."""
    try:
        spec = get_engine(engine, loop_only=not served)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if not spec.loop and device_map is not None:
        raise ConfigError(f"engine {engine} places the models itself: leave verifier_device_map unset")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ConfigError(f"threads must be an integer >= 0 (0: chosen from the machine), got {threads!r}")
    if spec.cpu_only and (device != "cpu" or device_map is not None):
        raise ConfigError(f"engine {engine} runs on the CPU here: leave device at cpu and verifier_device_map unset")


def model_fingerprint(model) -> str:
    """sha256 over a model's parameters (names, shapes and values), first 16 hex digits.

    The identity of the weights, not of how they were loaded: floating tensors are hashed as their
    bfloat16 rounding, so one checkpoint loaded in float32 or in bfloat16 (the `auto` dtype differs
    between machines) has one fingerprint, and records, routers and eval runs of the same pair in
    different dtypes are recognised as the same pair. (A float16 load of a float32 checkpoint can
    round differently and is not guaranteed to match.)
    """
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            tensor = tensor.to(torch.bfloat16)
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


_FINGERPRINTS: dict = {}  # id(object) -> (weakref to it, its stamp, fingerprint)


def _fingerprint_once(obj, stamp, compute) -> str:
    """compute(obj), remembered for this object while `stamp` (what changes when it does) is the same."""
    import weakref

    hit = _FINGERPRINTS.get(id(obj))
    if hit is None or hit[0]() is not obj or hit[1] != stamp:
        hit = (weakref.ref(obj), stamp, compute(obj))
        _FINGERPRINTS[id(obj)] = hit
    return hit[2]


def cached_fingerprint(model) -> str:
    """model_fingerprint, computed once per model object while its weights are unchanged (every
    in-place change bumps a parameter's version counter), so checking a pair at every decode is cheap. An
    engine's model fingerprints itself (`fingerprint`: a GGUF file's hash, router.backends.llamacpp)."""
    if callable(getattr(model, "fingerprint", None)):
        return model.fingerprint()
    return _fingerprint_once(model, tuple(p._version for p in model.parameters()), model_fingerprint)


def pair_identity(drafter, verifier, tokenizer) -> dict:
    """The pair's identity in the form a Manifest's `pair` has (weight and tokenizer fingerprints);
    a role given as None is left out."""
    out = {}
    if drafter is not None:
        out["drafter"] = cached_fingerprint(drafter)
    if verifier is not None:
        out["verifier"] = cached_fingerprint(verifier)
    if tokenizer is not None:
        out["tokenizer"] = _cached_tokenizer_fingerprint(tokenizer)[:16]
    return out


def _cached_tokenizer_fingerprint(tokenizer) -> str:
    """tokenizer_fingerprint once per tokenizer object (again when tokens were added to it)."""
    return _fingerprint_once(tokenizer, len(tokenizer), tokenizer_fingerprint)


def check_pair_is(pair, recorded: dict, where: str) -> None:
    """Refuse to decode with other models than the ones `recorded` (a Manifest's or a router's `pair`)
    names: offline numbers and online decoding must describe one pair."""
    check_identity_is(pair_identity(*pair), recorded, where)


def check_identity_is(here: dict, recorded: dict, where: str) -> None:
    """check_pair_is on a pair's identity (pair_identity) computed once, e.g. a served pair's."""
    wrong = [
        r for r in ("drafter", "verifier", "tokenizer") if recorded.get(r) and r in here and recorded[r] != here[r]
    ]
    if wrong:
        found = ", ".join(f"{r}: {recorded[r]} there, {here[r]} here" for r in wrong)
        raise ValueError(
            f"the loaded {' and '.join(wrong)} differ from the ones {where} was made with ({found}): use that "
            f"pair (drop a drafter=/verifier= override), or record and train with this one"
        )


def one_pair(manifests: list[Manifest], folders: list) -> list[Manifest]:
    """The manifests, refused when the folders come from two model pairs (a router learns one, and
    one evaluation compares methods on one pair)."""
    pairs = {json.dumps(m.pair, sort_keys=True) for m in manifests}
    if len(pairs) > 1:
        raise RecordsError(
            f"the record folders {list(folders)} come from different model pairs ({sorted(pairs)}): "
            f"use folders of one pair"
        )
    return manifests


def load_pair(
    drafter: str = DEFAULT_DRAFTER,
    verifier: str = DEFAULT_VERIFIER,
    dtype: str | torch.dtype = "auto",
    device: str = "cpu",
    verifier_device_map: str | None = None,
    engine: str = DEFAULT_ENGINE,
    threads: int = 0,
) -> Pair:
    """Load the Pair (drafter, verifier, tokenizer) on `engine`'s backend, refusing pairs whose tokenizers differ.

    torch: transformers models in `dtype` (as `load_model`; default `auto`: bf16 only where it is native) on
    `device`; verifier_device_map (e.g. "auto") loads the verifier with that accelerate device map, for a verifier
    too large for one device. `tiny:drafter` + `tiny:verifier` give `tiny_pair()` (tests, CI).
    llamacpp: both models as GGUF files in llama.cpp (router/backends/llamacpp.py): the embedded pair's own GGUF
    files, the tiny pair written as GGUF, or two `.gguf` paths (the tokenizer from the verifier's file), each with
    `threads` threads (0: the machine's physical cores, 1 when it is loaded); dtype and devices do not apply
    there (the files' own weights, on the CPU).
    """
    if engine not in engine_names(loop_only=True):
        raise ValueError(f"engine must be one of {', '.join(engine_names(loop_only=True))}, got {engine!r}")
    return backend_named(engine).load_pair(drafter, verifier, dtype, device, verifier_device_map, threads)


def adopt_records_identity(models, specs: tuple[str, str], manifest) -> bool:
    """Where an engine's models were loaded from the files another engine's recording's models were converted from
    (same_files), give them the records' fingerprints, so routers trained on those records decode here: the same
    weights, run by another engine. True when adopted (the caller says so in one note)."""
    return backend_of(models[1]).adopt_identity(models, specs, manifest)
