"""How many drafts a block holds for a policy: the block sizes a policy can decode with (`check_block_size`,
`window_block_note`) and the next block's size near the end of the token budget (`block_drafts`). What a
policy reads is in its `needs` (router/policy.py); nothing here looks further into a policy.
"""

from __future__ import annotations

from router.infra.warn import warn_caller
from router.policy import DeferralPolicy


def check_block_size(policy: DeferralPolicy, gamma) -> None:
    """Refuse a block size with which a window rule could never keep a draft (it needs `min_gamma`), and
    gamma auto for a lag policy (the verifier-only steps auto takes compute no drafter distribution, so the
    positions before the next block would have no features)."""
    needs = policy.needs
    if "lag" in needs and gamma == "auto":
        raise ValueError(
            f"{policy.name} reads the features of the positions before each draft (lag {needs.lag}"
            f"{', running sums' if needs.running else ''}), which gamma auto's "
            f"verifier-only steps do not compute: give gamma as a number"
        )
    note = window_block_note(policy, gamma)
    if note:
        warn_caller(note)  # at the user's generate call, not inside the loop
    least = policy.min_gamma
    if least <= 1:
        return
    if gamma == "auto":
        raise ValueError(
            f"{policy.name} reads the {needs.follow} drafts after each draft, so it needs blocks of at least "
            f"{least} drafts; gamma auto would choose shorter ones: give gamma >= {least} as a number"
        )
    if gamma < least:
        raise ValueError(
            f"{policy.name} reads the {needs.follow} drafts after each draft: with gamma {gamma} no draft has "
            f"them inside its block, so it would only verify (lossless); use gamma >= {least}"
        )


def window_block_note(policy: DeferralPolicy, gamma) -> str | None:
    """Why a window judge's windows online will differ from those it was trained on, or None. It was
    trained on windows cut as blocks of `needs.follow_block` drafts cut them (0: never cut, as recorded); at
    another block size the invalid flags it reads online are ones it has not seen, and its alpha,
    matched offline, no longer gives the rejection rate it was matched to."""
    follow, trained = policy.needs.follow, policy.needs.follow_block
    if not follow or policy.min_gamma > 1:  # a window rule (fly) handles cut windows itself
        return None
    retrain = f"follow_block={'your gamma' if gamma == 'auto' else gamma}"
    if trained and gamma != trained:
        return (
            f"{policy.name} was trained on windows cut as in blocks of {trained} drafts and decodes with gamma "
            f"{gamma}: decode with gamma {trained}, or retrain with {retrain}"
        )
    if not trained and (gamma == "auto" or gamma - 1 < follow):
        return (
            f"{policy.name} reads {follow} drafts after each draft and was trained on uncut windows, but with gamma "
            f"{gamma} at most {'gamma' if gamma == 'auto' else gamma} - 1 drafts follow one in its block, so every "
            f"window it reads is cut: its decisions and matched alpha drift; retrain it with {retrain} (train's option)"
        )
    return None


def block_drafts(policy: DeferralPolicy, gamma: int, remaining: int) -> int:
    """Drafts in the next block: gamma, fewer near the end of the longest active row's budget (drafts past
    it would be thrown away), except for a window policy: cutting its last block would cut its windows,
    so what it keeps would depend on the token budget and, in a batch, on the other rows' lengths."""
    if "follow" in policy.needs:
        return gamma
    return max(1, min(gamma, remaining - 1))
