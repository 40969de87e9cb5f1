"""Offline quality-vs-rejection trade-off of cascade-form deferral, exact from recorded scalars.

For a cascade decision r at a position with gold token y (temperature 1), pi = (1 - r) q + r p, so
  expected quality   pi(y)     = q(y) + r (p(y) - q(y))        (probability of the gold token)
  greedy top-1       [argmax pi = y] = r ? [argmax p = y] : [argmax q = y]
  rejection rate     TV(q, pi) = r TV(p, q)                    (Lemma 3 of the paper)
Every cascade method defers where a per-position *defer score* exceeds a threshold (chow:
1 - max q; diff: max p - max q; opt: (max p - max q) / TV; a learned router: predicted gap / TV;
the oracle, which knows y: (p(y) - q(y)) / TV), so its whole alpha sweep is one sort. Each rule's
score lives with the rule in the registry (router/rules.py); `rule_curves`, `oracle_curve` and
`router_curve` are the one way train (validation areas) and eval (offline curves) build curves.

Token-form methods (token_v1/v2/v3, token-head routers) keep a set A of drafter tokens:
pi = q 1[A] + eta p with eta = q(outside A). From the recorded top-k candidates of q (their q and p
probabilities) `token_curve` gives, per threshold, pi(y) = q(y) 1[y in A] + eta p(y) and
TV(q, pi) = sum over v not in A of max(0, q(v) - eta p(v)). Tokens outside the top-k are always
deferred (as in decoding, where a token router scores only its candidates); their rejection term is
taken as max(0, q_rest - eta p_rest) over the rest's total masses, a lower bound that is exact when
the rest is one token and negligible when q's tail is small. The sweep's last point keeps every
token: the drafter itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from router.rules import get_rule, offline_rules
from router.targets import ratio_score


@dataclass
class Curve:
    """Points of a trade-off curve, rejection rate ascending (drafter end first)."""

    rejection: np.ndarray  # (P,) mean r * TV over positions
    quality: np.ndarray  # (P,) mean quality over positions
    deferral: np.ndarray  # (P,) fraction of positions deferred
    threshold: np.ndarray | None = None  # (P,) the alpha / threshold giving each point (+inf: drafter)
    top1: np.ndarray | None = None  # (P,) gold top-1 accuracy of greedy decoding from pi


def oracle_scores(cols: dict) -> np.ndarray:
    """The gold-knowing cascade oracle's defer score (p(y) - q(y)) / TV: defers where it gains most per
    unit of rejection."""
    return ratio_score(np.asarray(cols["p_token"]) - np.asarray(cols["q_token"]), np.asarray(cols["tv"]))


def learned_defer_scores(gap: np.ndarray, tv: np.ndarray) -> np.ndarray:
    """A cascade-head router defers where its predicted gap exceeds alpha * TV: score gap / TV."""
    return ratio_score(np.asarray(gap), np.asarray(tv))


def curve(
    scores: np.ndarray,
    tv: np.ndarray,
    q_quality: np.ndarray,
    p_quality: np.ndarray,
    q_top1: np.ndarray | None = None,
    p_top1: np.ndarray | None = None,
) -> Curve:
    """The full threshold sweep of 'defer iff score > t': one point per distinct score, plus none.

    With q_top1/p_top1 (1 where each model's argmax is the gold token) it also gives greedy
    top-1 accuracy, which a cascade decision takes from the model it keeps."""
    scores, tv = np.asarray(scores, dtype=np.float64), np.asarray(tv, dtype=np.float64)
    n = len(scores)
    order = np.argsort(-scores, kind="stable")
    s = scores[order]
    last_of_group = np.r_[s[1:] != s[:-1], True]  # ties defer together (decisions are strict)

    def sweep(q_val, p_val):
        q_val, p_val = np.asarray(q_val, dtype=np.float64), np.asarray(p_val, dtype=np.float64)
        gain = np.cumsum((p_val - q_val)[order]) / n
        return np.r_[q_val.mean(), q_val.mean() + gain[last_of_group]]

    rejection = np.r_[0.0, (np.cumsum(tv[order]) / n)[last_of_group]]
    deferral = np.r_[0.0, (np.nonzero(last_of_group)[0] + 1) / n]
    # deferring every score >= g_i (and none below) happens for alpha between g_i and the next
    # lower score: take the midpoint, robust to the rules' float32 arithmetic
    g = s[last_of_group]
    lower = np.r_[g[1:], g[-1] - 1.0]
    mid = np.where(np.isfinite(g) & np.isfinite(lower), (g + lower) / 2, np.nextafter(g, -np.inf))
    threshold = np.r_[np.inf, mid]
    top1 = sweep(q_top1, p_top1) if q_top1 is not None else None
    return Curve(rejection, sweep(q_quality, p_quality), deferral, threshold, top1)


def random_curve(tv, q_quality, p_quality, points: int = 11) -> Curve:
    """Deferring a random fraction rho of positions: the straight line from drafter to verifier."""
    rho = np.linspace(0, 1, points)
    return Curve(rho * np.mean(tv), np.mean(q_quality) + rho * (np.mean(p_quality) - np.mean(q_quality)), rho)


def frontier(c: Curve) -> tuple[np.ndarray, np.ndarray]:
    """(rejection, best quality at no more than that rejection rate) over the method's alphas:
    what a user can get by choosing alpha. Token-form curves are not monotone in alpha (keeping a
    smaller set can raise TV(q, pi)); the frontier is, for every method."""
    order = np.argsort(c.rejection, kind="stable")
    return c.rejection[order], np.maximum.accumulate(c.quality[order])


def area(c: Curve, up_to: float) -> float:
    """Area between the method's frontier and the drafter's quality over rejection rates [0, up_to].

    Beyond its last point a curve stays at its best quality (that method cannot spend more).
    """
    rej, best = frontier(c)
    x = np.r_[rej[rej <= up_to], up_to]
    y = np.interp(x, rej, best)
    return float(np.trapezoid(y - c.quality[0], x))


def normalised_area(c: Curve, oracle: Curve) -> float:
    """Area relative to the oracle's over the oracle's rejection range: 0 = drafter, 1 = oracle."""
    span = float(oracle.rejection[-1])
    best = area(oracle, span)
    return area(c, span) / best if best > 0 else 0.0


def quality_at(c: Curve, rejection: float) -> float:
    """Best quality the curve reaches at no more than this rejection rate."""
    reachable = c.quality[c.rejection <= rejection + 1e-12]
    return float(reachable.max()) if len(reachable) else float(c.quality[0])


def at_threshold(scores, threshold: float, tv, q_quality, p_quality) -> tuple[float, float]:
    """(rejection rate, quality) of 'defer iff score > threshold', e.g. one alpha of a rule."""
    r = np.asarray(scores) > threshold
    gain = np.where(r, np.asarray(p_quality) - np.asarray(q_quality), 0.0)
    return float(np.mean(np.where(r, tv, 0.0))), float(np.mean(q_quality) + np.mean(gain))


def oracle_bound(oracle: Curve, rejection: float) -> float:
    """Upper bound on the quality of any deferral set within this rejection rate: the oracle's
    curve interpolated up to its best point (the fractional-knapsack frontier), flat after it."""
    best = int(np.argmax(oracle.quality))
    x, y = oracle.rejection[: best + 1], oracle.quality[: best + 1]
    return float(np.interp(min(rejection, x[-1]), x, y))


@dataclass
class Candidates:
    """The drafter's top-k tokens at N positions, for token-form curves."""

    q: np.ndarray  # (N, K) q of each candidate
    p: np.ndarray  # (N, K) p of each candidate
    is_gold: np.ndarray  # (N, K) bool: the candidate is the gold token y
    is_p_argmax: np.ndarray  # (N, K) bool: the candidate is argmax p
    q_gold: np.ndarray  # (N,) q(y)
    p_gold: np.ndarray  # (N,) p(y)
    p_max: np.ndarray  # (N,) max p

    @property
    def labels(self) -> np.ndarray:
        """Token-form oracle gap (N, K) per candidate v: 1[v != y] - (1 - p(y)) (docs/method.md)."""
        return (~self.is_gold).astype(np.float64) - (1.0 - self.p_gold[:, None])


CANDIDATE_COLUMNS = (
    "q_topk_ids",
    "q_topk_logprobs",
    "p_at_q_topk_logprobs",
    "token",
    "p_argmax",
    "q_token",
    "p_token",
    "p_max",
)


def candidates_from_columns(cols: dict) -> Candidates:
    """The drafter's recorded top-k candidates at each record row (columns CANDIDATE_COLUMNS)."""
    ids = np.asarray(cols["q_topk_ids"])  # (N, K), column 0 = argmax q
    return Candidates(
        q=np.exp(np.asarray(cols["q_topk_logprobs"], np.float64)),
        p=np.exp(np.asarray(cols["p_at_q_topk_logprobs"], np.float64)),
        is_gold=ids == np.asarray(cols["token"])[:, None],
        is_p_argmax=ids == np.asarray(cols["p_argmax"])[:, None],
        q_gold=np.asarray(cols["q_token"], np.float64),
        p_gold=np.asarray(cols["p_token"], np.float64),
        p_max=np.asarray(cols["p_max"], np.float64),
    )


def token_rows(keep: np.ndarray, cand: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per position (N,) each: rejection, quality, deferral and greedy top-1 of keep sets (N, K) of
    candidates; the rest of q defers.

    Greedy top-1 is exact: a token outside the candidates has pi = eta p, so the argmax of pi is a
    candidate or the verifier's argmax."""
    q, p = cand.q, cand.p
    eta = 1.0 - (q * keep).sum(-1)  # (N,) drafter mass outside A: the chance a draft is deferred
    q_rest = np.maximum(0.0, 1.0 - q.sum(-1))
    p_rest = np.maximum(0.0, 1.0 - p.sum(-1))
    rejected = np.where(keep, 0.0, np.maximum(0.0, q - eta[:, None] * p)).sum(-1) + np.maximum(
        0.0, q_rest - eta * p_rest
    )
    gold_kept = (keep & cand.is_gold).any(-1)
    quality = np.where(gold_kept, cand.q_gold, 0.0) + eta * cand.p_gold
    pi_cand = q * keep + eta[:, None] * p  # (N, K)
    best = pi_cand.argmax(-1)
    rows = np.arange(len(best))
    p_argmax_outside = ~cand.is_p_argmax.any(-1)
    outside_wins = p_argmax_outside & (eta * cand.p_max > pi_cand[rows, best])
    gold_is_p_argmax = np.isclose(cand.p_gold, cand.p_max) & (cand.p_gold > 0)
    top1 = np.where(outside_wins, gold_is_p_argmax, cand.is_gold[rows, best])
    return rejected, quality, eta, top1.astype(np.float64)


def token_point(keep: np.ndarray, cand: Candidates) -> tuple[float, float, float, float]:
    """(rejection, quality, deferral, greedy top-1) of keep sets (N, K): the means of `token_rows`."""
    return tuple(float(x.mean()) for x in token_rows(keep, cand))


def quantile_grid(scores: np.ndarray, points: int = 128) -> np.ndarray:
    """Thresholds a sweep visits, ascending: `points` quantiles of the finite scores."""
    finite = scores[np.isfinite(scores)]
    return np.unique(np.quantile(finite, np.linspace(0, 1, points))) if finite.size else np.zeros(0)


def token_curve(scores: np.ndarray, cand: Candidates, points: int = 128, q_top1: np.ndarray | None = None) -> Curve:
    """The sweep of 'keep v iff score <= t' over `points` score quantiles, plus keep-everything
    (the drafter; its top-1 is mean(q_top1) when given) and keep-nothing; sorted by rejection."""
    scores = np.asarray(scores, dtype=np.float64)
    grid = quantile_grid(scores, points)
    drafter_top1 = float(np.mean(q_top1)) if q_top1 is not None else float(cand.is_gold[:, 0].mean())
    pts = [(0.0, float(cand.q_gold.mean()), 0.0, drafter_top1, np.inf)]  # alpha = +inf keeps every token
    pts += [(*token_point(scores <= t, cand), t) for t in (-np.inf, *grid)]
    pts.sort(key=lambda pt: (pt[0], -pt[4]))
    rej, qual, dfr, top1, thr = (np.array(v) for v in zip(*pts))
    return Curve(rej, qual, dfr, thr, top1)


# ---- every method's curve, for train validation and offline eval alike ---------------------------


def cascade_curve(scores: np.ndarray, cols: dict, q_top1=None, p_top1=None) -> Curve:
    """The sweep of a cascade-form score over record columns (tv, q_token, p_token)."""
    return curve(scores, cols["tv"], cols["q_token"], cols["p_token"], q_top1, p_top1)


def rule_curve(name: str, cols: dict, cand: Candidates, q_top1=None, p_top1=None) -> Curve:
    """A registered rule's offline curve from its own offline score (router.rules)."""
    rule = get_rule(name)
    scores = rule.offline_score(cols, cand)
    if rule.form == "token":
        return token_curve(scores, cand, q_top1=q_top1)
    return cascade_curve(scores, cols, q_top1, p_top1)


def rule_curves(cols: dict, cand: Candidates, q_top1=None, p_top1=None) -> dict[str, Curve]:
    """Every rule with an offline score, by name."""
    return {name: rule_curve(name, cols, cand, q_top1, p_top1) for name in offline_rules()}


def oracle_curve(cols: dict, q_top1=None, p_top1=None) -> Curve:
    """The cascade oracle: the 1 of normalised areas."""
    return cascade_curve(oracle_scores(cols), cols, q_top1, p_top1)


def router_curve(scores: np.ndarray, cols: dict, cand: Candidates, q_top1=None, p_top1=None) -> Curve:
    """A learned router's curve: token form for (N, K) candidate scores, cascade form for (N,) gaps."""
    scores = np.asarray(scores)
    if scores.ndim == 2:
        return token_curve(scores, cand, q_top1=q_top1)
    return cascade_curve(learned_defer_scores(scores, cols["tv"]), cols, q_top1, p_top1)
