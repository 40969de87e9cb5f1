"""Drafts looked up in a reference answer (router/loop/lookup.py): the verifier's greedy output exactly,
in fewer verifier passes when the output repeats the reference."""

import numpy as np
import pytest
import torch

from router.loop.baselines import generate_autoregressive
from router.decoding import generate
from router.loop.layout import left_pad
from router.loop.lookup import LookupDrafter
from router.loop.prefix import SharedPrefix
from router.pair import tiny_pair


@pytest.fixture(scope="module")
def verifier():
    return tiny_pair(seed=2)[1]


def _greedy(verifier, prompts, n, prefix=None):
    ids, mask = left_pad(prompts, 0)
    out = generate_autoregressive(verifier, ids, max_new_tokens=n, attention_mask=mask, role="verifier", prefix=prefix)
    return [out.sequences[b, ids.shape[1] :][out.sources[b] >= 0].tolist() for b in range(len(prompts))], out


def _lookup(verifier, prompts, refs, n, gamma=4, prefix=None):
    ids, mask = left_pad(prompts, 0)
    out = generate(
        LookupDrafter(refs, [len(p) for p in prompts]),
        verifier,
        ids,
        rule="lossless",
        gamma=gamma,
        temperature=0.0,
        attention_mask=mask,
        max_new_tokens=n,
        draft_stop=0.5,
        prefix=prefix,
    )
    return [out.sequences[b, ids.shape[1] :][out.sources[b] >= 0].tolist() for b in range(len(prompts))], out


def test_lookup_drafts_give_the_verifiers_greedy_output_in_fewer_passes(verifier):
    shared = [7, 9, 11, 13] * 10
    prompts = [shared + [20 + i, 30 + 2 * i] for i in range(3)] + [[5, 6]]
    want, plain = _greedy(verifier, prompts, 24)
    for prefix in (None, SharedPrefix.common(prompts[:3])):
        rows = prompts[:3] if prefix else prompts
        own, _ = _greedy(verifier, rows, 24, prefix)
        got, out = _lookup(verifier, rows, own, 24, prefix=prefix)  # the reference is the answer itself
        assert got == want[: len(rows)]
        assert out.stats["verifier_forwards"] * 3 < plain.stats["verifier_forwards"]  # ~5 tokens per pass
    rng = np.random.default_rng(0)
    for refs in (
        [rng.integers(3, 259, 30).tolist() for _ in prompts],  # nothing to find: one token per pass
        [w[:5] + [1, 2] + w[5:] for w in want],  # the answer with two tokens inserted
        [[] for _ in prompts],
    ):
        got, _ = _lookup(verifier, prompts, refs, 24)
        assert got == want


def test_proposals_follow_the_nearest_aligned_ngram():
    drafter = LookupDrafter([[1, 2, 3, 9, 1, 2, 4, 5]], [2])
    seq = np.array([70, 71, 1, 2])  # prompt [70, 71], answer so far [1, 2]: aligned next index 2
    assert drafter.propose(0, seq) == 3
    assert drafter.propose(0, np.array([70, 71, 1, 2, 3, 9, 1, 2])) == 4  # the later "1 2" is the aligned one
    assert drafter.propose(0, np.array([70, 71, 8, 8])) is None
    with pytest.raises(ValueError, match="one each per row"):
        LookupDrafter([[1]], [1, 2])


def test_a_lookup_drafter_refuses_what_needs_a_network(verifier):
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="no network"):
        generate(LookupDrafter([[1, 2]], [3]), verifier, ids, rule="lossless", gamma="auto")
