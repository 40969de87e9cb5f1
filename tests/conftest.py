"""Shared fixtures: tiny random Qwen2 models built from configs (no downloads) and stub models."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 96
EOS = 2


def tiny_qwen(seed: int, layers: int = 2, hidden: int = 64, vocab: int = VOCAB) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 causal LM, float32, eval mode, EOS id 2."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, eos_token_id=EOS, bos_token_id=1, pad_token_id=0,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy paths are not near-ties
        model.lm_head.weight.mul_(25.0)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="session")
def tiny_pair():
    """(drafter, verifier): two different random tiny models sharing one vocabulary."""
    return tiny_qwen(seed=1, layers=1, hidden=32), tiny_qwen(seed=2, layers=2, hidden=64)


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (input_ids, attention_mask), both (B, T)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    return ids, mask


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
