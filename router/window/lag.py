"""Lag inputs: what the positions before a drafted token looked like, carried across blocks.

A per-position policy sees q and p at the drafted position only. Whether the two models were already
drifting apart one or two tokens earlier (a low verifier confidence, a large TV) is information a
judge can use, and it costs nothing: those positions' distributions were computed when they were
decided. A lag judge (`RouterConfig.lag = L`) reads, for each drafted position, the position features
(`router.features.token_features`, FEATURE_NAMES) of the L positions before it on the emitted
trajectory, each with a valid flag (zeros and 0 before the answer's first token).

Offline the predecessors are the record's previous rows of the same trajectory (`lag_history` over a
records view); in the decoding loop the first positions of a block read the end of the previous
block (`LagCarry`): the rejected position (its distributions were computed for the rejected draft,
as a record's row is computed for the drafter's argmax whatever token follows) or the bonus position,
whose drafter distribution is the next block's first drafter forward's spare column (no extra
forward). `lag_features` turns either into the judge's inputs, so both read the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from router.features import FEATURE_NAMES, position_stats
from router.window.running import RUNNING_COLUMNS

LAG_FEATURE_NAMES = (*FEATURE_NAMES, "valid")  # per lagged position, what a lag judge reads


@dataclass(frozen=True)
class LagBefore:
    """The L positions before a block, per row: feats (B, L, F), valid (B, L), most recent first
    (`LagCarry.snapshot`); a lag judge forms each draft's predecessors from it and the block (`block_lags`).
    A running judge's sums (B, R) and count (B,) of the whole answer before the block (router/window/running.py)
    ride along where the carry keeps them."""

    feats: torch.Tensor
    valid: torch.Tensor
    sums: torch.Tensor | None = None
    count: torch.Tensor | None = None


@dataclass(frozen=True)
class LagHistory:
    """Each scored position's L predecessors already formed: values (..., L, F), valid (..., L), most recent
    first, and a running judge's sums (..., R) and count (...) of the answer before it (an engine port keeps
    them itself: router/export/decision.py)."""

    values: torch.Tensor
    valid: torch.Tensor
    sums: torch.Tensor | None = None
    count: torch.Tensor | None = None


def lag_features(history: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A lag judge's inputs (..., L * len(LAG_FEATURE_NAMES)) from the features of the L positions before
    each (..., L, F), most recent first, and whether each exists (..., L). One function offline and online."""
    v = valid[..., None].to(torch.float32)  # (..., L, 1)
    return torch.cat([history.float() * v, v], -1).flatten(-2)


def predecessor_rows(trajectory: np.ndarray, idx: np.ndarray, offsets: np.ndarray) -> tuple:
    """Rows `offsets` (K,) before each of rows idx (n,) in a view whose rows run in trajectory order, trajectory
    ids (N,) -> (rows (n, K), clipped to 0 where missing; valid (n, K): that row exists in the same trajectory)."""
    idx = np.asarray(idx)
    back = idx[:, None] - np.asarray(offsets)[None]  # (n, K)
    safe = np.clip(back, 0, None)
    return safe, (back >= 0) & (trajectory[safe] == trajectory[idx][:, None])


def lag_history(features: np.ndarray, trajectory: np.ndarray, idx: np.ndarray, lag: int) -> tuple:
    """Offline predecessors of record rows: features (N, F) of a view whose rows run in trajectory order,
    trajectory ids (N,), rows idx (n,) -> history (n, L, F) float32 (most recent first), valid (n, L)."""
    safe, valid = predecessor_rows(trajectory, idx, np.arange(1, lag + 1))
    history = np.where(valid[..., None], features[safe], 0.0).astype(np.float32)
    return history, valid


def block_lags(before: torch.Tensor, before_valid: torch.Tensor, position: torch.Tensor) -> tuple:
    """The predecessors of every draft of a block: before (B, L, F) / before_valid (B, L), the L positions
    ahead of the block (most recent first, `LagCarry.snapshot`), and the block's own position features
    (B, g, F) -> history (B, g, L, F), valid (B, g, L). Draft j's k-th predecessor is draft j - k inside the
    block, else the carry's (k - j)-th entry."""
    batch, lag, _ = before.shape
    g = position.shape[1]
    seq = torch.cat([before.flip(1), position.to(before.dtype)], 1)  # (B, L + g, F) in order
    seq_valid = torch.cat([before_valid.flip(1), before_valid.new_ones(batch, g)], 1)  # (B, L + g)
    at = lag + torch.arange(g, device=position.device)[:, None] - torch.arange(1, lag + 1, device=position.device)
    return seq[:, at], seq_valid[:, at]  # (B, g, L, F), (B, g, L)


class LagCarry:
    """The loop's per-row memory of the last L emitted positions' features between blocks.

    After a block each row has emitted positions 0..n of it (n accepted drafts, then the verifier's
    token at position n: a correction where n < g, the bonus at n = g). Their features are the block's
    (gathered at <= L positions per row, one small features pass); the bonus position's drafter
    distribution is not computed by the block, so that entry stays pending until `resolve` gets the
    next block's first drafter logits there. With `running`, it also keeps each row's sums of
    router.window.running.RUNNING_SOURCES over every emitted position and their count (the bonus position's
    added when it resolves)."""

    def __init__(self, batch: int, lag: int, device: torch.device | str = "cpu", running: bool = False):
        self.lag, self.running = lag, running
        self.sums = torch.zeros(batch, len(RUNNING_COLUMNS), dtype=torch.float64, device=device) if running else None
        self.count = torch.zeros(batch, dtype=torch.long, device=device) if running else None
        self.feats = torch.zeros(batch, lag, len(FEATURE_NAMES), device=device)  # (B, L, F) most recent first
        self.valid = torch.zeros(batch, lag, dtype=torch.bool, device=device)  # (B, L)
        self.pending_p: torch.Tensor | None = None  # (B, V) the verifier at the bonus position of whole rows
        self.pending = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,) entry 0 awaits q

    @property
    def needs_drafter_logits(self) -> bool:
        """Some row's last position is a bonus position whose drafter distribution is still missing."""
        return self.pending_p is not None

    def resolve(self, q_logits: torch.Tensor) -> None:
        """Fill the pending bonus entries from the drafter's raw logits at those positions (B, V)."""
        if self.pending_p is None:
            return
        q_raw = torch.softmax(q_logits.float(), -1)
        feats = position_stats(q_raw, self.pending_p, q_logits)[0]  # (B, F)
        if self.lag:
            self.feats[:, 0] = torch.where(self.pending[:, None], feats, self.feats[:, 0])
            self.valid[:, 0] |= self.pending
        if self.running:
            self.sums = self.sums + torch.where(self.pending[:, None], feats[:, RUNNING_COLUMNS].double(), 0.0)
            self.count = self.count + self.pending.long()
        self.pending_p, self.pending = None, torch.zeros_like(self.pending)

    def snapshot(self) -> LagBefore:
        """The positions before the next block, most recent first."""
        if self.pending_p is not None:
            raise RuntimeError("LagCarry: resolve the bonus position's drafter logits before the next block")
        return LagBefore(self.feats, self.valid, self.sums, self.count)

    def advance(
        self, q_raw: torch.Tensor, p_raw: torch.Tensor, n_accepted: torch.Tensor, feats: torch.Tensor | None = None
    ) -> None:
        """Shift in a block's emitted positions: q_raw (B, g, V), p_raw (B, g + 1, V), n_accepted (B,); `feats`
        (B, g, F): the block's position features where the policy computed them already (BlockView.position_stats),
        else they are computed here (for every position with `running`, for at most L per row without)."""
        batch, g = q_raw.shape[:2]
        if self.running:  # positions 0..n with a drafter distribution: the kept drafts and the correction
            feats = position_stats(q_raw, p_raw[:, :g])[0] if feats is None else feats  # (B, g, F)
            emitted = torch.arange(g, device=q_raw.device)[None] <= n_accepted[:, None]  # (B, g)
            block = feats[..., RUNNING_COLUMNS].double()  # (B, g, R)
            self.sums = self.sums + (block * emitted[..., None]).sum(1)  # new tensors: snapshots stay as taken
            self.count = self.count + emitted.sum(1)
        if self.lag:
            self._shift(q_raw, p_raw, n_accepted, feats)
        whole = n_accepted == g
        if bool(whole.any()):
            self.pending_p, self.pending = p_raw[:, g].float(), whole
        if self.lag:
            self.feats[:, 0] = torch.where(whole[:, None], 0.0, self.feats[:, 0])

    def _shift(
        self, q_raw: torch.Tensor, p_raw: torch.Tensor, n_accepted: torch.Tensor, feats: torch.Tensor | None
    ) -> None:
        """Move the L most recent positions on by the block's emitted ones (the bonus position stays invalid)."""
        batch, g = q_raw.shape[:2]
        rows = torch.arange(batch, device=q_raw.device)[:, None]
        at = n_accepted[:, None] - torch.arange(self.lag, device=q_raw.device)  # (B, L) positions, recent first
        inside = at.clamp(0, g - 1)
        if feats is None:
            fresh = position_stats(q_raw[rows, inside], p_raw[rows, inside])[0]  # (B, L, F)
        else:
            fresh = feats[rows, inside]  # (B, L, F)
        older = -at.clamp(max=-1) - 1  # where at < 0 (before the block): the carry's (-at - 1)-th entry
        old_feats, old_valid = self.feats[rows, older], self.valid[rows, older]
        from_block = at >= 0
        self.feats = torch.where(from_block[..., None], fresh, old_feats)
        self.valid = torch.where(from_block, at < g, old_valid)  # the bonus position (at = g) waits for q

    def keep_rows(self, idx: torch.Tensor) -> None:
        """Keep these rows (the loop dropped finished ones)."""
        self.feats, self.valid, self.pending = self.feats[idx], self.valid[idx], self.pending[idx]
        if self.running:
            self.sums, self.count = self.sums[idx], self.count[idx]
        if self.pending_p is not None:
            self.pending_p = self.pending_p[idx]
