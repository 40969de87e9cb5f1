"""The deferral-policy interface: what the decoding loop, training and evaluation need of a policy.

A policy makes one call, `decide(view, alpha) -> pi (..., V)`, on a `router.view.BlockView`, and declares
in one place what it reads beyond q and p (`needs`, a `Needs`), so the loop computes only that. `Rule`, a
named plug-in rule, implements it; learned routers (router/model.py) implement the same call. The
registry of rules by name is router/rules.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch

from router.view import BlockView

# what a policy may read beyond q, p, q_raw, p_raw (each but bonus_q fills inputs of router.view.BlockView)
NEED_NAMES = {
    "drafts": "the drafted tokens (a policy whose pi depends on the draft)",
    "lookahead": "the verifier's distribution after each draft, next_p_raw (a judge)",
    "logits": "the logits behind the raw distributions (cheaper features)",
    "hidden_drafter": "the drafter's last hidden state where q was computed",
    "hidden_verifier": "the verifier's last hidden state where p was computed",
    "hidden_after": "the verifier's last hidden state after reading each draft",
    "bonus_q": "q at a wholly accepted block's bonus position (one more drafter forward; without it pi = p there)",
}
HIDDEN_NEEDS = ("hidden_drafter", "hidden_verifier", "hidden_after")


@dataclass(frozen=True)
class Needs:
    """What a policy reads, in one place: `inputs` (names of NEED_NAMES), `follow` > 0 (the verifier's
    scores of the next `follow` drafts of the block, a router.window.follow.FollowWindow; implies drafts)
    and `lag` > 0 (the features of the `lag` positions before the block, router/window/lag.py).
    `follow_block`: the block size its follow windows were cut at in training (0: uncut, as recorded).
    `running`: the sums over the whole answer before each draft (router/window/running.py), which the lag
    carry keeps too. `"follow" in needs` and `"lag" in needs` read the sizes (lag: or running)."""

    inputs: frozenset = frozenset()
    follow: int = 0
    lag: int = 0
    follow_block: int = 0
    running: bool = False

    def __post_init__(self):
        inputs = frozenset([self.inputs] if isinstance(self.inputs, str) else self.inputs)
        unknown = sorted(inputs - set(NEED_NAMES))
        if unknown:
            raise ValueError(
                f"unknown need {unknown[0]!r}: a policy needs any of {', '.join(NEED_NAMES)} (follow and lag are sizes: "
                f"Needs(follow=n, lag=n))"
            )
        for size in ("follow", "lag", "follow_block"):
            value = getattr(self, size)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Needs.{size} is a count of positions (an integer >= 0), got {value!r}")
        if not isinstance(self.running, bool):
            raise ValueError(f"Needs.running is true or false, got {self.running!r}")
        object.__setattr__(self, "inputs", inputs | ({"drafts"} if self.follow else set()))

    def __contains__(self, name: str) -> bool:
        return (
            name in self.inputs
            or (name == "follow" and self.follow > 0)
            or (name == "lag" and (self.lag > 0 or self.running))
        )

    @property
    def hidden(self) -> tuple[str, ...]:
        """The models whose hidden states the policy reads: "drafter", "verifier", "after"."""
        return tuple(need.removeprefix("hidden_") for need in HIDDEN_NEEDS if need in self.inputs)


_CHECKED_PI: set[str] = set()  # rules whose pi has been checked once in this process


def check_distribution(pi, q: torch.Tensor, who: str) -> None:
    """Refuse a target pi that is not a distribution shaped like q (..., V): one line naming the policy."""
    fix = f"{who}'s pi must return a distribution over the vocabulary shaped like q {tuple(q.shape)}: fix its pi"
    if not isinstance(pi, torch.Tensor):
        raise ValueError(f"{who}: pi returned {type(pi).__name__}, not a tensor; {fix}")
    if pi.shape != q.shape:
        raise ValueError(f"{who}: pi has shape {tuple(pi.shape)}; {fix}")
    pi = pi.float()
    if not torch.isfinite(pi).all():
        raise ValueError(f"{who}: pi holds NaN or infinite values; {fix}")
    if (pi < -1e-6).any():
        raise ValueError(f"{who}: pi holds negative values (down to {pi.min().item():.3g}); {fix}")
    total = pi.sum(-1)
    worst = (total - 1).abs().max().item() if total.numel() else 0.0
    if worst > 1e-2:  # float32 sums over 150k entries drift far less; pi = 5 * p is caught
        raise ValueError(f"{who}: pi sums to {total.flatten()[(total - 1).abs().argmax()].item():.4g}, not 1; {fix}")


def alpha_number(alpha, who: str) -> float:
    """alpha as a float, or one ValueError naming the policy when it is not a number (a string "0.3" too:
    a typo in a config or a call should not decide every token)."""
    if isinstance(alpha, torch.Tensor) and alpha.numel() == 1:
        alpha = alpha.item()
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"{who}: alpha must be a number, got {alpha!r} ({type(alpha).__name__})")
    return float(alpha)


def _check_alpha(rule: "Rule", alpha: float) -> float:
    alpha = alpha_number(alpha, f"rule {rule.name}")
    if rule.alpha_range is None:  # fixed targets ignore alpha
        return 0.0
    lo, hi = sorted(rule.alpha_range)
    if math.isnan(alpha) or not lo <= alpha <= hi:
        raise ValueError(
            f"alpha={alpha} is outside {rule.name}'s range [{lo}, {hi}] "
            f"(lossless end {rule.alpha_range[0]}, drafter end {rule.alpha_range[1]})"
        )
    return float(alpha)


JUDGE_FORMS = ("judge", "window")  # forms whose pi is the one-hot draft where they keep it, p's side where not


def judges_the_draft(policy: "DeferralPolicy") -> bool:
    """True when the policy's pi is a verdict on the drafted token (its form is a judge's or a window rule's):
    its deferrals are the drafts it did not keep. Other policies defer where pi differs from q, whatever they
    read (a custom policy may read the drafts and still return a distribution)."""
    return policy.form in JUDGE_FORMS


@runtime_checkable
class DeferralPolicy(Protocol):
    """What the decoding loop, training and evaluation need of a deferral policy: a plug-in rule
    (`Rule`) or a learned router (`router.model.LearnedRouter`). Any object with a `decide(view, alpha)`
    or just a `target(q, p, alpha, q_raw, p_raw)` method is wrapped into one by `router.rules.resolve_rule`."""

    name: str
    form: str  # "cascade", "token", "lossy", "fixed", "judge" (pi depends on the drafted token), "window"
    #   (a rule reading the drafts after each draft) or "custom"
    needs: Needs  # what decide() reads beyond q, p, q_raw, p_raw: the loop computes only that
    min_gamma: int  # the least block size it decodes with (a window rule needs its whole window in the block)
    exact_bonus: bool  # True: the bonus token always comes from pi (a drafter forward), whatever bonus_from
    #   says: a reference whose meaning p would change there (drafter-only decoding)
    greedy_mode: bool  # True: at temperature 0 the loop decodes the mode of pi formed from the raw
    #   distributions (a pi that mixes q and p, e.g. `mixture`, is not one-hot even when q and p are)
    offline_only: str | None  # why the decoding loop cannot run this policy as it was scored (None: it can)
    trained_pair: dict | None  # the drafter/verifier/tokenizer fingerprints it was trained on (None: any pair)

    def decide(self, view: BlockView, alpha: float) -> torch.Tensor: ...

    def check_alpha(self, alpha: float) -> float: ...


@dataclass(frozen=True)
class Rule:
    """A named plug-in rule: everything any stage needs to know about it, in one place.

    alpha_range: (lossless end, drafter end), None if alpha is unused. pi: the torch target
    `(q, p, alpha, q_raw, p_raw) -> pi (..., V)` (a window rule's also gets drafts= and follow=).
    offline_score: the numpy score that offline curves sweep, `(cols, cand) -> scores` (cascade form:
    (N,) defer where score > alpha; token form: (N, K) over the recorded candidates, keep where
    score <= alpha; cols holds q_max, p_max, tv, cand a `router.offline.tradeoff.Candidates`); None where
    offline curves cannot be computed from records. online: part of eval's default online grid.
    needs, min_gamma, exact_bonus, greedy_mode: see `DeferralPolicy` (a rule reads q at the bonus position
    unless its needs say otherwise). greedy: the same decision at temperature 0 from per-draft statistics,
    `(router.greedy.GreedyView, alpha) -> keep the draft (...) bool` (None: decided from the full pi there).
    """

    name: str
    form: str  # "cascade", "token", "lossy", "fixed" or "window" (reads the drafts after each draft)
    alpha_range: tuple[float, float] | None
    description: str
    pi: Callable = field(repr=False, compare=False)
    offline_score: Callable | None = field(default=None, repr=False, compare=False)
    online: bool = True
    needs: Needs = Needs({"bonus_q"})
    min_gamma: int = 1
    exact_bonus: bool = False
    greedy_mode: bool = False
    offline_only: str | None = None
    trained_pair: dict | None = None
    greedy: Callable | None = field(default=None, repr=False, compare=False)

    def check_alpha(self, alpha: float) -> float:
        """alpha as a float, or a ValueError when it is outside this rule's range."""
        return _check_alpha(self, alpha)

    def decide(self, view: BlockView, alpha: float) -> torch.Tensor:
        """pi (..., V) at trade-off `alpha` from the view's q, p (and, for a window rule, its drafts and
        follow window); a rule's first pi is checked to be a distribution shaped like q."""
        alpha = self.check_alpha(alpha)
        if self.form != "window":
            pi = self.pi(view.q, view.p, alpha, view.q_raw, view.p_raw)
        else:
            reader = f"rule {self.name}"
            drafts, follow = view.read("drafts", reader), view.read("follow", reader)
            pi = self.pi(view.q, view.p, alpha, view.q_raw, view.p_raw, drafts=drafts, follow=follow)
        if self.name not in _CHECKED_PI:  # once per rule: the check costs a pass over (B, g, V)
            check_distribution(pi, view.q, f"rule {self.name}")
            _CHECKED_PI.add(self.name)
        return pi

    def greedy_keep(self, view, alpha: float) -> torch.Tensor | None:
        """Where this rule keeps each draft at temperature 0 (...) bool, from a router.greedy.GreedyView; None
        when the rule declares no greedy decision."""
        return None if self.greedy is None else self.greedy(view, self.check_alpha(alpha))

    def target(
        self,
        q: torch.Tensor,
        p: torch.Tensor,
        alpha: float,
        q_raw: torch.Tensor | None = None,
        p_raw: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """pi (..., V) for drafter q and verifier p (..., V) at trade-off `alpha`: `decide` on a view of
        just these (a window rule reads more: build a BlockView with drafts= and follow= and call decide)."""
        return self.decide(BlockView(q, p, q_raw, p_raw), alpha)
