"""Deferral rules of speculative cascades, each a target distribution `pi = T(q, p)`.

The registry here is the one place that knows rule names: each `Rule` carries its form
(cascade/token/lossy/fixed), its torch target `pi = T(q, p)`, its offline score (the numpy form
offline curves sweep), its alpha range, whether eval runs it online by default and whether the
bonus position needs the drafter. Every list of rules elsewhere is derived from it
(`rules_of_form`, `offline_rules`, `online_rules`), so a rule added with `register_rule` appears
in train validation, offline and online eval, the reports and the demo with no other edit.
Every rule exposes `target(q, p, alpha, q_raw=None, p_raw=None) -> pi`, with any leading shape
`(..., V)`. Decisions use the raw (temperature 1) probabilities; targets use the scaled ones; ties
keep the drafter. Formulas: docs/method.md (from the paper's section 2 and its JAX notebook).
"""

from __future__ import annotations

import contextlib
import dataclasses
import contextvars
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import torch

SUM_TOLERANCE = 1e-3  # bf16 softmax rows can drift ~1e-3 from 1 after casting
DENOM_FLOOR = 1e-10  # docs/method.md: acceptance denominators are floored here
TV_FLOOR = 1e-12  # positions where p == q cost nothing to defer; their ratio scores become +inf/-inf


def _check_dist(name: str, x: torch.Tensor) -> None:
    """Raise a ValueError that names the problem when `x` is not a stack of distributions."""
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor of probabilities, got {type(x).__name__}"
            f"{'' if not torch.is_tensor(x) else ' of ' + str(x.dtype)}"
        )
    if x.dim() == 0 or x.shape[-1] < 2:
        raise ValueError(f"{name} must have shape (..., V) with V >= 2, got {tuple(x.shape)}")
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN: check the logits that produced it")
    if (x < 0).any():
        raise ValueError(f"{name} has negative entries: pass probabilities (softmax), not logits")
    sums = x.sum(-1, dtype=torch.float64)
    worst = (sums - 1).abs().max().item()
    if worst > SUM_TOLERANCE:
        raise ValueError(
            f"{name} rows must sum to 1 (worst row is off by {worst:.3g}): "
            f"pass normalised probabilities, e.g. logits.softmax(-1)"
        )


_TRUSTED = contextvars.ContextVar("specroute_trusted_inputs", default=False)


@contextlib.contextmanager
def trusted_inputs():
    """Within this block, rules skip the content checks (NaN, sign, row sums) of their inputs.

    The decoding loop forms q and p with softmax itself; re-checking four V-sized tensors every
    block cost ~8% of a verifier forward on the embedded pair. Shapes are still checked.
    """
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def validate_inputs(q, p, q_raw, p_raw) -> tuple[torch.Tensor, torch.Tensor]:
    """Check shapes and contents of a rule's inputs; return (q_raw, p_raw) with defaults filled."""
    q_raw = q if q_raw is None else q_raw
    p_raw = p if p_raw is None else p_raw
    if not _TRUSTED.get():
        for name, x in (("q", q), ("p", p), ("q_raw", q_raw), ("p_raw", p_raw)):
            _check_dist(name, x)
    shapes = {tuple(x.shape) for x in (q, p, q_raw, p_raw)}
    if len(shapes) != 1:
        raise ValueError(
            f"q, p, q_raw, p_raw must share one shape (..., V); got "
            f"q {tuple(q.shape)}, p {tuple(p.shape)}, q_raw {tuple(q_raw.shape)}, "
            f"p_raw {tuple(p_raw.shape)}"
        )
    return q_raw, p_raw


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = sum_v max(0, p(v) - q(v)); shape (...)."""
    return (p - q).clamp_min(0).sum(-1)


def safe_normalize(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Normalise rows of a non-negative tensor; an all-zero row becomes the fallback row.

    An all-zero residual only happens where it carries zero probability mass, so the fallback
    never changes the result, it only keeps NaN out.
    """
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / total.clamp_min(1e-30), fallback)


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


# ---- cascade form: one decision r per position, pi = (1 - r) q + r p -----------------------


def cascade_mix(q: torch.Tensor, p: torch.Tensor, defer: torch.Tensor) -> torch.Tensor:
    """pi = (1 - r) q + r p for a boolean decision r of shape (...)."""
    return torch.where(defer.unsqueeze(-1), p, q)


def keep_drafts(p: torch.Tensor, drafts: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """pi (..., V) of a policy that decides drafted tokens (...): one-hot on the draft where it keeps
    it, else p (verified losslessly); the sampler's law is in docs/method.md (judges)."""
    pi = p * (~keep)[..., None]  # rows that keep the draft: zero, then one-hot on it
    return pi.scatter_add_(-1, drafts.long()[..., None], keep[..., None].to(p.dtype))


def chow_defer(q_raw: torch.Tensor, alpha: float) -> torch.Tensor:
    """Chow's rule: defer iff max q_raw < 1 - alpha (needs only the drafter)."""
    return q_raw.amax(-1) < 1 - alpha


def _chow(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, chow_defer(q_raw, alpha))


def _diff(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, q_raw.amax(-1) < p_raw.amax(-1) - alpha)


def _opt(q, p, alpha, q_raw, p_raw):
    tv = tv_distance(p, q)
    # alpha may be +-inf: where TV = 0 the two choices coincide, so the product is taken as 0
    margin = torch.where(tv > 0, alpha * tv, torch.zeros_like(tv))
    return cascade_mix(q, p, q_raw.amax(-1) < p_raw.amax(-1) - margin)


# ---- token-specific form: pi(v) = q(v) 1[v in A] + p(v) * sum_{u not in A} q(u) ------------


def token_mix(q: torch.Tensor, p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Token-specific target for a boolean keep set A (..., V)."""
    kept_q = torch.where(keep, q, torch.zeros_like(q))
    eta = (q - kept_q).sum(-1, keepdim=True)  # drafter mass outside A goes to the verifier
    return kept_q + p * eta


def _token_v1(q, p, alpha, q_raw, p_raw):
    return token_mix(q, p, q_raw >= p_raw.amax(-1, keepdim=True) - alpha)


def _token_v2(q, p, alpha, q_raw, p_raw):
    return token_mix(q, p, p_raw >= p_raw.amax(-1, keepdim=True) - alpha)


def _token_v3(q, p, alpha, q_raw, p_raw):
    return token_mix(q, p, p_raw >= (1 - alpha) * p_raw.amax(-1, keepdim=True))


# ---- training-free gates from the literature (cascade form) ------------------------------------

KL_GATE_CONFIDENT = 0.9  # where max p exceeds this, the KL gate verifies as lossless (its confidence mask)


def _kl_pq(q_raw: torch.Tensor, p_raw: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats, (...)."""
    p32, q32 = p_raw.float(), q_raw.float()
    return (p32 * (p32.clamp_min(1e-12).log() - q32.clamp_min(1e-12).log())).sum(-1)


def _kl_gate(q, p, alpha, q_raw, p_raw):
    # Sun et al. 2026 (arXiv 2601.04766): a learned linear judge reduces to a KL test; keep the draft
    # where KL(p || q) <= alpha, unless the verifier is confident (its top-1 > 0.9): verify there
    confident = p_raw.amax(-1) > KL_GATE_CONFIDENT
    return cascade_mix(q, p, (_kl_pq(q_raw, p_raw) > alpha) | confident)


def _p_certainty(p_raw: torch.Tensor) -> torch.Tensor:
    """exp(-H(p)) in (0, 1]: 1 when the verifier is certain, small when many tokens are plausible."""
    p32 = p_raw.float()
    return torch.exp((p32 * p32.clamp_min(1e-12).log()).sum(-1))


def _entropy_gate(q, p, alpha, q_raw, p_raw):
    # FLy's entropy-level gate (Li et al. 2025, arXiv 2511.22972): where the verifier is nearly
    # deterministic (entropy below -ln alpha) verify exactly, elsewhere keep the draft. FLy's
    # deferred window (a later check of the verifier's self-correction) is not part of this rule.
    return cascade_mix(q, p, _p_certainty(p_raw) > alpha)


# ---- lossy speculative decoding and the two fixed targets ------------------------------------


def _lossy(q, p, alpha, q_raw, p_raw):
    # in float32 at least: the 1e-10 floor of the acceptance denominator underflows in float16 (NaN)
    q32, p32 = q.float(), p.float()
    denom = (1 - alpha) * q32
    # a zero denominator accepts: at alpha = 1 every draft is kept (pi = q exactly, even where p = 0);
    # below it a zero q(v) is never drafted, so its acceptance does not matter
    accept = torch.where(denom > 0, p32 / denom.clamp_min(DENOM_FLOOR), torch.ones_like(p32)).clamp_max(1)
    kept = q32 * accept
    rejected_mass = (1 - kept.sum(-1, keepdim=True)).clamp_min(0)
    return (kept + rejected_mass * safe_normalize((p32 - q32).clamp_min(0), p32)).to(q.dtype)


def _mixture(q, p, alpha, q_raw, p_raw):
    # DIVERSE's static ensemble verification (arXiv 2604.07622; transformers' assistant_ensemble_weight):
    # verify against pi = w p + (1 - w) q with w = alpha, so a draft d is kept with probability
    # 1 - w + w p(d) / q(d) (capped at 1), and a rejection resamples from normalize(max(0, p - q))
    return alpha * p + (1 - alpha) * q


def _lossless(q, p, alpha, q_raw, p_raw):
    return p.clone()


def _drafter(q, p, alpha, q_raw, p_raw):
    return q.clone()


# ---- offline scores (numpy, from recorded scalars and candidates; see router/offline/tradeoff.py) --------


def ratio_score(numerator: np.ndarray, tv: np.ndarray) -> np.ndarray:
    """numerator / TV, with TV = 0 mapped to +-inf by the numerator's sign (defer for free or never)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 where both are 0: never defer, below
        out = np.where(tv > TV_FLOOR, numerator / np.maximum(tv, TV_FLOOR), np.sign(numerator) * np.inf)
    return np.nan_to_num(out, nan=-np.inf)


def _chow_score(cols, cand):
    return 1.0 - np.asarray(cols["q_max"])


def _diff_score(cols, cand):
    return np.asarray(cols["p_max"]) - np.asarray(cols["q_max"])


def _opt_score(cols, cand):
    return ratio_score(np.asarray(cols["p_max"]) - np.asarray(cols["q_max"]), np.asarray(cols["tv"]))


def _kl_gate_score(cols, cand):
    # confident positions always defer: above every alpha the rule accepts (its range ends at 1e6)
    kl = np.asarray(cols["kl"], np.float64)
    return np.where(np.asarray(cols["p_max"]) > KL_GATE_CONFIDENT, 2e6, kl)


def _entropy_gate_score(cols, cand):
    return np.exp(-np.asarray(cols["p_entropy"], np.float64))


def _token_v1_score(cols, cand):
    return cand.p_max[:, None] - cand.q


def _token_v2_score(cols, cand):
    return cand.p_max[:, None] - cand.p


def _token_v3_score(cols, cand):
    return 1.0 - cand.p / np.maximum(cand.p_max[:, None], TV_FLOOR)


INF = math.inf
RULE_FORMS = ("cascade", "token", "lossy", "fixed", "window")
_REGISTRY: dict[str, Rule] = {}
_BUILT_IN = (
    Rule("chow", "cascade", (0.0, 1.0), "defer iff max q_raw < 1 - alpha", _chow, _chow_score),
    Rule("diff", "cascade", (-1.0, 1.0), "defer iff max q_raw < max p_raw - alpha", _diff, _diff_score),
    Rule("opt", "cascade", (-INF, INF), "defer iff max q_raw < max p_raw - alpha * TV(p, q)", _opt, _opt_score),
    Rule("token_v1", "token", (-1.0, 1.0), "keep v iff q_raw(v) >= max p_raw - alpha", _token_v1, _token_v1_score),
    Rule("token_v2", "token", (-1.0, 1.0), "keep v iff p_raw(v) >= max p_raw - alpha", _token_v2, _token_v2_score),
    Rule("token_v3", "token", (0.0, 1.0), "keep v iff p_raw(v) >= (1 - alpha) max p_raw", _token_v3, _token_v3_score),
    Rule(
        "kl_gate",
        "cascade",
        (0.0, 1e6),
        "defer iff KL(p_raw || q_raw) > alpha or max p_raw > 0.9 (Sun et al. 2026)",
        _kl_gate,
        _kl_gate_score,
    ),
    Rule(
        "entropy_gate",
        "cascade",
        (0.0, 1.0),
        "defer iff exp(-H(p_raw)) > alpha: verify where the verifier is nearly certain (FLy's entropy gate)",
        _entropy_gate,
        _entropy_gate_score,
    ),
    Rule("lossy", "lossy", (0.0, 1.0), "lossy speculative decoding, accept min(1, p / ((1-alpha) q))", _lossy),
    # greedy: the argmax of w p_raw + (1 - w) q_raw, as transformers decodes assistant_ensemble_weight greedily
    Rule(
        "mixture",
        "lossy",
        (1.0, 0.0),
        "pi = alpha p + (1 - alpha) q (static ensemble, transformers' assistant_ensemble_weight = alpha)",
        _mixture,
        online=False,
        greedy_mode=True,
    ),
    # pi = p everywhere, so the bonus position needs no q: the drafter forward there is skipped
    Rule("lossless", "fixed", None, "pi = p (standard speculative decoding)", _lossless, bonus_needs_drafter=False),
    # the drafter-only rule; online, eval runs the faster drafter-only baseline of that name instead
    Rule("drafter", "fixed", None, "pi = q (drafter only)", _drafter, online=False, exact_bonus=True),
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
