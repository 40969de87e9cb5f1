"""Load a drafter/verifier pair: hub ids, local folders, GGUF files, or the embedded default
(router/infra/embedded.py assembles it from installed packages), and tell pairs apart by the
fingerprints of their weights and tokenizer.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from router.infra.config import ConfigError
from router.infra.embedded import cache_root, embedded_gguf, embedded_path
from router.infra.quiet import third_party
from router.machine.hardware import announce, resolve_dtype
from router.records import Manifest, RecordsError

DEFAULT_DRAFTER = "embedded:drafter"
DEFAULT_VERIFIER = "embedded:verifier"
ENGINES = ("torch", "llamacpp")  # what runs the models: transformers, or llama.cpp on GGUF files
# engines that run specroute's policies inside their own loop (router/vllm): eval decodes its grid through them
SERVING_ENGINES = ("vllm",)


def check_engine(engine: str, threads: int, device: str, device_map: str | None, serving: bool = False) -> None:
    """The engine's settings: llama.cpp runs GGUF files on the CPU, with `threads` threads (0: chosen from the
    machine, router.engine.llamacpp.choose_threads); `serving`: vLLM is allowed too (where installed)."""
    allowed = ENGINES + (SERVING_ENGINES if serving else ())
    if engine not in allowed:
        raise ConfigError(f"engine must be one of {', '.join(allowed)}, got {engine!r}")
    if engine == "vllm" and device_map is not None:
        raise ConfigError("engine vllm places the models itself: leave verifier_device_map unset")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ConfigError(f"threads must be an integer >= 0 (0: chosen from the machine), got {threads!r}")
    if engine == "llamacpp" and (device != "cpu" or device_map is not None):
        raise ConfigError("engine llamacpp runs on the CPU here: leave device at cpu and verifier_device_map unset")


def resolve_model_path(spec: str, dtype: torch.dtype = torch.bfloat16) -> tuple[str, dict]:
    """Map a user model spec to (path or hub id, extra from_pretrained kwargs).

    Accepts `embedded:drafter`, `embedded:verifier`, a local folder, a `.gguf` file or a hub id.
    """
    if spec.startswith("embedded:"):
        return str(embedded_path(spec.split(":", 1)[1], dtype)), {}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    if _looks_like_a_path(spec) and not path.is_dir():
        raise FileNotFoundError(
            f"model folder {path} does not exist (a spec is a local folder, a .gguf file, embedded:drafter|verifier, "
            f"tiny:drafter|verifier or a hub id such as Qwen/Qwen2.5-0.5B; nothing is downloaded here)"
        )
    return spec, {}


def _looks_like_a_path(spec: str) -> bool:
    """A spec meant as a local folder: it starts like a path, or has more than one `/` (a hub id is owner/name)."""
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1 or Path(spec).expanduser().exists()


def check_device(device: str) -> None:
    """Refuse a device this machine does not have, before loading anything."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r} is not a device name: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} was asked for but this machine has no CUDA device (torch "
            f"{torch.__version__}): use device=cpu"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def load_model(spec: str, dtype: str | torch.dtype = "auto", device: str = "cpu", device_map: str | None = None):
    """Load one causal LM and its tokenizer from any spec `resolve_model_path` accepts.

    dtype: `auto` (bf16 where the hardware has it natively, float32 elsewhere; see router.machine.hardware),
    a name (float32, bfloat16, float16) or a torch.dtype. device_map (e.g. "auto", through
    accelerate) spreads a model that does not fit on one device over the visible GPUs (and the
    CPU); inputs then go to the device of its first parameters, as everywhere in specroute.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_device(device)
    choice = resolve_dtype(dtype, device)
    announce(choice, device)
    path, extra = resolve_model_path(spec, choice.dtype)
    with third_party():  # transformers' loading bars and notes: to the command's log (router/infra/quiet.py)
        if device_map is not None:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.dtype, device_map=device_map, **extra)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.dtype, **extra).to(device)
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    model.eval()
    if spec.startswith("embedded:") or spec.endswith(".gguf"):
        model.generation_config.eos_token_id = gguf_end_tokens(tokenizer, model.generation_config.eos_token_id)
    return model, tokenizer


END_OF_TEXT = "<|endoftext|>"


def gguf_end_tokens(tokenizer, eos) -> list[int] | int | None:
    """A model converted from GGUF carries one EOS id (Qwen instruct: <|im_end|>), where the released
    generation config lists <|endoftext|> too ([151645, 151643]); without it a model that writes
    <|endoftext|> after its answer (as the 1.5B coder does on few-shot prompts) goes on writing a
    new conversation. Both, when the vocabulary has <|endoftext|>."""
    ids = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
    end = tokenizer.convert_tokens_to_ids(END_OF_TEXT) if END_OF_TEXT in tokenizer.get_vocab() else None
    if end is None or end in ids or not ids:
        return eos
    return [*ids, end]


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


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary and special tokens: equal fingerprints mean interchangeable ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = [tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id]
    return hashlib.sha256(json.dumps([vocab, special]).encode()).hexdigest()


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
    engine's model fingerprints itself (`fingerprint`: a GGUF file's hash, router.engine.llamacpp)."""
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
    here = pair_identity(*pair)
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


def check_same_tokenizer(drafter_tok, verifier_tok) -> None:
    """Refuse a pair whose tokenizers differ: the cascade compares distributions id by id."""
    if tokenizer_fingerprint(drafter_tok) != tokenizer_fingerprint(verifier_tok):
        raise ValueError(
            "drafter and verifier tokenizers differ (vocabulary or special tokens): a speculative "
            "cascade compares the two models token id by token id, so pick a pair from one model "
            f"family (drafter vocab {len(drafter_tok)}, verifier vocab {len(verifier_tok)})"
        )


class Pair(NamedTuple):
    """A drafter and a verifier sharing one tokenizer (`drafter, verifier, tok = load_pair()` works)."""

    drafter: Any
    verifier: Any
    tokenizer: Any


def load_pair(
    drafter: str = DEFAULT_DRAFTER,
    verifier: str = DEFAULT_VERIFIER,
    dtype: str | torch.dtype = "auto",
    device: str = "cpu",
    verifier_device_map: str | None = None,
    engine: str = "torch",
    threads: int = 0,
) -> Pair:
    """Load the Pair (drafter, verifier, tokenizer), refusing pairs whose tokenizers differ.

    engine "llamacpp" loads both models as GGUF files in llama.cpp (router.engine.llamacpp): the embedded
    pair's own GGUF files, the tiny pair written as GGUF, or two `.gguf` paths (the tokenizer from the
    verifier's file), each with `threads` threads (0: chosen from the machine by
    `router.engine.llamacpp.choose_threads`: its physical cores, 1 when it is loaded); dtype and devices do
    not apply there (the GGUF's own weights, on the CPU).
    verifier_device_map (e.g. "auto") loads the verifier with that accelerate device map, for a
    verifier too large for one device; the drafter goes to `device`.
    dtype as in `load_model` (default `auto`: bf16 only where it is native). `tiny:drafter` +
    `tiny:verifier` give `tiny_pair()` (router.engine.tiny's random models; tests, CI).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "llamacpp":
        return _llamacpp_pair(drafter, verifier, threads)
    if drafter.startswith("tiny:") or verifier.startswith("tiny:"):
        if (drafter, verifier) != ("tiny:drafter", "tiny:verifier"):
            raise ValueError(
                "the tiny pair is `tiny:drafter` with `tiny:verifier`; it cannot be mixed with other models"
            )
        if verifier_device_map is not None:
            raise ValueError(
                "verifier_device_map needs a saved model (a hub id or a folder): the tiny pair is built in memory"
            )
        check_device(device)
        choice = resolve_dtype(dtype, device)
        d_model, v_model, tok = tiny_pair()
        return Pair(d_model.to(device, choice.dtype), v_model.to(device, choice.dtype), tok)
    for spec in (drafter, verifier):  # a missing folder is said before either model loads
        resolve_model_path(spec)
    d_model, d_tok = load_model(drafter, dtype, device)
    v_model, v_tok = load_model(verifier, dtype, device, device_map=verifier_device_map)
    check_same_tokenizer(d_tok, v_tok)
    if v_tok.pad_token_id is None:
        v_tok.pad_token = v_tok.eos_token
    return Pair(d_model, v_model, v_tok)


def same_files(spec: str) -> bool:
    """True for a model spec whose torch model and llama.cpp model hold the same weights from one file (the
    embedded pair, converted from its GGUF files; the tiny pair, written as GGUF): what one engine recorded or
    trained on, the other may decode (their fingerprints differ only in how each engine hashes them)."""
    return spec.startswith(("embedded:", "tiny:"))


def adopt_records_identity(models, specs: tuple[str, str], manifest) -> bool:
    """Where llama.cpp models were loaded from the GGUF files a torch recording's models were converted from
    (same_files), give them the records' fingerprints, so routers trained on those records decode here: the
    same weights, run by another engine. True when adopted (the caller says so in one note)."""
    from router.engine.llamacpp import is_llamacpp

    recorded_on = manifest.dtype.get("engine", "torch")
    if recorded_on == "llamacpp" or not is_llamacpp(models[1]) or not all(same_files(s) for s in specs):
        return False
    for role, model in zip(("drafter", "verifier"), models[:2]):
        model.adopt_fingerprint(manifest.pair[role])
    return True


def _llamacpp_pair(drafter: str, verifier: str, threads: int) -> Pair:
    """The pair as llama.cpp models (see load_pair), both with the threads chosen once."""
    from router.engine.llamacpp import choose_threads

    threads, why = choose_threads(threads)
    pair = _llamacpp_models(drafter, verifier, threads)
    for model in pair[:2]:
        model.threads_reason = why
    return pair


def _llamacpp_models(drafter: str, verifier: str, threads: int) -> Pair:
    from router.engine.llamacpp import LlamaCppLM

    if (drafter, verifier) == ("tiny:drafter", "tiny:verifier"):
        from router.engine.tiny import ByteTokenizer

        paths = tiny_gguf_pair(cache_root() / "gguf")
        return Pair(LlamaCppLM(paths[0], threads), LlamaCppLM(paths[1], threads), ByteTokenizer())
    files = [
        embedded_gguf(spec.split(":", 1)[1]) if spec.startswith("embedded:") else Path(spec)
        for spec in (drafter, verifier)
    ]
    for spec, path in zip((drafter, verifier), files):
        if path.suffix != ".gguf" or not path.is_file():
            raise ValueError(
                f"engine llamacpp loads GGUF files: {spec} is not one (give embedded:drafter, a .gguf path)"
            )
    tokenizers = [_gguf_tokenizer(spec, path) for spec, path in zip((drafter, verifier), files)]
    check_same_tokenizer(*tokenizers)
    if tokenizers[1].pad_token_id is None:
        tokenizers[1].pad_token = tokenizers[1].eos_token
    return Pair(LlamaCppLM(files[0], threads), LlamaCppLM(files[1], threads), tokenizers[1])


def _gguf_tokenizer(spec: str, path: Path):
    """The tokenizer of a GGUF model: the embedded pair's converted folder (no conversion twice), else the file's."""
    from transformers import AutoTokenizer

    if spec.startswith("embedded:"):
        return AutoTokenizer.from_pretrained(resolve_model_path(spec)[0])
    with third_party():
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def tiny_gguf_pair(folder: str | Path, seed: int = 0, noise: float | None = None) -> tuple[Path, Path]:
    """(drafter.gguf, verifier.gguf) of `tiny_pair(seed, noise)` in `folder`, written once per seed and noise
    (router.engine.tiny_gguf: what the llama.cpp engine loads in tests and CI)."""
    from router.engine.tiny_gguf import write_tiny_gguf

    folder = Path(folder)
    tag = f"seed{seed}" if noise is None else f"seed{seed}-noise{noise:g}"
    paths = folder / f"tiny-drafter-{tag}.gguf", folder / f"tiny-verifier-{tag}.gguf"
    if not all(path.exists() for path in paths):
        models = tiny_pair(seed)[:2] if noise is None else tiny_pair(seed, noise)[:2]
        for model, path in zip(models, paths):
            write_tiny_gguf(model, path)
    return paths


def tiny_pair(seed: int = 0, noise: float = 0.002):
    """The Pair (drafter, verifier, tokenizer): the drafter is the verifier with N(0, noise) added."""
    from router.engine.tiny import ByteTokenizer, tiny_model  # transformers' Qwen2: only when asked for

    verifier = tiny_model(seed)
    drafter = copy.deepcopy(verifier)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for w in drafter.parameters():
            w.add_(torch.randn(w.shape, generator=gen) * noise)
    drafter.name_or_path = f"tiny:drafter-seed{seed}"
    verifier.name_or_path = f"tiny:verifier-seed{seed}"
    return Pair(drafter, verifier, ByteTokenizer())
