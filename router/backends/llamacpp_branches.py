"""Recording's placed tokens on llama.cpp: the judge inputs, window chains and short-horizon labels of
data_gen/judge.py, window.py and horizon.py, where torch puts a token at a position the row holds another one
with a tree-shaped attention mask. llama.cpp masks by sequence instead: each placed token or continuation is
decoded on a sequence forked from its row at that position (`LlamaCppCache.fork`: the row's cells before it,
shared, not copied), all forks of a chunk in one llama_decode, and the forks are dropped afterwards. The
numbers are the same as torch's up to llama.cpp's batch-split rounding (tests/router/backends/test_llamacpp_records.py).
"""

from __future__ import annotations

import torch

from router.loop.layout import Layout
from router.backends.llamacpp import LlamaCppCache, feed_tail
from router.window.follow import draft_scalars


MAX_PLACED_TOKENS = 512  # tokens per decode: bounds the (N, V) logits llama.cpp returns (as torch's MAX_TREE)


def _chunks(items: list, size: int, tokens=lambda item: 1):
    """Consecutive groups of at most `size` items and MAX_PLACED_TOKENS tokens (at least one item each)."""
    group, used = [], 0
    for item in items:
        n = tokens(item)
        if group and (len(group) == size or used + n > MAX_PLACED_TOKENS):
            yield group
            group, used = [], 0
        group.append(item)
        used += n
    if group:
        yield group


def placed_tokens(cache: LlamaCppCache, layout: Layout, cols: torch.Tensor, tokens: torch.Tensor):
    """data_gen.judge.tree_forward on llama.cpp: hidden states (B, M, H) and logits (B, M, V) of tokens (B, M),
    each placed at layout column cols (B, M) instead of the token there (-1: an unused slot)."""
    B, M = tokens.shape
    pos = layout.pos.gather(1, cols.clamp_min(0))  # (B, M) the position of the column replaced
    todo = [(b, m) for b in range(B) for m in range(M) if cols[b, m] >= 0]
    logits = torch.zeros((B, M, cache.vocab))  # (B, M, V)
    hidden = torch.zeros((B, M, cache.model.hidden_size))  # (B, M, H)
    for part in _chunks(todo, cache.free_sequences()):
        seqs = [cache.fork(b, int(pos[b, m])) for b, m in part]
        out, states = cache.extend([(s, [int(tokens[b, m])]) for s, (b, m) in zip(seqs, part)], hidden=True)
        cache.drop(seqs)
        for (b, m), lg, h in zip(part, out, states):
            logits[b, m], hidden[b, m] = lg[0], h[0]
    return hidden, logits


def chain_scalars(caches: tuple, layout: Layout, part: list[list[tuple]], width: int) -> list[torch.Tensor]:
    """data_gen.window._score_chains on llama.cpp: per row, (m, W, C) scalars of the drafter's greedy W tokens
    after each (t, d, column) of `part`, scored by the verifier."""
    d_cache, v_cache = caches
    todo = [
        (b, m, int(layout.pos[b, column]), d)
        for b, chains in enumerate(part)
        for m, (_, d, column) in enumerate(chains)
    ]
    found = {}
    room = min(d_cache.free_sequences(), v_cache.free_sequences())
    for chunk in _chunks(todo, room, lambda item: width):
        seqs = [d_cache.fork(b, at) for b, _, at, _ in chunk]
        chains = [[d] for *_, d in chunk]
        for _ in range(width):  # the drafter's greedy continuation, one token per chain and decode
            out, _ = d_cache.extend([(s, c[-1:]) for s, c in zip(seqs, chains)])
            for c, lg in zip(chains, out):
                c.append(int(lg[0].argmax()))
        d_cache.drop(seqs)
        seqs = [v_cache.fork(b, at) for b, _, at, _ in chunk]
        out, _ = v_cache.extend([(s, c[:-1]) for s, c in zip(seqs, chains)])  # (W, V) each: after d, c_1..
        v_cache.drop(seqs)
        tokens = torch.tensor([c[1:] for c in chains])  # (n, W)
        scalars = draft_scalars(tokens, torch.stack(out).softmax(-1))  # (n, W, C)
        for (b, m, _, _), s in zip(chunk, scalars):
            found[b, m] = s
    return [
        torch.stack([found[b, m] for m in range(len(chains))]).numpy() if chains else torch.zeros(0)
        for b, chains in enumerate(part)
    ]


class LlamaCppRun:
    """data_gen.horizon._Cached on llama.cpp: the verifier over one sequence (prompt + answer), with the
    log-probs of its last `keep` positions and continuations placed at any position by forked sequences."""

    def __init__(self, verifier, seq: torch.Tensor, keep: int, prefix=None):
        if prefix is not None and not (prefix.covers([seq[0].tolist()]) and keep <= seq.shape[1] - len(prefix)):
            prefix = None
        layout = Layout(seq, torch.ones_like(seq))
        logits, _, self.cache = feed_tail(verifier, layout, keep, verifier.vocab_size, False, cache=True, prefix=prefix)
        self.logp = logits[0].log_softmax(-1)  # (keep, V): row i predicts token L - keep + i + 1

    def feed_many(self, branches: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """log-probs (len(tokens), V) per branch (at, tokens): its tokens placed from position `at` on, after
        the sequence's first `at` tokens only."""
        out = []
        for part in _chunks(branches, self.cache.free_sequences(), lambda branch: len(branch[1])):
            seqs = [self.cache.fork(0, at) for at, _ in part]
            logits, _ = self.cache.extend([(s, list(toks)) for s, (_, toks) in zip(seqs, part)])
            self.cache.drop(seqs)
            out += [lg.log_softmax(-1) for lg in logits]
        return out

    def greedy(self, at: int, first: int, n: int) -> list[int]:
        """The verifier's greedy n tokens after `first` placed at `at`."""
        seq, out, nxt = self.cache.fork(0, at), [], first
        for _ in range(n):
            logits, _ = self.cache.extend([(seq, [nxt])])
            nxt = int(logits[0][0].argmax())
            out.append(nxt)
        self.cache.drop([seq])
        return out
