"""The deferral-policy interface: what the decoding loop, training and evaluation need of a policy
(`DeferralPolicy`), and `Rule`, a named plug-in rule that implements it. The registry of rules by name is
router/rules.py; learned routers (router/model.py) implement the same protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch

from router.targets import validate_inputs


def _check_alpha(rule: "Rule", alpha: float) -> float:
    if rule.alpha_range is None:  # fixed targets ignore alpha
        return 0.0
    lo, hi = sorted(rule.alpha_range)
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.item()
    if math.isnan(alpha) or not lo <= alpha <= hi:
        raise ValueError(
            f"alpha={alpha} is outside {rule.name}'s range [{lo}, {hi}] "
            f"(lossless end {rule.alpha_range[0]}, drafter end {rule.alpha_range[1]})"
        )
    return float(alpha)


@runtime_checkable
class DeferralPolicy(Protocol):
    """What the decoding loop, training and evaluation need of a deferral policy: a plug-in rule
    (`Rule`) or a learned router (`router.model.LearnedRouter`). Any object with just a `target`
    method is wrapped into one by `resolve_rule`."""

    name: str
    form: str  # "cascade", "token", "lossy", "fixed", "judge" (pi depends on the drafted
    #   token: target() also gets drafts and next_p_raw), "window" (see follow) or "custom"
    hidden_inputs: tuple  # models whose last hidden state target() reads: "drafter", "verifier", "after"
    bonus_needs_drafter: bool  # False: pi at a whole block's bonus position ignores q (no drafter forward)
    exact_bonus: bool  # True: the bonus token always comes from pi (a drafter forward), whatever
    #   bonus_from says: a reference whose meaning p would change there (drafter-only decoding)
    offline_only: str | None  # why the decoding loop cannot run this policy as it was scored (None: it can)
    trained_pair: dict | None  # the drafter/verifier/tokenizer fingerprints it was trained on (None: any pair)
    reads_logits: bool  # True: the loop also passes the logits behind q_raw and p_raw (q_logits,
    #   p_logits, and next_p_logits for a judge), as learned routers want
    greedy_mode: bool  # True: at temperature 0 the loop decodes the mode of pi formed from the raw
    #   distributions (a pi that mixes q and p, e.g. `mixture`, is not one-hot even when q and p are)
    follow: int  # > 0: a window policy: target() also gets drafts and follow, a router.window.follow.FollowWindow
    #   of the next `follow` drafts of the block (their verifier scores); its pi depends on the draft
    min_gamma: int  # the least block size it decodes with (a window rule reads drafts after each draft)
    lag: int  # > 0: target() also gets lag = (feats (B, lag, F), valid (B, lag)), the features of the positions
    #   before the block (router.window.lag.LagCarry, carried across blocks by the loop)

    def target(
        self,
        q: torch.Tensor,
        p: torch.Tensor,
        alpha: float,
        q_raw: torch.Tensor | None = None,
        p_raw: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor: ...

    def check_alpha(self, alpha: float) -> float: ...


@dataclass(frozen=True)
class Rule:
    """A named plug-in rule: everything any stage needs to know about it, in one place.

    alpha_range: (lossless end, drafter end), None if alpha is unused. pi: the torch target
    `(q, p, alpha, q_raw, p_raw) -> pi (..., V)`. offline_score: the numpy score that offline curves
    sweep, `(cols, cand) -> scores` (cascade form: (N,) defer where score > alpha; token form:
    (N, K) over the recorded candidates, keep where score <= alpha; cols holds q_max, p_max, tv, cand
    a `router.offline.tradeoff.Candidates`); None where offline curves cannot be computed from records.
    online: part of eval's default online grid. bonus_needs_drafter, exact_bonus: see `DeferralPolicy`.
    """

    name: str
    form: str  # "cascade", "token", "lossy", "fixed" or "window" (reads the drafts after each draft)
    alpha_range: tuple[float, float] | None
    description: str
    pi: Callable = field(repr=False, compare=False)
    offline_score: Callable | None = field(default=None, repr=False, compare=False)
    online: bool = True
    bonus_needs_drafter: bool = True
    exact_bonus: bool = False
    offline_only: str | None = None
    trained_pair: dict | None = None
    hidden_inputs: tuple = ()
    reads_logits: bool = False
    greedy_mode: bool = False
    follow: int = 0
    min_gamma: int = 1
    lag: int = 0

    def check_alpha(self, alpha: float) -> float:
        """alpha as a float, or a ValueError when it is outside this rule's range."""
        return _check_alpha(self, alpha)

    def target(
        self,
        q: torch.Tensor,
        p: torch.Tensor,
        alpha: float,
        q_raw: torch.Tensor | None = None,
        p_raw: torch.Tensor | None = None,
        drafts: torch.Tensor | None = None,
        follow=None,
    ) -> torch.Tensor:
        """pi (..., V) for drafter q and verifier p (..., V) at trade-off `alpha`. A window rule
        (form "window") also needs the drafted tokens (B, g) and their `router.window.follow.FollowWindow`."""
        q_raw, p_raw = validate_inputs(q, p, q_raw, p_raw)
        if self.form != "window":
            return self.pi(q, p, self.check_alpha(alpha), q_raw, p_raw)
        if drafts is None or follow is None:
            raise ValueError(
                f"rule {self.name} reads the drafts that follow each draft in its block: pass drafts (B, g) and "
                f"follow=router.window.follow.block_window(drafts, p_raw, {self.follow}) (router.decoding.generate does)"
            )
        return self.pi(q, p, self.check_alpha(alpha), q_raw, p_raw, drafts=drafts, follow=follow)
