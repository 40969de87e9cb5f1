"""How the decoding loop calls a deferral policy: the extra inputs it reads and its greedy mode.

A policy's `target(q, p, alpha, q_raw, p_raw)` may also read hidden states (`hidden_inputs`), the
logits behind the raw distributions (`reads_logits`) and, at temperature 0, be decoded by the mode of
its pi (`greedy_mode`); these helpers give each policy exactly what it declares, and refuse a block
size a window rule cannot work with (`min_gamma`).
"""

from __future__ import annotations

import warnings

import torch

from router.reduce import fast_argmax
from router.policy import DeferralPolicy


def hidden_kwargs(policy: DeferralPolicy, drafter_hidden, verifier_hidden, after=None) -> dict:
    """Extra target() arguments for policies that read hidden states (plug-in rules get none)."""
    if not policy.hidden_inputs:
        return {}
    return {"hidden": {"drafter": drafter_hidden, "verifier": verifier_hidden, "after": after}}


def logit_kwargs(policy: DeferralPolicy, q_logits, p_logits, next_p_logits=None) -> dict:
    """The logits behind q_raw, p_raw (and a judge's next_p_raw) for a policy that reads them
    (`reads_logits`, learned routers: cheaper features); nothing for the others."""
    if not policy.reads_logits:
        return {}
    extra = {} if next_p_logits is None else {"next_p_logits": next_p_logits}
    return {"q_logits": q_logits, "p_logits": p_logits, **extra}


def policy_target(policy: DeferralPolicy, alpha: float, q, p, q_raw, p_raw, greedy: bool, **kwargs) -> torch.Tensor:
    """pi (..., V) from the policy. Greedy decoding (temperature 0: q and p are one-hot) of a policy
    whose pi mixes the two (`greedy_mode`, e.g. `mixture`) takes the mode of its pi over the raw
    distributions, which is what greedy decoding of that mixture means (and what transformers does
    for assistant_ensemble_weight); every other policy's pi is already one-hot there."""
    if greedy and policy.greedy_mode:
        mixed = policy.target(q_raw, p_raw, alpha, q_raw=q_raw, p_raw=p_raw, **kwargs)  # (..., V)
        return torch.zeros_like(mixed).scatter_(-1, fast_argmax(mixed)[..., None], 1.0)
    return policy.target(q, p, alpha, q_raw=q_raw, p_raw=p_raw, **kwargs)


def check_block_size(policy: DeferralPolicy, gamma) -> None:
    """Refuse a block size with which a window rule could never keep a draft (it needs `min_gamma`), and
    gamma auto for a lag policy (the verifier-only steps auto takes compute no drafter distribution, so the
    positions before the next block would have no features)."""
    if getattr(policy, "lag", 0) and gamma == "auto":
        raise ValueError(
            f"{policy.name} reads the features of the {policy.lag} positions before each draft, which gamma auto's "
            f"verifier-only steps do not compute: give gamma as a number"
        )
    note = window_block_note(policy, gamma)
    if note:
        warnings.warn(note, stacklevel=3)
    least = getattr(policy, "min_gamma", 1)
    if least <= 1:
        return
    if gamma == "auto":
        raise ValueError(
            f"{policy.name} reads the {policy.follow} drafts after each draft, so it needs blocks of at least "
            f"{least} drafts; gamma auto would choose shorter ones: give gamma >= {least} as a number"
        )
    if gamma < least:
        raise ValueError(
            f"{policy.name} reads the {policy.follow} drafts after each draft: with gamma {gamma} no draft has "
            f"them inside its block, so it would only verify (lossless); use gamma >= {least}"
        )


def window_block_note(policy: DeferralPolicy, gamma) -> str | None:
    """Why a window judge's windows online will differ from those it was trained on, or None. It was
    trained on windows cut as blocks of `follow_block` drafts cut them (0: never cut, as recorded); at
    another block size the invalid flags it reads online are ones it has not seen, and its alpha,
    matched offline, no longer gives the rejection rate it was matched to."""
    follow, trained = getattr(policy, "follow", 0), getattr(getattr(policy, "cfg", None), "follow_block", 0)
    if not follow or getattr(policy, "min_gamma", 1) > 1:  # a window rule (fly) handles cut windows itself
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
    if getattr(policy, "follow", 0):
        return gamma
    return max(1, min(gamma, remaining - 1))
