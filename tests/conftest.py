"""Shared fixtures: tiny random Qwen2 models built from configs (no downloads) and stub models."""

from __future__ import annotations

import os

import torch

from router.tasks import sandbox as executor
from router.engine.layout import left_pad
from router.engine.tiny import tiny_model

VOCAB = 96
EOS = 2

if not (
    executor.bwrap_works() or executor.unshare_works()
):  # code-task tests still run (the escape tests skip, saying why)
    os.environ.setdefault("SPECROUTE_SANDBOX", "python")


def tiny_qwen(seed: int, layers: int = 2, hidden: int = 64, vocab: int = VOCAB):
    """A random Qwen2 causal LM (float32, eval mode, EOS id 2) over a small vocabulary."""
    return tiny_model(seed, layers, hidden, vocab)


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad(prompts, pad)


class _StubCache:
    """Stands in for a KV cache: only tracks its length (the stub's logits need no memory)."""

    def __init__(self):
        self.length = 0

    def crop(self, n: int) -> None:
        assert n < 0, "crop takes a negative count"
        self.length += n

    def batch_select_indices(self, rows) -> None:
        pass


class StubLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the position being predicted.

    `choose(pos) -> token` gives the argmax at position pos (0-based, counting prompt tokens);
    `probs(pos) -> (V,)` may give a full distribution instead. Forward calls are counted.
    """

    def __init__(self, choose=None, probs=None, vocab: int = 16, eos: int = 2):
        super().__init__()
        self.choose, self.probs, self.vocab = choose, probs, vocab
        self.head = torch.nn.Linear(1, vocab, bias=False)
        self.config = type("Cfg", (), {"eos_token_id": eos})()
        self.generation_config = type("Gen", (), {"eos_token_id": eos, "pad_token_id": 0})()
        self.calls = 0

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, attention_mask, position_ids, cache=None, use_cache=True, logits_to_keep=1):
        self.calls += 1
        cache = cache or _StubCache()
        cache.length += input_ids.shape[1]
        assert cache.length == attention_mask.shape[1], "the cache and the mask disagree on length"
        nxt = position_ids[:, -logits_to_keep:] + 1  # (B, keep) positions being predicted
        if self.probs is not None:
            logits = torch.stack([torch.stack([self.probs(int(t)) for t in row]) for row in nxt]).log()
        else:
            logits = torch.full((*nxt.shape, self.vocab), -20.0)
            for b, row in enumerate(nxt):
                for k, t in enumerate(row):
                    logits[b, k, self.choose(int(t))] = 20.0
        return type("Out", (), {"logits": logits, "cache": cache})()
