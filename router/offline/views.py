"""Every method scored where the loop decides, in two views, with intervals over examples.

Greedy view (temperature 0). At each position the drafter drafts its argmax d; a method keeps d or
takes the verifier's argmax. Quality: the emitted token is the gold one. A rejection: the method
defers and d differs from the verifier's argmax. Every method is then a defer score per position,
"defer iff score > alpha": cascade rules and cascade-head routers their offline score, token-form
rules and token-head routers the score of d (candidate 0 of the recorded top-k), a judge its
predicted gap for d, the oracle its gain per rejection.

Temperature-1 view. Quality: the probability that the emitted token is gold; rejection rate: the
probability that it is not the draft. Plug-in rules, cascade and token routers and the oracle are
exact (router.offline.tradeoff). A judge's target depends on the draft, so it is scored by Monte Carlo
over the recorded sample s ~ q at each position, as the loop runs it: keep s (quality [s = y], no
rejection) or verify s losslessly (accept with min(1, p(s)/q(s)), else draw from
norm(max(0, p - q))). The estimate is unbiased for the loop's expected quality and rejection.

Comparison. The area of a method's frontier above the drafter over the oracle's rejection range
(router.offline.tradeoff.area), and the share of the gap it closes,
    (area_method - area_best_rule) / (area_oracle - area_best_rule),
where the best rule is chosen on validation. Intervals: percentile bootstrap over *examples*
(the positions of one example move together): each sweep is kept as per-example sums at a fixed
grid of thresholds, so a replicate is one weighted sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from router.inputs import greedy_view_only
from router.offline.inputs import RecordView, router_scores
from router.rules import get_rule, offline_rules, window_offline_rules
from router.targets import ratio_score
from router.offline.tradeoff import Curve, area, learned_defer_scores, oracle_scores, quantile_grid, token_rows

VIEWS = ("greedy", "t1")
VIEW_TITLES = {"greedy": "greedy view (emitted token = gold)", "t1": "temperature-1 view (expected gold probability)"}
GRID = 256  # thresholds per cascade-form sweep (quantiles of the scores)


@dataclass
class Sweep:
    """A method's threshold sweep as per-example sums: point g of example e."""

    rejection: np.ndarray  # (G, E) summed rejection (probability) over the example's positions
    quality: np.ndarray  # (G, E) summed quality
    rows: np.ndarray  # (E,) positions per example
    threshold: np.ndarray  # (G,) the alpha of each point (+inf first: nothing deferred)

    def curves(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rejection, quality) means (R, G) for example weights (R, E), e.g. bootstrap counts."""
        n = weights @ self.rows  # (R,)
        return (weights @ self.rejection.T) / n[:, None], (weights @ self.quality.T) / n[:, None]

    def curve(self) -> Curve:
        rej, qual = self.curves(np.ones((1, len(self.rows))))
        return Curve(rej[0], qual[0], np.zeros(len(rej[0])), self.threshold)


def example_index(view: RecordView) -> tuple[np.ndarray, int]:
    """(N,) example number of each row, and the number of examples (trajectories)."""
    _, index = np.unique(view.traj, return_inverse=True)
    return index, int(index.max()) + 1


def _by_example(per_row: np.ndarray, index: np.ndarray, n_examples: int) -> np.ndarray:
    """(G, N) per-row values -> (G, E) per-example sums."""
    out = np.zeros((per_row.shape[0], n_examples))
    for g in range(per_row.shape[0]):
        out[g] = np.bincount(index, weights=per_row[g], minlength=n_examples)
    return out


def cascade_sweep(scores, cost, q_val, p_val, index, n_examples, grid: int = GRID) -> Sweep:
    """'defer iff score > t' over a grid of t: per row, rejection cost*defer and quality q or p."""
    scores = np.asarray(scores, np.float64)
    cost, q_val, p_val = (np.asarray(x, np.float64) for x in (cost, q_val, p_val))
    thresholds = np.r_[np.inf, quantile_grid(scores, grid)[::-1], -np.inf]
    defer = scores[None] > thresholds[:, None]  # (G, N)
    rej = _by_example(defer * cost, index, n_examples)
    qual = _by_example(q_val + defer * (p_val - q_val), index, n_examples)
    return Sweep(rej, qual, np.bincount(index, minlength=n_examples).astype(np.float64), thresholds)


def token_sweep(scores, cand, index, n_examples, points: int = 128) -> Sweep:
    """'keep v iff score(v) <= t' (token form, temperature-1 view, exact), after the drafter itself
    (alpha = +inf keeps every token, the tail of q outside the candidates included)."""
    scores = np.asarray(scores, np.float64)
    grid = np.r_[quantile_grid(scores, points)[::-1], -np.inf]
    rows = [(np.zeros(len(scores)), np.asarray(cand.q_gold, np.float64))]  # the drafter: no rejection, q(y)
    rows += [token_rows(scores <= t, cand)[:2] for t in grid]
    rej = _by_example(np.stack([r for r, _ in rows]), index, n_examples)
    qual = _by_example(np.stack([q for _, q in rows]), index, n_examples)
    return Sweep(rej, qual, np.bincount(index, minlength=n_examples).astype(np.float64), np.r_[np.inf, grid])


# ---- what each view needs of the records ----------------------------------------------------------


def greedy_columns(view: RecordView) -> dict:
    """Greedy view per row: cost of deferring (d differs from the verifier's argmax) and the
    quality of keeping d / of taking the verifier's argmax."""
    c = view.cols
    return {"cost": (c["q_argmax"] != c["p_argmax"]).astype(np.float64), "q_val": view.q_top1, "p_val": view.p_top1}


def sampled_columns(view: RecordView) -> dict:
    """Temperature-1 view of a judge per row, for the recorded sample s: rejection probability
    when s is verified losslessly, and the quality of keeping s / of verifying it."""
    j, c = view.judge_columns(), view.cols
    s_is_gold = (j["draft_token"] == c["token"]).astype(np.float64)
    accept = np.minimum(1.0, np.asarray(j["p_draft"], np.float64) / np.maximum(j["q_draft"], 1e-30))
    tv = np.asarray(c["tv"], np.float64)
    residual_gold = np.where(tv > 1e-12, np.maximum(0.0, c["p_token"] - c["q_token"]) / np.maximum(tv, 1e-12), 0.0)
    return {"cost": 1.0 - accept, "q_val": s_is_gold, "p_val": s_is_gold * accept + (1.0 - accept) * residual_gold}


def _greedy_sweeper(view: RecordView):
    """score (N,) -> its greedy-view Sweep on this view."""
    g, (index, n_ex) = greedy_columns(view), example_index(view)
    return lambda score: cascade_sweep(score, g["cost"], g["q_val"], g["p_val"], index, n_ex)


def greedy_rule_scores(view: RecordView) -> dict[str, np.ndarray]:
    """Greedy-view defer scores (N,) of every rule with an offline score, window rules included where
    the records hold windows wide enough for them (data_gen/window.py)."""
    out = {}
    for name in offline_rules():
        score = get_rule(name).offline_score(view.cols, view.cand)
        out[name] = score[:, 0] if np.ndim(score) == 2 else score
    for name in window_offline_rules():
        width = get_rule(name).needs.follow
        if view.has_windows(width):
            out[name] = get_rule(name).offline_score(view.follow_windows(np.arange(len(view)), width))
    return out


def greedy_sweeps(
    view: RecordView, predictions: np.ndarray | None = None, head: str = "cascade", rules: bool = True
) -> dict[str, Sweep]:
    """Greedy-view sweeps of the oracle, every rule with an offline score (unless rules=False: a
    training epoch needs only the router's and the oracle's) and, given a router's predictions on
    the view, that router ("router")."""
    sweep, g = _greedy_sweeper(view), greedy_columns(view)
    out = {"oracle": sweep(ratio_score(g["p_val"] - g["q_val"], g["cost"]))}
    if rules:
        out.update({name: sweep(score) for name, score in greedy_rule_scores(view).items()})
    if predictions is not None:
        out["router"] = sweep(greedy_score(predictions, head, view.cols["tv"]))
    return out


def method_sweeps(view: RecordView, routers: dict, views=VIEWS) -> dict[str, dict[str, Sweep]]:
    """{view: {method: Sweep}} for the oracle, every rule with an offline score and every router."""
    index, n_ex = example_index(view)
    c, cand = view.cols, view.cand
    out = {}
    if "greedy" in views:
        greedy, sweep = greedy_sweeps(view), _greedy_sweeper(view)
        for name, router in routers.items():
            greedy[name] = sweep(_greedy_router_score(router, view, name))
        out["greedy"] = greedy
    if "t1" in views:
        sweep = lambda score: cascade_sweep(score, c["tv"], c["q_token"], c["p_token"], index, n_ex)  # noqa: E731
        t1 = {"oracle": sweep(oracle_scores(c))}
        for name in offline_rules():
            rule = get_rule(name)
            score = rule.offline_score(c, cand)
            t1[name] = token_sweep(score, cand, index, n_ex) if rule.form == "token" else sweep(score)
        for name, router in routers.items():
            if not greedy_view_only(router.cfg):  # e.g. a window judge's windows: recorded for the argmax only
                t1[name] = _t1_router_sweep(router, view, name, index, n_ex)
        out["t1"] = t1
    return out


def _greedy_router_score(router, view: RecordView, name: str) -> np.ndarray:
    return greedy_score(router_scores(router, view, name=name), router.cfg.head, view.cols["tv"])


def greedy_score(predictions: np.ndarray, head: str, tv: np.ndarray) -> np.ndarray:
    """A router's greedy-view defer score for the drafter's argmax d from its predictions on a view."""
    if head == "judge":
        return predictions  # its predicted gap of keeping d
    if np.ndim(predictions) == 2:
        return predictions[:, 0]  # token head: the score of d, candidate 0
    return learned_defer_scores(predictions, tv)


def greedy_areas(view: RecordView, predictions: np.ndarray | None = None, head: str = "cascade") -> dict:
    """Normalised greedy-view areas (oracle 1, drafter 0) of every rule and, given its predictions on
    the view, a router ("router"): what the demo chooses online methods by (it decodes greedily)."""
    point = areas(greedy_sweeps(view, predictions, head))
    return {name: a / point["oracle"] if point["oracle"] > 0 else 0.0 for name, a in point.items() if name != "oracle"}


def _t1_router_sweep(router, view: RecordView, name: str, index, n_ex) -> Sweep:
    c = view.cols
    if router.cfg.head == "judge":
        s = sampled_columns(view)
        return cascade_sweep(
            router_scores(router, view, name=name, drafted="sample"), s["cost"], s["q_val"], s["p_val"], index, n_ex
        )
    scores = router_scores(router, view, name=name)
    if scores.ndim == 2:
        return token_sweep(scores, view.cand, index, n_ex)
    return cascade_sweep(learned_defer_scores(scores, c["tv"]), c["tv"], c["q_token"], c["p_token"], index, n_ex)


# ---- areas, gap closed and bootstrap intervals ------------------------------------------------------


def _areas(sweep: Sweep, weights: np.ndarray, span: float) -> np.ndarray:
    rej, qual = sweep.curves(weights)
    return np.array([area(Curve(r, q, np.zeros(len(r))), span) for r, q in zip(rej, qual)])


def areas(sweeps: dict[str, Sweep]) -> dict[str, float]:
    """Point areas of every method over the oracle's rejection range (for choosing on validation)."""
    ones = np.ones((1, len(sweeps["oracle"].rows)))
    span = float(sweeps["oracle"].curves(ones)[0].max())
    return {name: float(_areas(s, ones, span)[0]) for name, s in sweeps.items()}


def compare(sweeps: dict[str, Sweep], best_rule: str, replicates: int = 1000, seed: int = 0, pairs: tuple = ()) -> dict:
    """Per method: area, normalised area (oracle 1, drafter 0) and the share of the gap between
    `best_rule` and the oracle it closes, each with a 95% percentile bootstrap interval over examples;
    per pair (a, b) of methods both scored: gap closed of a minus b, paired (the same resamples)."""
    n_ex = len(sweeps["oracle"].rows)
    rng = np.random.default_rng(seed)
    weights = np.vstack([np.ones(n_ex), rng.multinomial(n_ex, np.full(n_ex, 1.0 / n_ex), size=replicates)])
    span = float(sweeps["oracle"].curves(weights[:1])[0].max())  # the full sample's, for every replicate
    a = {name: _areas(s, weights, span) for name, s in sweeps.items()}  # (1 + R,) each, row 0 = the sample
    oracle, best = a["oracle"], a[best_rule]
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for name, values in a.items():
            stats = {
                "area": values,
                "normalised_area": values / oracle,
                "gap_closed": (values - best) / (oracle - best),
            }
            out[name] = {k: float(v[0]) for k, v in stats.items()}
            out[name].update({f"{k}_ci": _interval(v[1:]) for k, v in stats.items()})
        paired = {}
        for first, second in (p for p in pairs if p[0] in a and p[1] in a):
            diff = (a[first] - a[second]) / (oracle - best)  # (1 + R,) the difference of their gaps closed
            paired[f"{first} - {second}"] = {"gap_closed": float(diff[0]), "gap_closed_ci": _interval(diff[1:])}
    summary = {"best_rule": best_rule, "examples": n_ex, "replicates": replicates, "span": span, "methods": out}
    return {**summary, "paired": paired} if pairs else summary


def _interval(values: np.ndarray) -> list[float]:
    finite = values[np.isfinite(values)]
    return [float(x) for x in np.quantile(finite, [0.025, 0.975])] if finite.size else [float("nan")] * 2


def best_of(point_areas: dict[str, float], names) -> str:
    """The name with the largest area among `names` (chosen on validation)."""
    return max(names, key=lambda name: point_areas[name])
