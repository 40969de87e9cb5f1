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
teacher-forced verifier pass over prompt + answer per example (log-probs of the answer's positions
only), then H tokens per side and mismatch from its KV cache, every mismatch's tokens in one
tree-masked forward (cropped back after), instead of a whole regenerated answer per mismatch.
Where the answer does not continue after v (a consequence search that kept d there), `regenerate`
has the verifier write c_1..c_H greedily first, H one-token steps from the same cache.
"""

from __future__ import annotations

import numpy as np
import torch

from router.loop.layout import cache_argument, model_device, returned_cache
from router.backends import backend_of

HORIZONS = (0, 5, 10, 20)
MAX_BRANCH_TOKENS = 512  # tokens per tree-masked forward: bounds the 4D mask (N, cache + N) and the (N, V) logits


class _Cached:
    """The verifier over one sequence's KV cache, rolled back to any prefix length."""

    def __init__(self, verifier, seq: torch.Tensor, keep: int, prefix=None):
        """One forward over seq (1, L), keeping the log-probs of its last `keep` positions only (the
        answer's: the prompt's are never read, and a vocabulary-wide log-softmax over it is costly).
        With a SharedPrefix (router.loop.prefix) that seq starts with, the forward starts from its
        cache: a few-shot prompt's shared examples are not prefilled again for every example."""
        self.model, self.arg = verifier, cache_argument(verifier)
        ids, start = seq[0].tolist(), None
        if prefix is not None and prefix.covers([ids]) and keep <= len(ids) - len(prefix):
            seq, start = seq[:, len(prefix) :], prefix.cache_for(verifier, 1)
        out = verifier(input_ids=seq, use_cache=True, logits_to_keep=keep, **{self.arg: start})
        self.logp = out.logits[0, -keep:].float().log_softmax(-1)  # (keep, V): row i predicts token L - keep + i + 1
        self.cache = returned_cache(out)

    def feed_many(self, branches: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """log-probs (len(tokens), V) per branch (at, tokens): each branch's tokens placed from position
        `at` on, all branches in one forward (up to MAX_BRANCH_TOKENS tokens each) with a tree-shaped
        mask: a branch's tokens see the cached prefix before `at` and the branch's earlier tokens only,
        the way tree verification scores sibling branches. One pass reads the weights once, where a
        forward per branch would read them once per branch. The cache is cropped back afterwards."""
        out, lo = [], 0
        while lo < len(branches):
            hi, size = lo, 0
            while hi < len(branches) and (hi == lo or size + len(branches[hi][1]) <= MAX_BRANCH_TOKENS):
                size += len(branches[hi][1])
                hi += 1
            out += self._tree(branches[lo:hi])
            lo = hi
        return out

    def _tree(self, branches: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        device, length = self.logp.device, self.cache.get_seq_length()
        dtype = next(self.model.parameters()).dtype
        tokens = [tok for _, toks in branches for tok in toks]
        at = torch.tensor([a for a, toks in branches for _ in toks], device=device)  # (N,) each token's branch start
        step = torch.tensor([k for _, toks in branches for k in range(len(toks))], device=device)  # (N,)
        branch = torch.tensor([b for b, (_, toks) in enumerate(branches) for _ in toks], device=device)  # (N,)
        prefix = torch.arange(length, device=device)[None] < at[:, None]  # (N, length) the cache before `at`
        own = (branch[:, None] == branch[None]) & (step[None] <= step[:, None])  # (N, N) causal within a branch
        allowed = torch.cat([prefix, own], -1)[None, None]  # (1, 1, N, length + N)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        logits = self.model(
            input_ids=torch.tensor([tokens], device=device),
            attention_mask=mask,
            position_ids=(at + step)[None],
            use_cache=True,
            **{self.arg: self.cache},
        ).logits[0]  # (N, V)
        self.crop(length)
        logp = logits.float().log_softmax(-1)
        sizes = [len(toks) for _, toks in branches]
        return list(torch.split(logp, sizes))

    def greedy(self, at: int, first: int, n: int) -> list[int]:
        """The verifier's greedy n tokens after `first` placed at `at`: each step one tree-masked branch from
        `at` (the cache stays whole, so a later mismatch still reads the answer's tokens before it)."""
        out: list[int] = []
        for _ in range(n):
            out.append(int(self._tree([(at, [first, *out])])[0][-1].argmax()))
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
    prefix=None,
) -> np.ndarray:
    """(M, len(horizons)) score_H of each mismatch (t, d): answer[t] is the verifier's token v there and
    answer[t + 1:] its continuation, d the drafter's token; or, for a mismatch listed in `regenerate`
    as {(t, d): v}, the answer holds another token at t and the continuation after v is written
    greedily first; `continuations` {(t, d): (v, c_1..c_H)} gives that continuation instead (the
    consequence search keeps it when it substitutes d). `prefix`: a SharedPrefix the prompt starts
    with, whose cache the example's pass starts from."""
    if not mismatches:
        return np.zeros((0, len(horizons)))
    seq = torch.tensor([prompt + answer], device=model_device(verifier))
    run = (backend_of(verifier).continuation_run or _Cached)(
        verifier, seq, len(answer) + 1, prefix
    )  # log-prob rows from the prompt's last position on
    most = max(horizons)
    best = run.logp.max(-1).values  # (A + 1,) the verifier's confidence at each of those positions
    # per mismatch: (t, d, where the confidence after v is fed or None: read from `best`, the same after d, H cut)
    todo, feeds = [], []
    for t, d in mismatches:
        a = len(prompt) + t  # sequence position of the mismatched token; row t of run.logp predicts it
        v, cont = (regenerate or {}).get((t, d)), None
        if (t, d) in (continuations or {}):
            v, cont = continuations[(t, d)]
            cont = list(cont)[:most]
        if v is None:  # the answer continues after the verifier's own token: its confidence is in `best`
            cont, orig = answer[t + 1 : t + 1 + most], None
        else:  # greedy steps first (they use the cache one token at a time); the feeds go in one pass below
            cont = run.greedy(a, v, most) if cont is None else cont
            orig = len(feeds) if cont else None
            feeds += [(a, [v, *cont[:-1]])] if cont else []
        alter = len(feeds) if cont else None  # predicting c_1.. after d
        feeds += [(a, [d, *cont[:-1]])] if cont else []
        todo.append((t, d, orig, alter, len(cont)))
    fed = [logp.max(-1).values for logp in run.feed_many(feeds)] if feeds else []
    scores = np.zeros((len(mismatches), len(horizons)))
    for i, (t, d, orig, alter, n) in enumerate(todo):
        after_v = fed[orig] if orig is not None else best[t + 1 : t + 1 + n]
        after_d = fed[alter] if alter is not None else best[:0]
        for j, h in enumerate(horizons):
            k = min(h, n)
            kept = torch.cat([best[t : t + 1], after_v[:k]]).mean()  # predicting v, then c_1..c_k after v
            swapped = torch.cat([run.logp[t, d : d + 1], after_d[:k]]).mean()
            scores[i, j] = float(kept - swapped)
    return scores
