"""Window inputs in records: what a window policy reads online, for recorded positions (column `window`).

Online, a drafted token d_j is followed in its block by the drafter's next drafts, scored by the same
verification forward (router/window/follow.py). Offline, at every recorded position where the
drafter's argmax d differs from the verifier's (a greedy mismatch; elsewhere nothing is decided), the
drafter writes its greedy continuation c_1..c_W after d and the verifier scores it: the draft and its
W followers, as in a block with W drafts after d. The column holds per position the DRAFT_SCALARS of
d and of c_1..c_W, (1 + W) x C floats, NaN at positions without a window. The same function as online
turns a row into a FollowWindow (`router.window.follow.window_of_rows`), so a policy reads the same numbers offline.

Cost: W drafter passes and one verifier pass over every mismatch of a batch at once, each from the
teacher-forced KV cache with a tree-shaped mask (a chain's tokens see the cached prefix before its
position and the chain's earlier tokens, the way tree verification scores sibling branches; positions
are the ones the tokens would have had in place). The drafter's chains stay in its cache between its
W steps (one new token per chain and step); every added entry is cropped afterwards.
In rollout mode the trajectory is the drafter's own: the window of each token is the trajectory's next
W tokens, read from the teacher-forced pass at no cost.
"""

from __future__ import annotations

import numpy as np
import torch

from router.loop.layout import Layout
from router.backends import backend_of
from router.window.follow import DRAFT_SCALARS, draft_scalars, follow_window

MAX_CHAIN_TOKENS = 256  # chain tokens per row and verifier pass: bounds the (M x W, V) logits


def chain_pass(
    model, cache, cache_arg: str, layout: Layout, cols: torch.Tensor, tokens: torch.Tensor, done: int, vocab: int
) -> torch.Tensor:
    """Logits (B, M, K, V) of chains' next K tokens (B, M, K), chain m's placed from layout column
    cols[b, m] on (-1: an unused slot), after `done` earlier steps of every chain already in the cache
    (step-major: entry L + s * M + m is chain m's step s). Each token sees the cached columns before
    its chain's column, its chain's cached steps and its chain's earlier new tokens. The new entries
    stay in the cache (the caller crops)."""
    B, M, K = tokens.shape
    L, device = layout.length, layout.tokens.device
    dtype = next(model.parameters()).dtype
    prefix = (torch.arange(L, device=device)[None, None] < cols[..., None]) & layout.mask[:, None].bool()  # (B, M, L)
    same = torch.eye(M, dtype=torch.bool, device=device)  # (M, M)
    earlier = same.repeat(1, done)  # (M, done * M): its chain's cached steps
    causal = torch.ones(K, K, dtype=torch.bool, device=device).tril()  # (K, K)
    own = (same[:, None, :, None] & causal[None, :, None, :]).reshape(M * K, M * K)  # chain-major new tokens
    prefix = prefix[:, :, None].expand(B, M, K, L).reshape(B, M * K, L)
    allowed = torch.cat([prefix, earlier.repeat_interleave(K, 0).expand(B, -1, -1), own.expand(B, -1, -1)], -1)
    mask = torch.zeros((B, 1, *allowed.shape[1:]), dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    pos = layout.pos.gather(1, cols.clamp_min(0))[..., None] + done + torch.arange(K, device=device)  # (B, M, K)
    out = model(
        input_ids=tokens.reshape(B, M * K),
        attention_mask=mask,
        position_ids=pos.reshape(B, M * K),
        use_cache=True,
        **{cache_arg: cache},
    )
    return out.logits[..., :vocab].reshape(B, M, K, -1)


def mismatch_windows(
    models: tuple,
    caches: tuple,
    cache_args: tuple,
    layout: Layout,
    p_logits: torch.Tensor,
    continuations: list[list[int]],
    q_argmax: list[np.ndarray],
    width: int,
    vocab: int,
) -> list[np.ndarray]:
    """Per row, the `window` column (n, (1 + W) * C) float32 of a gold-mode batch: at each position t
    where the drafter's argmax d = q_argmax[b][t] is not the verifier's, the scalars of d and of the
    drafter's greedy W tokens after it; NaN elsewhere. models, caches, cache_args: (drafter, verifier)
    and their teacher-forced KV caches of every layout column; p_logits (B, keep, V) the verifier's
    last columns (the last predicting after each row's final token)."""
    keep, L = p_logits.shape[1], layout.length
    c = len(DRAFT_SCALARS)
    out, todo = [], []
    for b, cont in enumerate(continuations):
        n = len(cont)
        p_rows = p_logits[b, keep - n - 1 : keep - 1].float().softmax(-1)  # (n, V) predicting each y_t
        d = torch.as_tensor(np.asarray(q_argmax[b]), dtype=torch.long, device=p_rows.device)
        mism = torch.nonzero(d != p_rows.argmax(-1)).flatten()
        col = np.full((n, 1 + width, c), np.nan, np.float32)
        col[mism.cpu().numpy(), 0] = draft_scalars(d[mism][None], p_rows[mism][None])[0].cpu().numpy()
        out.append(col)
        todo.append([(int(t), int(d[t]), L - n + int(t)) for t in mism])
    per_pass = max(1, MAX_CHAIN_TOKENS // width)
    for lo in range(0, max((len(t) for t in todo), default=0), per_pass):
        part = [t[lo : lo + per_pass] for t in todo]
        for b, scalars in enumerate(_score_chains(models, caches, cache_args, layout, part, width, vocab)):
            for (t, _, _), s in zip(part[b], scalars):
                out[b][t, 1:] = s
    return [col.reshape(len(col), -1) for col in out]


def _score_chains(models, caches, cache_args, layout: Layout, part: list[list[tuple]], width: int, vocab: int):
    """Per row, (m, W, C) scalars of the drafter's greedy W tokens after each (t, d, column) of `part`."""
    forked = backend_of(caches[0]).chain_scalars  # None: tree-shaped masks, below (an engine may fork sequences)
    if forked is not None:
        return forked(caches, layout, part, width)
    (drafter, verifier), (d_cache, v_cache), (d_arg, v_arg) = models, caches, cache_args
    B, M = len(part), max(len(p) for p in part)
    device = layout.tokens.device
    cols = torch.full((B, M), -1, dtype=torch.long, device=device)
    first = torch.zeros((B, M), dtype=torch.long, device=device)
    for b, chains in enumerate(part):
        for m, (_, d, column) in enumerate(chains):
            cols[b, m], first[b, m] = column, d
    chain, x = [first], first
    for step in range(width):  # the drafter's greedy continuation, one token per chain and step
        x = chain_pass(drafter, d_cache, d_arg, layout, cols, x[..., None], step, vocab)[:, :, 0].argmax(-1)
        chain.append(x)
    d_cache.crop(-width * M)
    tokens = torch.stack(chain, -1)  # (B, M, 1 + W): d, c_1..c_W
    logits = chain_pass(verifier, v_cache, v_arg, layout, cols, tokens[..., :-1], 0, vocab)  # (B, M, W, V)
    v_cache.crop(-width * M)
    return [
        draft_scalars(tokens[b, : len(p), 1:], logits[b, : len(p)].float().softmax(-1)).cpu().numpy()
        for b, p in enumerate(part)
    ]


def rollout_windows(p_logits: torch.Tensor, continuations: list[list[int]], width: int) -> list[np.ndarray]:
    """Per row, the `window` column of a rollout batch: the trajectory is the drafter's, so each token's
    followers are the trajectory's next W tokens (NaN past its end), scored by the teacher-forced pass."""
    keep, out = p_logits.shape[1], []
    for b, cont in enumerate(continuations):
        n = len(cont)
        p_rows = p_logits[b, keep - n - 1 : keep - 1].float().softmax(-1)  # (n, V)
        tokens = torch.as_tensor(cont, dtype=torch.long, device=p_rows.device)
        window = follow_window(draft_scalars(tokens[None], p_rows[None]), width)
        follow = window.values[0].masked_fill(~window.valid[0][..., None], float("nan"))  # (n, W, C)
        out.append(torch.cat([window.at[0][:, None], follow], 1).reshape(n, -1).cpu().numpy().astype(np.float32))
    return out
