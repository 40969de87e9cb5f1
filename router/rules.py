"""Deferral rules of speculative cascades, each a target distribution `pi = T(q, p)`.

The registry here is the one place that knows rule names: each `Rule` carries its form
(cascade/token/lossy/fixed), its torch target `pi = T(q, p)`, its offline score (the numpy form
offline curves sweep), its alpha range, whether eval runs it online by default and whether the
bonus position needs the drafter. Every list of rules elsewhere is derived from it
(`rules_of_form`, `offline_rules`, `online_rules`), so a rule added with `register_rule` appears
in train validation, offline and online eval, the reports and the demo with no other edit.
Every rule exposes `target(q, p, alpha, q_raw=None, p_raw=None) -> pi`, with any leading shape
`(..., V)`. Decisions use the raw (temperature 1) probabilities; targets use the scaled ones; ties
keep the drafter. The built-in rules' targets and offline scores are pure functions in
router/targets.py; formulas: docs/method.md (from the paper's section 2 and its JAX notebook).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch

from router import targets

# public names of router.rules too (sampling, the engine and tests import them from here)
from router.targets import DENOM_FLOOR, TV_FLOOR, cascade_mix, chow_defer, keep_drafts  # noqa: F401
from router.targets import ratio_score, safe_normalize, token_mix, tv_distance  # noqa: F401
from router.targets import trusted_inputs, validate_inputs  # noqa: F401


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
    follow: int  # > 0: a window policy: target() also gets drafts and follow, a router.window.inputs.FollowWindow
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
        (form "window") also needs the drafted tokens (B, g) and their `router.window.inputs.FollowWindow`."""
        q_raw, p_raw = validate_inputs(q, p, q_raw, p_raw)
        if self.form != "window":
            return self.pi(q, p, self.check_alpha(alpha), q_raw, p_raw)
        if drafts is None or follow is None:
            raise ValueError(
                f"rule {self.name} reads the drafts that follow each draft in its block: pass drafts (B, g) and "
                f"follow=router.window.inputs.block_window(drafts, p_raw, {self.follow}) (router.decoding.generate does)"
            )
        return self.pi(q, p, self.check_alpha(alpha), q_raw, p_raw, drafts=drafts, follow=follow)


INF = math.inf
RULE_FORMS = ("cascade", "token", "lossy", "fixed", "window")
_REGISTRY: dict[str, Rule] = {}
_BUILT_IN = (
    Rule("chow", "cascade", (0.0, 1.0), "defer iff max q_raw < 1 - alpha", targets.chow_target, targets.chow_score),
    Rule(
        "diff",
        "cascade",
        (-1.0, 1.0),
        "defer iff max q_raw < max p_raw - alpha",
        targets.diff_target,
        targets.diff_score,
    ),
    Rule(
        "opt",
        "cascade",
        (-INF, INF),
        "defer iff max q_raw < max p_raw - alpha * TV(p, q)",
        targets.opt_target,
        targets.opt_score,
    ),
    Rule(
        "token_v1",
        "token",
        (-1.0, 1.0),
        "keep v iff q_raw(v) >= max p_raw - alpha",
        targets.token_v1_target,
        targets.token_v1_score,
    ),
    Rule(
        "token_v2",
        "token",
        (-1.0, 1.0),
        "keep v iff p_raw(v) >= max p_raw - alpha",
        targets.token_v2_target,
        targets.token_v2_score,
    ),
    Rule(
        "token_v3",
        "token",
        (0.0, 1.0),
        "keep v iff p_raw(v) >= (1 - alpha) max p_raw",
        targets.token_v3_target,
        targets.token_v3_score,
    ),
    Rule(
        "kl_gate",
        "cascade",
        (0.0, 1e6),
        "defer iff KL(p_raw || q_raw) > alpha or max p_raw > 0.9 (Sun et al. 2026)",
        targets.kl_gate_target,
        targets.kl_gate_score,
    ),
    Rule(
        "entropy_gate",
        "cascade",
        (0.0, 1.0),
        "defer iff exp(-H(p_raw)) > alpha: verify where the verifier is nearly certain (FLy's entropy gate)",
        targets.entropy_gate_target,
        targets.entropy_gate_score,
    ),
    Rule(
        "lossy",
        "lossy",
        (0.0, 1.0),
        "lossy speculative decoding, accept min(1, p / ((1-alpha) q))",
        targets.lossy_target,
    ),
    # greedy: the argmax of w p_raw + (1 - w) q_raw, as transformers decodes assistant_ensemble_weight greedily
    Rule(
        "mixture",
        "lossy",
        (1.0, 0.0),
        "pi = alpha p + (1 - alpha) q (static ensemble, transformers' assistant_ensemble_weight = alpha)",
        targets.mixture_target,
        online=False,
        greedy_mode=True,
    ),
    # pi = p everywhere, so the bonus position needs no q: the drafter forward there is skipped
    Rule(
        "lossless",
        "fixed",
        None,
        "pi = p (standard speculative decoding)",
        targets.lossless_target,
        bonus_needs_drafter=False,
    ),
    # the drafter-only rule; online, eval runs the faster drafter-only baseline of that name instead
    Rule("drafter", "fixed", None, "pi = q (drafter only)", targets.drafter_target, online=False, exact_bonus=True),
)


class _RuleNames(Sequence):
    """The registered rule names, read from the registry on every use (so a rule registered later is
    in it), read-only; equal to the tuple of the same names."""

    def __getitem__(self, i):
        return tuple(_REGISTRY)[i]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __eq__(self, other) -> bool:
        return isinstance(other, (tuple, list, _RuleNames)) and tuple(self) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(tuple(self))


RULES: Sequence[str] = _RuleNames()  # the registered names, live


def register_rule(rule: Rule) -> Rule:
    """Add a plug-in rule to the registry: it then appears in `specroute rules`, `generate`, train's
    validation comparison (with an offline_score), eval's offline curves and online grid, the
    reports and the demo's choice of the best rule of its form. Names must be new."""
    if rule.name in _REGISTRY:
        raise ValueError(f"a rule named {rule.name!r} is already registered; choose another name")
    if rule.form not in RULE_FORMS:
        raise ValueError(f"rule {rule.name!r} has form {rule.form!r}; use {', '.join(RULE_FORMS)}")
    if (rule.form == "window") != (rule.follow > 0):
        raise ValueError(f"rule {rule.name!r}: a window-form rule reads follow > 0 drafts, other forms none")
    if rule.form in ("cascade", "token") and rule.offline_score is None:
        raise ValueError(
            f"a {rule.form}-form rule needs an offline_score (see Rule) so offline curves, "
            f"train validation and the demo can compare it"
        )
    _REGISTRY[rule.name] = rule
    return rule


def unregister_rule(name: str) -> None:
    """Remove a rule added with `register_rule` (built-in rules stay)."""
    if name in {r.name for r in _BUILT_IN}:
        raise ValueError(f"{name!r} is a built-in rule and cannot be removed")
    _REGISTRY.pop(name, None)


from router.window.fly import FLY  # noqa: E402  (FLy's entropy gate + deferred window: it builds on Rule)

_BUILT_IN = (*_BUILT_IN, FLY)
for _rule in _BUILT_IN:
    register_rule(_rule)


def rule_names() -> tuple[str, ...]:
    """Every registered rule's name, built-in first."""
    return tuple(_REGISTRY)


def rules_of_form(*forms: str) -> tuple[str, ...]:
    """Names of the registered rules of these forms, e.g. rules_of_form("cascade")."""
    return tuple(name for name, rule in _REGISTRY.items() if rule.form in forms)


def offline_rules() -> tuple[str, ...]:
    """Per-position rules whose curves offline evaluation and train validation compute from records
    (window rules are scored where the records hold windows: `window_offline_rules`)."""
    return tuple(name for name, rule in _REGISTRY.items() if rule.offline_score is not None and rule.form != "window")


def window_offline_rules() -> tuple[str, ...]:
    """Window rules with a greedy-view offline score, `offline_score(window) -> (N,)` over the recorded
    windows (router.window.inputs.FollowWindow; defer where the score exceeds the sweep's threshold)."""
    return tuple(name for name, rule in _REGISTRY.items() if rule.offline_score is not None and rule.form == "window")


def online_rules() -> tuple[str, ...]:
    """Rules in eval's default online grid."""
    return tuple(name for name, rule in _REGISTRY.items() if rule.online)


def get_rule(name: str) -> Rule:
    """The rule called `name`; an unknown name raises KeyError listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown rule {name!r}; known rules: {', '.join(_REGISTRY)}") from None


@dataclass(frozen=True)
class _CustomPolicy:
    """An object with a `target` method, given the defaults of the DeferralPolicy protocol for the
    attributes it does not declare (a policy written before an attribute was added keeps working)."""

    inner: object
    name: str
    form: str = "custom"
    hidden_inputs: tuple = ()
    bonus_needs_drafter: bool = True
    exact_bonus: bool = False
    offline_only: str | None = None
    trained_pair: dict | None = None
    reads_logits: bool = False
    greedy_mode: bool = False
    follow: int = 0
    min_gamma: int = 1
    lag: int = 0

    def target(self, q, p, alpha, q_raw=None, p_raw=None, **kwargs):
        return self.inner.target(q, p, alpha, q_raw=q_raw, p_raw=p_raw, **kwargs)

    def check_alpha(self, alpha: float) -> float:
        return float(alpha)


def resolve_rule(rule) -> DeferralPolicy:
    """A rule name, a DeferralPolicy, or any object with a `target(q, p, alpha, q_raw, p_raw)` method."""
    if isinstance(rule, str):
        return get_rule(rule)
    if not callable(getattr(rule, "target", None)):
        raise TypeError(
            f"rule must be a name ({', '.join(_REGISTRY)}) or an object with a "
            f"target(q, p, alpha, q_raw, p_raw) method, got {type(rule).__name__}"
        )
    if isinstance(rule, DeferralPolicy):
        return rule
    # an object declaring only some of the protocol's attributes keeps them; the others get the defaults
    declared = {f.name: getattr(rule, f.name) for f in dataclasses.fields(_CustomPolicy)[2:] if hasattr(rule, f.name)}
    return _CustomPolicy(rule, getattr(rule, "name", type(rule).__name__), **declared)
