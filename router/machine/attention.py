"""Grouped-query attention without copies on the CPU.

The Qwen2.5 pair (like most current LLMs) uses grouped-query attention: 12 query heads share 2 key/value
heads in the 1.5B verifier. transformers' SDPA path hands torch's kernel one key/value head per query
head, copying each shared head to the query heads it serves (`repeat_kv`), unless
TRANSFORMERS_SDPA_FORCE_GQA=1 or the call has no mask; the speculative loop and the consequence
search always pass a padding mask, so on the CPU every forward copied the whole KV cache 6 times per
layer. torch's CPU kernel takes the shared heads directly (`enable_gqa`, torch >= 2.5), with the same
arithmetic per head: benchmarks/gqa_attention.py measures the speed-up and checks the logits.

`fast_cpu_attention()` sets the flag (a user's own setting is kept); `load_model` calls it for models
it puts on the CPU. It is not set for CUDA, where transformers keeps masked GQA calls off the fused
kernels on purpose.
"""

from __future__ import annotations

import os

import torch

FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"


def fast_cpu_attention() -> bool:
    """Ask transformers for SDPA's own grouped-query attention (no key/value copies); True when the
    flag is on afterwards. Kept as the user set it, if they did; off for torch < 2.5 (no enable_gqa)."""
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        return False
    os.environ.setdefault(FLAG, "1")
    return os.environ[FLAG] == "1"
