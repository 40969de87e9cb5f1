"""Short-horizon labels of drafter/verifier mismatches: SelfJudge's likelihood difference, no answer check.

SelfJudge (naver-aics/SelfJudge, `src/extract_important_tokens_dolly15k.py` at c97c8e8, derived from
AutoJudge) scores a mismatch at answer position t -- the verifier's greedy answer has v there, the
drafter's argmax is d -- by how much less sure the verifier is of the answer's next H tokens once d
replaces v, the continuation c_1..c_H (the verifier's own, after v) teacher-forced on both sides:

    orig_H  = mean( max_x log p(x | .. t-1),      max_x log p(x | .. v, c_<k) for k = 1..H )
    alter_H = mean( log p(d | .. t-1),            max_x log p(x | .. d, c_<k) for k = 1..H )
    score_H = orig_H - alter_H      (>= 0 in practice: the first term of orig is the maximum)

A large score says the swap derails the verifier; a mismatch is labelled important where the score
exceeds a threshold chosen on full-answer labels. The horizon is cut at the answer's end. Cost: one
teacher-forced verifier pass over prompt + answer per example (log-probs of the answer's positions only), then H tokens per side and mismatch
from its KV cache (cropped back after each), instead of a whole regenerated answer per mismatch.
Where the answer does not continue after v (a consequence search that kept d there), `regenerate`
has the verifier write c_1..c_H greedily first, H one-token steps from the same cache.
"""

from __future__ import annotations

import numpy as np
import torch

from router.engine.layout import cache_argument, returned_cache

HORIZONS = (0, 5, 10, 20)


class _Cached:
    """The verifier over one sequence's KV cache, rolled back to any prefix length."""

    def __init__(self, verifier, seq: torch.Tensor, keep: int):
        """One forward over seq (1, L), keeping the log-probs of its last `keep` positions only (the
        answer's: the prompt's are never read, and a vocabulary-wide log-softmax over it is costly)."""
        self.model, self.arg = verifier, cache_argument(verifier)
        out = verifier(input_ids=seq, use_cache=True, logits_to_keep=keep, **{self.arg: None})
        self.logp = out.logits[0, -keep:].float().log_softmax(-1)  # (keep, V): row i predicts token L - keep + i + 1
        self.cache = returned_cache(out)

    def feed(self, at: int, tokens: list[int]) -> torch.Tensor:
        """log-probs (len(tokens), V) after feeding `tokens` at position `at`; the cache ends at `at` again."""
        self.crop(at)
        ids = torch.tensor([tokens], device=self.logp.device)
        logp = self.model(input_ids=ids, use_cache=True, **{self.arg: self.cache}).logits[0].float().log_softmax(-1)
        self.crop(at)
        return logp

    def greedy(self, at: int, first: int, n: int) -> list[int]:
        """The verifier's greedy n tokens after `first` placed at `at` (one-token steps)."""
        self.crop(at)
        out, nxt = [], first
        for _ in range(n):
            ids = torch.tensor([[nxt]], device=self.logp.device)
            nxt = int(self.model(input_ids=ids, use_cache=True, **{self.arg: self.cache}).logits[0, -1].argmax())
            out.append(nxt)
        self.crop(at)
        return out

    def crop(self, length: int) -> None:
        drop = self.cache.get_seq_length() - length
        if drop > 0:
            self.cache.crop(-drop)  # a negative count removes that many tokens (every transformers version)


@torch.no_grad()
def horizon_scores(
    verifier,
    prompt: list[int],
    answer: list[int],
    mismatches: list[tuple[int, int]],
    horizons=HORIZONS,
    regenerate: dict | None = None,
    continuations: dict | None = None,
) -> np.ndarray:
    """(M, len(horizons)) score_H of each mismatch (t, d): answer[t] is the verifier's token v there and
    answer[t + 1:] its continuation, d the drafter's token; or, for a mismatch listed in `regenerate`
    as {(t, d): v}, the answer holds another token at t and the continuation after v is written
    greedily first; `continuations` {(t, d): (v, c_1..c_H)} gives that continuation instead (the
    consequence search keeps it when it substitutes d). Mismatches are taken latest first, so one
    cache serves them all."""
    if not mismatches:
        return np.zeros((0, len(horizons)))
    seq = torch.tensor([prompt + answer], device=verifier.device)
    run, most = _Cached(verifier, seq, len(answer) + 1), max(horizons)  # rows from the prompt's last position on
    best = run.logp.max(-1).values  # (A + 1,) the verifier's confidence at each of those positions
    scores = np.zeros((len(mismatches), len(horizons)))
    for i in sorted(range(len(mismatches)), key=lambda j: -mismatches[j][0]):
        t, d = mismatches[i]
        a = len(prompt) + t  # sequence position of the mismatched token; row t of run.logp predicts it
        v, cont = (regenerate or {}).get((t, d)), None
        if (t, d) in (continuations or {}):
            v, cont = continuations[(t, d)]
            cont = list(cont)[:most]
        if v is None:  # the answer continues after the verifier's own token: its confidence is in `best`
            cont = answer[t + 1 : t + 1 + most]
            orig = best[t + 1 : t + 1 + len(cont)]
        else:
            cont = run.greedy(a, v, most) if cont is None else cont
            orig = run.feed(a, [v, *cont[:-1]]).max(-1).values if cont else best[:0]
        alter = run.feed(a, [d, *cont[:-1]]).max(-1).values if cont else best[:0]  # predicting c_1.. after d
        for j, h in enumerate(horizons):
            k = min(h, len(cont))
            kept = torch.cat([best[t : t + 1], orig[:k]]).mean()  # predicting v, then c_1..c_k after v
            swapped = torch.cat([run.logp[t, d : d + 1], alter[:k]]).mean()
            scores[i, j] = float(kept - swapped)
    return scores
