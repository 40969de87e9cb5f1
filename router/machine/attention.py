"""Grouped-query attention without copies on the CPU.

The Qwen2.5 pair (like most current LLMs) uses grouped-query attention: 12 query heads share 2 key/value
heads in the 1.5B verifier. transformers' SDPA path hands torch's kernel one key/value head per query
head, copying each shared head to the query heads it serves (`repeat_kv`), unless
TRANSFORMERS_SDPA_FORCE_GQA=1 or the call has no mask; the speculative loop and the consequence
search always pass a padding mask, so on the CPU every forward copied the whole KV cache 6 times per
layer. torch's CPU kernel takes the shared heads directly (`enable_gqa`, torch >= 2.5), with the same
arithmetic per head: benchmarks/gqa_attention.py measures the speed-up and checks the logits.

It is a trade-off, so it is opt-in (`fast_cpu_attention()`, or the variable set by hand), not a
default: on 2 AMD EPYC cores in bf16 it made a 5-token verification forward 0.80x at batch 16 with
bitwise the same logits, but a one-token step (the drafter's every step, verifier-only decoding, the
consequence search's answers) 1.7x-2.7x slower at batch 4-16, with logits that round differently (max
|difference| 0.11, an argmax flipped at batch 16): transformers packs the query heads of a one-token
step into a query block per key/value head, another kernel shape (docs/results.md).
"""

from __future__ import annotations

import os

import torch

FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"


def fast_cpu_attention() -> bool:
    """Opt in to SDPA's own grouped-query attention (no key/value copies); True when the flag is on
    afterwards. Kept as the user set it, if they did; off for torch < 2.5 (no enable_gqa)."""
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        return False
    os.environ.setdefault(FLAG, "1")
    return os.environ[FLAG] == "1"
