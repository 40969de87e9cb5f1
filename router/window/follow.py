"""The verifier's view of the drafts that follow each drafted token in a block (window policies).

The verification forward scores the whole block: for a drafted token d_j the loop already holds
p_{j+1}, ..., p_{g-1}, the verifier's distributions at every draft after it. Whether the verifier
goes on agreeing with the drafter after a mismatch is information no per-position rule can compute
(FLy's deferred window, docs/rules.md). A window policy (`follow` > 0 in its `router.policy.Needs`) gets, for each
drafted position, a `FollowWindow` of the next `follow` drafts' scalars; the same function forms it
online from a block and offline from a recorded drafter continuation (data_gen/judge.py), so a
policy reads the same numbers in both.

Where fewer than `follow` drafts follow (the block's end), the missing ones are zeros marked invalid
(`FollowWindow.valid`): a policy decides what a cut window means (`fly` falls back to verification).
Recorded windows are never cut (W drafts follow every recorded draft), but in a block of g drafts the
draft at position j has only g - 1 - j followers: a window judge meant to decode at block size g is
trained and scored on recorded windows cut as such a block would cut them (`cut_window`,
`block_followers`; train's `follow_block`), so the invalid flags it reads online are ones it has seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# per drafted position, what the verifier thinks of that draft: its raw probability of it, whether it
# is the verifier's argmax, the verifier's top-3 entropy there (FLy's gate statistic) and its top-1
DRAFT_SCALARS = ("p_draft", "agree", "top3_entropy", "p_max")


@dataclass(frozen=True)
class FollowWindow:
    """Per drafted position (...), its own scalars and those of the `width` drafts after it.

    at (..., C): the drafted position itself; values (..., W, C): the k-th following draft's scalars
    at [..., k-1, :] (C = len(DRAFT_SCALARS)), zeros where invalid; valid (..., W) bool: that
    following draft exists in the block."""

    at: torch.Tensor
    values: torch.Tensor
    valid: torch.Tensor

    @property
    def width(self) -> int:
        return self.values.shape[-2]

    def scalar(self, name: str) -> torch.Tensor:
        """One scalar of every following draft (..., W)."""
        return self.values[..., DRAFT_SCALARS.index(name)]

    def own(self, name: str) -> torch.Tensor:
        """One scalar of the drafted position itself (...)."""
        return self.at[..., DRAFT_SCALARS.index(name)]


def draft_scalars(drafts: torch.Tensor, p_raw: torch.Tensor) -> torch.Tensor:
    """DRAFT_SCALARS (B, T, C) of drafts (B, T) under the verifier's raw distributions (B, T, V) at them.
    top3_entropy is -sum over the 3 most likely tokens of p log p, as FLy's `calculate_topk_entropy(logits,
    3)` (fly/models/FLy.py): the full softmax's probabilities, not renormalised over the three."""
    p32 = p_raw.float()
    top = p32.topk(3, dim=-1)  # values and ids (B, T, 3)
    p_draft = p32.gather(-1, drafts.long()[..., None])[..., 0]
    entropy = -(top.values * top.values.clamp_min(1e-30).log()).sum(-1)
    agree = (drafts == top.indices[..., 0]).float()
    return torch.stack([p_draft, agree, entropy, top.values[..., 0]], -1)


def follow_window(scalars: torch.Tensor, width: int) -> FollowWindow:
    """The window of every position of a block: scalars (B, T, C) -> FollowWindow with at (B, T, C),
    values (B, T, W, C), valid (B, T, W); position j's k-th entry is position j + k (k = 1..W)."""
    if width < 1:
        raise ValueError(f"a follow window needs width >= 1, got {width}")
    batch, length, c = scalars.shape
    padded = torch.cat([scalars, scalars.new_zeros(batch, width, c)], 1)  # (B, T + W, C)
    values = padded[:, 1:].unfold(1, width, 1)[:, :length].transpose(-1, -2)  # (B, T, W, C)
    offset = torch.arange(length, device=scalars.device)[:, None] + torch.arange(1, width + 1, device=scalars.device)
    valid = (offset < length).expand(batch, length, width)  # (B, T, W)
    return FollowWindow(scalars, values.contiguous(), valid)


def block_window(drafts: torch.Tensor, p_raw: torch.Tensor, width: int) -> FollowWindow:
    """The window of each draft of a block: drafts (B, g), the verifier's raw p at them (B, g, V)."""
    return follow_window(draft_scalars(drafts, p_raw), width)


def continuation_window(scalars: torch.Tensor, width: int) -> FollowWindow:
    """The window of one drafted token followed by its recorded continuation: scalars (N, 1 + L, C)
    (the draft, then L >= 0 continuation tokens) -> FollowWindow of the draft, at (N, C), values
    (N, W, C). The offline twin of `block_window`: the same numbers for the same tokens."""
    window = follow_window(scalars, width)
    return FollowWindow(window.at[:, 0], window.values[:, 0], window.valid[:, 0])


def block_followers(n: int, block: int, seed: int = 0) -> np.ndarray:
    """(n,) how many drafts follow each of n drafted tokens in a block of `block` drafts, each token at a
    uniformly random position j (block - 1 - j followers). Uniform because a block starts wherever the
    last one ended, so when most drafts are kept a token lands at each of the g positions about equally
    often. Seeded: the same rows get the same cuts in training, validation and offline scoring."""
    if block < 1:
        raise ValueError(f"a block holds at least 1 draft, got follow_block={block}")
    return block - 1 - np.random.default_rng(seed).integers(0, block, n)


def cut_window(window: FollowWindow, followers: torch.Tensor) -> FollowWindow:
    """The window (N,) as a block gives it when only followers (N,) drafts follow each drafted token: the
    later entries zeroed and marked invalid, as `follow_window` marks a block's end."""
    kept = torch.arange(window.width, device=window.valid.device) < followers[:, None]  # (N, W)
    valid = window.valid & kept
    return FollowWindow(window.at, window.values * valid[..., None], valid)


FOLLOW_FEATURE_NAMES = (*DRAFT_SCALARS, "valid")  # per following draft, what a window judge reads


def follow_features(window: FollowWindow, width: int) -> torch.Tensor:
    """A window judge's inputs (..., width * len(FOLLOW_FEATURE_NAMES)): the scalars of the first
    `width` following drafts and whether each exists, followers in order. One function online (a
    block's windows) and offline (recorded ones), so both read the same numbers."""
    if window.width < width:
        raise ValueError(
            f"the window holds {window.width} following drafts, the judge reads {width}: record with window >= "
            f"{width} (or decode with blocks that long: shorter blocks mark the rest invalid, they do not cut it)"
        )
    values = window.values[..., :width, :].float()  # (..., W, C)
    valid = window.valid[..., :width, None].float()  # (..., W, 1)
    return torch.cat([values * valid, valid], -1).flatten(-2)


def window_of_rows(column: np.ndarray, width: int) -> FollowWindow:
    """The FollowWindow (N positions) of recorded `window` rows (data_gen/window.py) (N, (1 + W) * C), formed by the function
    the loop's windows come from (`continuation_window`); a NaN follower (past a rollout's end) is
    invalid, and positions without a window (all NaN) come out all invalid."""
    rows = torch.from_numpy(np.asarray(column, np.float32)).reshape(len(column), 1 + width, len(DRAFT_SCALARS))
    window = continuation_window(torch.nan_to_num(rows), width)
    return FollowWindow(window.at, window.values, window.valid & ~torch.isnan(rows[:, 1:, 0]))
