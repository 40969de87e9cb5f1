"""The verifier's view of drafted tokens at every recorded position (judge inputs).

For the drafter's token d at continuation position t (its argmax, and the sample recorded as
`draft_token`), a judge router reads the verifier's last hidden state after it has read d and
`lookahead_features` of its next-token distribution given d. Where d is the trajectory's own token
y_t, teacher forcing already computed both (the column of y_t). Elsewhere the substituted token
must attend to its own prefix (prompt + y_<t), not to y_t: all substitutions of a batch go through
one extra verifier forward over the cached teacher-forced prefix, with a tree-shaped 4D attention
mask (each substituted token sees the cached columns before its position, and itself), the way
tree verification scores sibling branches. Positions get the ids they would have had in place.
"""

from __future__ import annotations

import numpy as np
import torch

from router.features import lookahead_features
from router.loop.layout import Layout
from router.backends import backend_of
from router.records import judge_column

MAX_TREE = 512  # substituted tokens per row and forward: bounds the 4D mask (B, 1, M, L + M)


def tree_forward(
    verifier, cache, cache_arg: str, layout: Layout, cols: torch.Tensor, tokens: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states (B, M, H) and logits (B, M, V) of tokens (B, M) each placed at layout column
    cols (B, M) instead of the token there (-1: unused slot), attending to that column's prefix.

    `cache` holds the verifier's keys/values of all layout columns; the M new entries are cropped
    from it afterwards, so it can serve the next call."""
    placed = backend_of(cache).placed_tokens  # None: a tree-shaped mask, below (an engine may fork sequences)
    if placed is not None:
        return placed(cache, layout, cols, tokens)
    B, M = tokens.shape
    L = layout.length
    dtype = next(verifier.parameters()).dtype
    device = layout.tokens.device
    span = torch.arange(L, device=device)
    prefix = (span[None, None] < cols[..., None]) & layout.mask[:, None].bool()  # (B, M, L)
    own = torch.eye(M, dtype=torch.bool, device=device).expand(B, M, M)  # each sees itself only
    allowed = torch.cat([prefix, own], -1)[:, None]  # (B, 1, M, L + M)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    pos = layout.pos.gather(1, cols.clamp_min(0))  # (B, M) the position of the column replaced
    out = verifier(
        input_ids=tokens,
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        output_hidden_states=True,
        **{cache_arg: cache},
    )
    cache.crop(-M)  # drop the substituted entries: the cache covers the layout's columns again
    return out.hidden_states[-1], out.logits[..., :vocab]


def judge_inputs(
    verifier,
    cache,
    cache_arg: str,
    layout: Layout,
    p_logits: torch.Tensor,
    p_hidden: torch.Tensor,
    continuations: list[list[int]],
    drafted: dict[str, list[np.ndarray]],
    vocab: int,
) -> list[dict]:
    """Per row, {prefix+"hidden": (n, H) float16, prefix+"lookahead": (n, 2) float32} for each drafted
    token in `drafted` (name -> per row (n,) token ids).

    p_logits (B, keep, V) and p_hidden (B, keep, H) are the teacher-forced verifier's last `keep`
    columns, the last being each row's final token (rows are left-padded)."""
    keep, L = p_logits.shape[1], layout.length
    rows = [{} for _ in continuations]
    subs = [[] for _ in continuations]  # per row: (name, t, token) still to compute
    for b, cont in enumerate(continuations):
        n, y = len(cont), np.asarray(cont)
        after = slice(keep - n, keep)  # column of y_t: the state after reading it, and p_{t+1}
        own_hidden, own_look = p_hidden[b, after], lookahead_features(p_logits[b, after].float().softmax(-1))
        for name, tokens in drafted.items():
            d = np.asarray(tokens[b])
            rows[b][name] = (own_hidden.float().clone(), own_look.clone())  # (n, H), (n, 2); filled in below
            subs[b] += [(name, int(t), int(d[t])) for t in np.nonzero(d != y)[0]]
    for chunk in range(0, max(len(s) for s in subs), MAX_TREE):
        parts = [s[chunk : chunk + MAX_TREE] for s in subs]
        width = max(len(p) for p in parts)
        if not width:
            break
        cols = torch.full((len(parts), width), -1, dtype=torch.long)
        toks = torch.zeros((len(parts), width), dtype=torch.long)
        for b, part in enumerate(parts):
            n = len(continuations[b])
            for m, (_, t, tok) in enumerate(part):
                cols[b, m], toks[b, m] = L - n + t, tok
        hidden, logits = tree_forward(
            verifier, cache, cache_arg, layout, cols.to(layout.tokens.device), toks.to(layout.tokens.device), vocab
        )
        look = lookahead_features(logits.float().softmax(-1))  # (B, M, 2)
        for b, part in enumerate(parts):
            for m, (name, t, _) in enumerate(part):
                rows[b][name][0][t] = hidden[b, m].float()
                rows[b][name][1][t] = look[b, m]
    return [
        {
            judge_column(name, kind): (h.to(torch.float16) if kind == "hidden" else lk).cpu().numpy()
            for name, (h, lk) in row.items()
            for kind in ("hidden", "lookahead")
        }
        for row in rows
    ]
