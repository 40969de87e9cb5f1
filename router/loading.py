"""Loading models and tokenizers from what a user writes (a local folder, a .gguf file, embedded:drafter|verifier,
tiny:drafter|verifier or a hub id): the pieces every engine's backend and router.pair share. `Pair` is what
`router.pair.load_pair` returns on any engine.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from router.infra.embedded import embedded_path
from router.infra.quiet import third_party
from router.machine.hardware import announce, resolve_dtype


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


class Pair(NamedTuple):
    """A drafter and a verifier sharing one tokenizer (`drafter, verifier, tok = load_pair()` works)."""

    drafter: Any
    verifier: Any
    tokenizer: Any


def same_files(spec: str) -> bool:
    """True for a model spec whose torch model and llama.cpp model hold the same weights from one file (the
    embedded pair, converted from its GGUF files; the tiny pair, written as GGUF): what one engine recorded or
    trained on, the other may decode (their fingerprints differ only in how each engine hashes them)."""
    return spec.startswith(("embedded:", "tiny:"))


def tiny_pair(seed: int = 0, noise: float = 0.002):
    """The Pair (drafter, verifier, tokenizer): the drafter is the verifier with N(0, noise) added."""
    from router.loop.tiny import ByteTokenizer, tiny_model  # transformers' Qwen2: only when asked for

    verifier = tiny_model(seed)
    drafter = copy.deepcopy(verifier)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for w in drafter.parameters():
            w.add_(torch.randn(w.shape, generator=gen) * noise)
    drafter.name_or_path = f"tiny:drafter-seed{seed}"
    verifier.name_or_path = f"tiny:verifier-seed{seed}"
    return Pair(drafter, verifier, ByteTokenizer())
