"""Token ids outside the vocabulary are named (router/loop/common.py)."""

from __future__ import annotations

import pytest


def test_token_ids_outside_the_vocabulary_are_named(tiny):
    import torch

    from router.decoding import generate

    for ids in (torch.tensor([[10**6]]), torch.tensor([[-3, 5]])):
        with pytest.raises(ValueError, match=r"input_ids holds token id .* outside the models' vocabulary \(0 to "):
            generate(tiny.drafter, tiny.verifier, ids, rule="opt", alpha=0.3, max_new_tokens=2)
