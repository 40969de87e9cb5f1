"""Teacher-forced scoring of (prompt, continuation) pairs by both models, into record rows.

One forward pass per model over a left-padded batch gives q_t and p_t at every continuation
position; per-position statistics come from the *full* distributions (only the top-k and the
tail mass are stored), and the feature vector from `router.features.token_features`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from data_gen.judge import judge_inputs
from data_gen.window import mismatch_windows, rollout_windows
from router.features import FEATURE_NAMES, token_features
from router.loop.layout import cache_argument, model_device
from router.loop.prefix import SharedPrefix
from router.loop.teacher import forward_tail, tail_layout


def example_seed(seed: int, example_id: str, mode: str) -> int:
    """A per-example seed, so records do not depend on batch or shard boundaries."""
    digest = hashlib.sha256(f"{seed}:{mode}:{example_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def score_batch(
    drafter,
    verifier,
    prompts: list[list[int]],
    continuations: list[list[int]],
    vocab: int,
    pad_id: int,
    top_k: int,
    hidden: str,
    draft_seeds: list[int],
    judge: bool = False,
    prefix: SharedPrefix | None = None,
    window: int = 0,
    rollout: bool = False,
) -> list[dict]:
    """Per example, a dict of per-position arrays in the record schema (minus id/task/split/mode);
    with judge, also the verifier's view of the drafted tokens (data_gen/judge.py); with window = W,
    the window column (data_gen/window.py; `rollout`: the continuations are the drafter's own). A
    shared prompt prefix (`router.loop.prefix`) is read from its cache instead of being fed again."""
    layout, prefix, keep = tail_layout(prompts, continuations, pad_id, model_device(drafter), prefix)
    chains = bool(window) and not rollout  # the drafter continues after its argmax at every mismatch
    with torch.inference_mode():
        q_logits, q_hidden, q_cache = forward_tail(
            drafter, layout, keep, vocab, hidden in ("drafter", "both"), cache=chains, prefix=prefix
        )
        p_logits, p_hidden, p_cache = forward_tail(
            verifier, layout, keep, vocab, judge or hidden in ("verifier", "both"), cache=judge or chains, prefix=prefix
        )
        rows = []
        for b, cont in enumerate(continuations):
            n = len(cont)
            sel = slice(keep - n - 1, keep - 1)  # logits predicting each continuation token, (n, V)
            row = record_columns(q_logits[b, sel], p_logits[b, sel], torch.tensor(cont), top_k, draft_seeds[b])
            if q_hidden is not None:
                row["drafter_hidden"] = q_hidden[b, sel].to(torch.float16).cpu().numpy()
            if hidden in ("verifier", "both"):
                row["verifier_hidden"] = p_hidden[b, sel].to(torch.float16).cpu().numpy()
            rows.append(row)
        if judge:
            drafted = {"argmax": [r["q_argmax"] for r in rows], "sample": [r["draft_token"] for r in rows]}
            views = judge_inputs(
                verifier, p_cache, cache_argument(verifier), layout, p_logits, p_hidden, continuations, drafted, vocab
            )
            for row, view in zip(rows, views):
                row.update(view)
        if window:
            for row, col in zip(
                rows,
                _windows(
                    drafter, verifier, q_cache, p_cache, layout, p_logits, continuations, rows, window, vocab, rollout
                ),
            ):
                row["window"] = col
    return rows


def _windows(drafter, verifier, q_cache, p_cache, layout, p_logits, continuations, rows, width, vocab, rollout):
    """The window column of every row (data_gen/window.py)."""
    if rollout:
        return rollout_windows(p_logits, continuations, width)
    models, caches = (drafter, verifier), (q_cache, p_cache)
    args = (cache_argument(drafter), cache_argument(verifier))
    q_arg = [r["q_argmax"] for r in rows]
    return mismatch_windows(models, caches, args, layout, p_logits, continuations, q_arg, width, vocab)


def _topk(probs: torch.Tensor, k: int):
    top_p, top_i = probs.topk(k, dim=-1)  # (n, k), sorted: column 0 is the argmax
    tail = (1 - top_p.sum(-1)).clamp_min(0)
    return top_i.int().numpy(), top_p.clamp_min(1e-30).log().numpy(), tail.numpy()


def sample_rows(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probs (n, V) by inverse CDF: one cumsum pass, far cheaper than
    torch.multinomial on a 150k vocabulary."""
    cdf = probs.cumsum(-1)  # (n, V)
    u = torch.rand(probs.shape[0], 1, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


CHUNK = 16  # positions per pass: 16 x V floats stay in cache across the ~20 V-sized passes below


def record_columns(q_logits: torch.Tensor, p_logits: torch.Tensor, tokens: torch.Tensor, top_k: int, seed: int) -> dict:
    """Record columns for n positions from full logits (n, V) and the trajectory tokens (n,)."""
    gen = torch.Generator().manual_seed(seed)
    parts = [
        _chunk_stats(
            q_logits[i : i + CHUNK].float().cpu(),
            p_logits[i : i + CHUNK].float().cpu(),
            tokens[i : i + CHUNK],
            top_k,
            gen,
        )
        for i in range(0, len(tokens), CHUNK)
    ]
    out = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    out["position"] = np.arange(len(tokens), dtype=np.int32)
    return out


def _chunk_stats(
    q_logits: torch.Tensor, p_logits: torch.Tensor, tokens: torch.Tensor, top_k: int, gen: torch.Generator
) -> dict:
    q, p = q_logits.softmax(-1), p_logits.softmax(-1)  # raw (temperature 1) distributions
    feats = token_features(q, p, q_logits, p_logits)  # (n, F); the exact scalars below are its columns
    col = {name: feats[:, i].numpy() for i, name in enumerate(FEATURE_NAMES)}
    q_ids, q_lp, q_tail = _topk(q, top_k)
    p_ids, p_lp, p_tail = _topk(p, top_k)
    at = tokens[:, None]
    drafts = sample_rows(q, gen)  # (n,) the drafter's sample at temperature 1
    return {
        "token": tokens.int().numpy(),
        "draft_token": drafts.int().numpy(),
        "q_draft": q.gather(-1, drafts[:, None]).squeeze(-1).numpy(),
        "p_draft": p.gather(-1, drafts[:, None]).squeeze(-1).numpy(),
        "q_topk_ids": q_ids,
        "q_topk_logprobs": q_lp,
        "q_tail": q_tail,
        "p_topk_ids": p_ids,
        "p_topk_logprobs": p_lp,
        "p_tail": p_tail,
        "p_at_q_topk_logprobs": p.gather(-1, torch.from_numpy(q_ids).long()).clamp_min(1e-30).log().numpy(),
        "q_max": col["q_max"],
        "p_max": col["p_max"],
        "q_entropy": col["q_entropy"],
        "p_entropy": col["p_entropy"],
        "tv": col["tv"],
        "kl": col["kl_pq"],
        "q_token": q.gather(-1, at).squeeze(-1).numpy(),
        "p_token": p.gather(-1, at).squeeze(-1).numpy(),
        "q_argmax": q_ids[:, 0].copy(),
        "p_argmax": p_ids[:, 0].copy(),
        "features": feats.numpy(),
    }
