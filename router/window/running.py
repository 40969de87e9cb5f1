"""Problem-level inputs: how the answer so far has gone, summed over every position before a drafted token.

A per-position rule reads one position. Whether a draft's mistake will change the answer depends much on
the problem (a fragile problem flips on many swaps, a robust one on none; docs/method.md, "The labels'
noise ceiling"), and the answer so far says something about that: a verifier unsure all along, or a drafter
that keeps disagreeing with it, mark a hard problem. A running judge (`RouterConfig.running`) reads, per
drafted token, the means over the answer's earlier positions of the verifier's top probability, the two
models' argmax agreement, their TV distance and the verifier's entropy, and log(1 + positions so far)
(RUNNING_NAMES). They cost nothing new: those positions' features were computed when they were decided.

Offline the sums run over a record's previous rows of the same trajectory (`running_history`); in the
decoding loop `router.window.lag.LagCarry` keeps each row's sums and count across blocks (with the bonus
position's drafter half filled in by the next block's first drafter forward, as for lag inputs), and
`block_running` adds the block's own earlier drafts. `running_features` turns either into the inputs.
"""

from __future__ import annotations

import numpy as np
import torch

from router.features import FEATURE_NAMES

RUNNING_SOURCES = ("p_max", "argmax_agree", "tv", "p_entropy")  # position features averaged over the answer so far
RUNNING_COLUMNS = [FEATURE_NAMES.index(name) for name in RUNNING_SOURCES]
RUNNING_NAMES = (*(f"so_far_{name}" for name in RUNNING_SOURCES), "so_far_log_positions")


def running_features(sums: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """A running judge's inputs (..., len(RUNNING_NAMES)) from the sums of RUNNING_SOURCES over the positions
    before each (..., R) and their number (...). One function offline and online; no position before: zeros."""
    count = count.to(torch.float32)
    mean = sums.float() / count.clamp_min(1)[..., None]
    return torch.cat([mean, torch.log1p(count)[..., None]], -1)


def running_history(features: np.ndarray, trajectory: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offline sums of record rows: features (N, F) of a view whose rows run in trajectory order, trajectory ids
    (N,), rows idx (n,) -> sums (n, R) float64 over the rows before each in its trajectory, count (n,)."""
    x = features[:, RUNNING_COLUMNS].astype(np.float64)  # (N, R)
    start = np.ones(len(trajectory), dtype=bool)
    start[1:] = trajectory[1:] != trajectory[:-1]  # each trajectory's first row
    first = np.maximum.accumulate(np.where(start, np.arange(len(trajectory)), 0))  # (N,) its trajectory's first row
    before = np.concatenate([np.zeros((1, x.shape[1])), np.cumsum(x, 0)])  # before[i]: sum of rows < i
    idx = np.asarray(idx)
    return before[idx] - before[first[idx]], idx - first[idx]


def block_running(sums: torch.Tensor, count: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums before every draft of a block: sums (B, R) / count (B,) before the block (LagCarry) and the
    block's own position features (B, g, F) -> sums (B, g, R), count (B, g). Draft j adds drafts 0..j-1 (a
    draft is only decided when the ones before it were kept)."""
    x = position[..., RUNNING_COLUMNS].to(sums.dtype)  # (B, g, R)
    earlier = torch.cumsum(x, 1) - x  # exclusive prefix sums
    g = position.shape[1]
    return sums[:, None] + earlier, count[:, None] + torch.arange(g, device=position.device)
