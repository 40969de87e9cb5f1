"""Short-horizon (SelfJudge) scores, data_gen/horizon.py: the cached computation equals one plain
forward per mismatch, and the score means what it says."""

from __future__ import annotations

import numpy as np
import torch

from data_gen.horizon import HORIZONS, horizon_scores
from router.loop.prefix import SharedPrefix


def _plain(verifier, prompt, answer, t, d, h):
    """score_H from two full forwards (the original sequence and the swapped one), no cache."""
    with torch.no_grad():
        orig = verifier(torch.tensor([prompt + answer])).logits[0].float().log_softmax(-1)
        swapped = answer[:t] + [d] + answer[t + 1 :]
        alt = verifier(torch.tensor([prompt + swapped])).logits[0].float().log_softmax(-1)
    a = len(prompt) + t
    k = min(h, len(answer) - 1 - t)
    o = orig[a - 1 : a + k].max(-1).values.mean()
    s = torch.cat([orig[a - 1, d : d + 1], alt[a : a + k].max(-1).values]).mean()
    return float(o - s)


def _greedy_answer(tiny, text: str, n: int) -> tuple[list[int], list[int]]:
    """(prompt ids, the tiny verifier's greedy answer of n tokens)."""
    prompt = tiny.tokenizer.encode(text)
    with torch.no_grad():
        mask = torch.ones(1, len(prompt), dtype=torch.long)
        out = tiny.verifier.generate(torch.tensor([prompt]), attention_mask=mask, do_sample=False, max_new_tokens=n)
    return prompt, out[0, len(prompt) :].tolist()


def test_cached_scores_equal_plain_forwards(tiny):
    verifier = tiny.verifier
    prompt, answer = _greedy_answer(tiny, "Question: 2 + 3 = ?\nAnswer:", 30)
    mismatches = [(3, 40), (10, 77), (len(answer) - 4, 55), (len(answer) - 1, 60)]  # the last: no continuation
    got = horizon_scores(verifier, prompt, answer, mismatches)
    assert got.shape == (4, len(HORIZONS))
    for i, (t, d) in enumerate(mismatches):
        for j, h in enumerate(HORIZONS):
            assert abs(got[i, j] - _plain(verifier, prompt, answer, t, d, h)) < 1e-4, (t, h)
    assert (got > -1e-6).all()  # the verifier's own token is its argmax: the swap never raises confidence at 0
    # horizon 0 is the log-probability gap between the verifier's token and the drafter's
    with torch.no_grad():
        logp = verifier(torch.tensor([prompt + answer])).logits[0].float().log_softmax(-1)
    t, d = mismatches[0]
    a = len(prompt) + t
    assert np.isclose(got[0, 0], float(logp[a - 1].max() - logp[a - 1, d]), atol=1e-5)
    assert horizon_scores(verifier, prompt, answer, []).shape == (0, len(HORIZONS))
    # from a shared prefix's cache (a few-shot context prefilled once): the same scores
    shared = SharedPrefix(prompt[:-2])
    assert np.allclose(horizon_scores(verifier, prompt, answer, mismatches, prefix=shared), got, atol=1e-4)
    assert np.allclose(
        horizon_scores(verifier, prompt, answer, mismatches, prefix=SharedPrefix([1, 2])), got
    )  # not covering: unused


def test_a_continuation_the_answer_lacks_is_regenerated(tiny):
    """Where the recorded answer kept the drafter's token (a harmless substitution), the verifier's
    continuation after its own token is written greedily: the same scores as on its own answer."""
    verifier = tiny.verifier
    prompt, answer = _greedy_answer(tiny, "Question: 7 * 6 = ?\nAnswer:", 40)
    t, d = 6, 50
    recorded = answer[:t] + [d] + [60] * (len(answer) - t - 1)  # the search went on after d
    want = horizon_scores(verifier, prompt, answer, [(t, d)])
    got = horizon_scores(verifier, prompt, recorded, [(t, d)], regenerate={(t, d): answer[t]})
    assert np.allclose(got, want, atol=1e-4)


def test_a_regenerated_continuation_leaves_later_mismatches_their_prefix(tiny):
    """Writing a continuation greedily at one mismatch must not cut the answer's cache short for the mismatches
    after it (it once did: the greedy steps cropped the cache to the regenerated position, and a later
    mismatch's branch then saw a prefix missing the tokens between)."""
    verifier = tiny.verifier
    prompt, answer = _greedy_answer(tiny, "Question: 7 * 6 = ?\nAnswer:", 40)
    later = [(12, 51), (20, 52)]
    alone = horizon_scores(verifier, prompt, answer, later, (0, 3, 5))
    together = horizon_scores(verifier, prompt, answer, [(6, 50), *later], (0, 3, 5), regenerate={(6, 50): 77})
    assert np.allclose(together[1:], alone, atol=1e-4)
