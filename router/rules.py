"""Deferral rules of speculative cascades, each a target distribution `pi = T(q, p)`.

The registry here is the one place that knows rule names: each `Rule` carries its form
(cascade/token/lossy/fixed), its torch target `pi = T(q, p)`, its offline score (the numpy form
offline curves sweep), its alpha range, whether eval runs it online by default and whether the
bonus position needs the drafter. Every list of rules elsewhere is derived from it
(`rules_of_form`, `offline_rules`, `online_rules`), so a rule added with `register_rule` appears
in train validation, offline and online eval, the reports and the demo with no other edit.
Every rule exposes `target(q, p, alpha, q_raw=None, p_raw=None) -> pi`, with any leading shape
`(..., V)`, and the policy call `decide(view, alpha)` (router/policy.py). Decisions use the raw (temperature 1) probabilities; targets use the scaled ones; ties
keep the drafter. The built-in rules' targets and offline scores are pure functions in
router/targets.py; formulas: docs/method.md (from the paper's section 2 and its JAX notebook).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass


from router import targets
from router.policy import DeferralPolicy, Needs, Rule
from router.view import BlockView
from router.window.fly import FLY  # FLy's entropy gate + deferred window, a Rule of its own module


INF = math.inf
RULE_FORMS = ("cascade", "token", "lossy", "fixed", "window")
_REGISTRY: dict[str, Rule] = {}
_BUILT_IN = (
    Rule(
        "chow",
        "cascade",
        (0.0, 1.0),
        "defer iff max q_raw < 1 - alpha",
        targets.chow_target,
        targets.chow_score,
        greedy=targets.chow_greedy,
    ),
    Rule(
        "diff",
        "cascade",
        (-1.0, 1.0),
        "defer iff max q_raw < max p_raw - alpha",
        targets.diff_target,
        targets.diff_score,
        greedy=targets.diff_greedy,
    ),
    Rule(
        "opt",
        "cascade",
        (-INF, INF),
        "defer iff max q_raw < max p_raw - alpha * TV(p, q)",
        targets.opt_target,
        targets.opt_score,
        greedy=targets.opt_greedy,
    ),
    Rule(
        "token_v1",
        "token",
        (-1.0, 1.0),
        "keep v iff q_raw(v) >= max p_raw - alpha",
        targets.token_v1_target,
        targets.token_v1_score,
        greedy=targets.token_v1_greedy,
    ),
    Rule(
        "token_v2",
        "token",
        (-1.0, 1.0),
        "keep v iff p_raw(v) >= max p_raw - alpha",
        targets.token_v2_target,
        targets.token_v2_score,
        greedy=targets.token_v2_greedy,
    ),
    Rule(
        "token_v3",
        "token",
        (0.0, 1.0),
        "keep v iff p_raw(v) >= (1 - alpha) max p_raw",
        targets.token_v3_target,
        targets.token_v3_score,
        greedy=targets.token_v3_greedy,
    ),
    Rule(
        "kl_gate",
        "cascade",
        (0.0, 1e6),
        "defer iff KL(p_raw || q_raw) > alpha or max p_raw > 0.9 (Sun et al. 2026)",
        targets.kl_gate_target,
        targets.kl_gate_score,
        greedy=targets.kl_gate_greedy,
    ),
    Rule(
        "entropy_gate",
        "cascade",
        (0.0, 1.0),
        "defer iff exp(-H(p_raw)) > alpha: verify where the verifier is nearly certain (FLy's entropy gate)",
        targets.entropy_gate_target,
        targets.entropy_gate_score,
        greedy=targets.entropy_gate_greedy,
    ),
    Rule(
        "lossy",
        "lossy",
        (0.0, 1.0),
        "lossy speculative decoding, accept min(1, p / ((1-alpha) q))",
        targets.lossy_target,
        greedy=targets.lossy_greedy,
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
        needs=Needs(),
        greedy=targets.lossless_greedy,
    ),
    # the drafter-only rule; online, eval runs the faster drafter-only baseline of that name instead
    Rule(
        "drafter",
        "fixed",
        None,
        "pi = q (drafter only)",
        targets.drafter_target,
        online=False,
        exact_bonus=True,
        greedy=targets.drafter_greedy,
    ),
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
    check_rule_name(rule.name)
    if rule.name in _REGISTRY:
        raise ValueError(f"a rule named {rule.name!r} is already registered; choose another name")
    check_alpha_range(rule)
    if rule.form not in RULE_FORMS:
        raise ValueError(f"rule {rule.name!r} has form {rule.form!r}; use {', '.join(RULE_FORMS)}")
    if (rule.form == "window") != (rule.needs.follow > 0):
        raise ValueError(f"rule {rule.name!r}: a window-form rule reads follow > 0 drafts, other forms none")
    if rule.form in ("cascade", "token") and rule.offline_score is None:
        raise ValueError(
            f"a {rule.form}-form rule needs an offline_score (see Rule) so offline curves, "
            f"train validation and the demo can compare it"
        )
    _REGISTRY[rule.name] = rule
    return rule


# names other methods take in eval's reports and grids: a rule named so would be mistaken for them
RESERVED_NAMES = ("verifier", "token_cascade", "sequence_cascade", "oracle", "oracle_token", "random")
RULE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def check_rule_name(name) -> None:
    """A rule's name appears in configs (`alphas: {NAME: [...]}`), point files (`NAME@alpha`) and paths: a
    letter, then letters, digits, _ and -."""
    if not isinstance(name, str) or not RULE_NAME.fullmatch(name):
        raise ValueError(
            f"rule name {name!r} is not usable: a rule's name is a letter, then letters, digits, _ or - "
            f"(it names point files NAME@alpha and config keys)"
        )
    if name in RESERVED_NAMES:
        raise ValueError(f"rule name {name!r} is taken by eval's {name} method; choose another name")


def check_alpha_range(rule: Rule) -> None:
    """None (alpha unused), or (lossless end, drafter end): two different numbers (either end may be infinite)."""
    span = rule.alpha_range
    ok = span is None or (
        isinstance(span, (tuple, list))
        and len(span) == 2
        and all(isinstance(a, (int, float)) and not isinstance(a, bool) and not math.isnan(a) for a in span)
        and span[0] != span[1]
    )
    if not ok:
        raise ValueError(
            f"rule {rule.name!r}: alpha_range must be None (alpha unused) or (lossless end, drafter end), two "
            f"different numbers such as (0.0, 1.0); got {span!r}"
        )


def unregister_rule(name: str) -> None:
    """Remove a rule added with `register_rule` (built-in rules stay)."""
    if name in {r.name for r in _BUILT_IN}:
        raise ValueError(f"{name!r} is a built-in rule and cannot be removed")
    _REGISTRY.pop(name, None)


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
    windows (router.window.follow.FollowWindow; defer where the score exceeds the sweep's threshold)."""
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


# the capability flags policies declared before `needs`: an object still declaring them is refused with the fix
_FORMER_FLAGS = ("hidden_inputs", "bonus_needs_drafter", "reads_logits", "follow", "lag")


@dataclass(frozen=True)
class _CustomPolicy:
    """An object with a `decide(view, alpha)` or a `target(q, p, alpha, q_raw, p_raw)` method, given the
    defaults of the DeferralPolicy protocol for the attributes it does not declare."""

    inner: object
    name: str
    form: str = "custom"
    needs: Needs = Needs({"bonus_q"})
    min_gamma: int = 1
    exact_bonus: bool = False
    greedy_mode: bool = False
    offline_only: str | None = None
    trained_pair: dict | None = None

    def decide(self, view: BlockView, alpha: float):
        if callable(getattr(self.inner, "decide", None)):
            return self.inner.decide(view, alpha)
        return self.inner.target(view.q, view.p, alpha, q_raw=view.q_raw, p_raw=view.p_raw)

    def check_alpha(self, alpha: float) -> float:
        return float(alpha)


def resolve_rule(rule) -> DeferralPolicy:
    """A rule name, a DeferralPolicy, or any object with a `decide(view, alpha)` or a
    `target(q, p, alpha, q_raw, p_raw)` method."""
    if isinstance(rule, str):
        return get_rule(rule)
    if not callable(getattr(rule, "decide", None)) and not callable(getattr(rule, "target", None)):
        raise TypeError(
            f"rule must be a name ({', '.join(_REGISTRY)}) or an object with a decide(view, alpha) or a "
            f"target(q, p, alpha, q_raw, p_raw) method, got {type(rule).__name__}"
        )
    if isinstance(rule, DeferralPolicy):
        return rule
    former = [flag for flag in _FORMER_FLAGS if hasattr(rule, flag)]
    if former and not hasattr(rule, "needs"):
        raise TypeError(
            f"policy {getattr(rule, 'name', type(rule).__name__)} declares {', '.join(former)}: declare what it reads "
            f"as needs = router.policy.Needs(...) instead (e.g. Needs({{'drafts', 'lookahead', 'hidden_after'}}, "
            f"follow=3)) and decide from a router.view.BlockView"
        )
    # an object declaring only some of the protocol's attributes keeps them; the others get the defaults
    declared = {f.name: getattr(rule, f.name) for f in dataclasses.fields(_CustomPolicy)[2:] if hasattr(rule, f.name)}
    return _CustomPolicy(rule, getattr(rule, "name", type(rule).__name__), **declared)
