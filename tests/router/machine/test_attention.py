"""Grouped-query attention without KV copies on the CPU (router/machine/attention.py): opt-in (loading a
pair leaves transformers' default alone; a user's own setting is kept), what the flag changes in the
kernel call, and on the tiny pair the same logits and cascade tokens with and without it."""

import os

import pytest
import torch

from router.decoding import generate
from router.pair import tiny_pair
from router.machine.attention import FLAG, fast_cpu_attention
from router.pair import load_pair


def test_it_is_opt_in_and_a_users_choice_is_kept(monkeypatch):
    monkeypatch.setenv(FLAG, "0")  # recorded first, so the variable is restored as it was, even absent
    monkeypatch.delenv(FLAG)
    load_pair("tiny:drafter", "tiny:verifier", "float32")
    assert FLAG not in os.environ  # one-token steps are slower with it (docs/results.md): not a default
    assert fast_cpu_attention() is True and os.environ[FLAG] == "1"
    monkeypatch.setenv(FLAG, "0")
    assert fast_cpu_attention() is False and os.environ[FLAG] == "0"


def _with_flag(monkeypatch, value: str, fn):
    monkeypatch.setenv(FLAG, value)
    return fn()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_and_tokens_are_the_same_with_and_without_it(monkeypatch, dtype):
    drafter, verifier, _ = tiny_pair(seed=3)
    drafter, verifier = drafter.to(dtype), verifier.to(dtype)
    assert verifier.config.num_key_value_heads < verifier.config.num_attention_heads  # GQA: heads are shared
    ids = torch.randint(3, 200, (3, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # a left-padded row: the masked path, where the KV copies were made

    def logits():
        with torch.inference_mode():
            return verifier(input_ids=ids, attention_mask=mask).logits

    def decode():
        out = generate(drafter, verifier, ids, rule="token_v2", alpha=0.3, gamma=4, max_new_tokens=12,
                       attention_mask=mask)  # fmt: skip
        return out.sequences

    assert torch.equal(_with_flag(monkeypatch, "0", logits), _with_flag(monkeypatch, "1", logits))
    assert torch.equal(_with_flag(monkeypatch, "0", decode), _with_flag(monkeypatch, "1", decode))


def test_with_the_flag_the_kernel_gets_the_shared_heads_uncopied(monkeypatch):
    """What the flag changes: torch's kernel receives the 2 key/value heads with enable_gqa, not 4 copies."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((key.shape[1], kwargs.get("enable_gqa", False)))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    _, verifier, _ = tiny_pair(seed=3)
    ids, mask = torch.randint(3, 200, (2, 8)), torch.tensor([[1] * 8, [0] * 3 + [1] * 5])
    for flag, want in (("0", (4, False)), ("1", (2, True))):
        seen.clear()
        with torch.inference_mode():
            _with_flag(monkeypatch, flag, lambda: verifier(input_ids=ids, attention_mask=mask))
        assert set(seen) == {want}
