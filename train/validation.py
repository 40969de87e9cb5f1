"""Validation metrics of a router's predictions against its records.

- auc: ROC-AUC of the prediction against the oracle decision (gap > 0); token-head candidates are
  weighted by q(v), how often each is drafted;
- calibration: mean |mean predicted gap - mean true gap| over 10 equal-count bins (regression
  losses; for the cost-sensitive loss the prediction is a logit and this is reported as NaN);
- area: normalised area of the offline trade-off curve (router/offline/tradeoff.py: 0 = drafter,
  1 = the cascade oracle), next to the same area for every registered plug-in rule with an
  offline score (router.rules.offline_rules: cascade and token form), and the best of them.
  Token-form methods may exceed 1: they choose per drafted token, which the cascade oracle cannot.
"""

from __future__ import annotations

import numpy as np

from router.offline.inputs import RecordView
from router.offline.tradeoff import normalised_area, oracle_curve, router_curve, rule_curves
from router.offline.views import greedy_sweeps


def _curves(view: RecordView, learned: np.ndarray | None = None, judge: bool = False) -> dict:
    """Offline curves of the rules (and the router's predictions): a judge in the greedy view, where
    it decides, next to the rules in that view; other routers next to them at temperature 1."""
    if judge:
        return {name: s.curve() for name, s in greedy_sweeps(view, learned, "judge").items()}
    out = {"oracle": oracle_curve(view.cols), **rule_curves(view.cols, view.cand)}
    if learned is not None:
        out["router"] = router_curve(learned, view.cols, view.cand)
    return out


def _is_judge(view: RecordView) -> bool:
    """Rows labelled for a judge head (train.data.RecordSplit) are compared in the greedy view."""
    return view.head == "judge"


def plugin_areas(view: RecordView) -> dict:
    """Normalised area of every rule with an offline score, and the best of them (greedy view for a judge)."""
    curves = _curves(view, judge=_is_judge(view))
    areas = {name: normalised_area(c, curves["oracle"]) for name, c in curves.items() if name != "oracle"}
    return {**areas, "best_plugin": max(areas.values())}


def router_metrics(pred: np.ndarray, gap: np.ndarray, view: RecordView, regression: bool) -> dict:
    """AUC, calibration and area of predictions (N,) (cascade, judge) or (N, K) (token head); a
    judge's area is its greedy view's (router.offline.views)."""
    from sklearn.metrics import roc_auc_score

    weight = view.cand.q.reshape(-1) if np.ndim(pred) == 2 else None
    flat_pred, flat_gap = np.asarray(pred).reshape(-1), np.asarray(gap).reshape(-1)
    oracle_label = flat_gap > 0
    auc = (
        float(roc_auc_score(oracle_label, flat_pred, sample_weight=weight))
        if 0 < oracle_label.sum() < len(flat_gap)
        else float("nan")
    )
    # only the router's and the oracle's curves: this runs every validation epoch, and the plug-in
    # rules' curves (constant across epochs) were 85% of its time
    if _is_judge(view):
        sweeps = greedy_sweeps(view, pred, "judge", rules=False)
        area = normalised_area(sweeps["router"].curve(), sweeps["oracle"].curve())
    else:
        area = normalised_area(router_curve(pred, view.cols, view.cand), oracle_curve(view.cols))
    return {
        "auc": auc,
        "calibration": calibration_error(flat_pred, flat_gap) if regression else float("nan"),
        "area": area,
    }


def calibration_error(pred: np.ndarray, gap: np.ndarray, bins: int = 10) -> float:
    order = np.argsort(pred)
    groups = np.array_split(order, bins)
    return float(np.mean([abs(pred[g].mean() - gap[g].mean()) for g in groups if len(g)]))


def tradeoff_table(pred: np.ndarray, view: RecordView) -> list[dict]:
    """Curve points of the router and the plug-in rules, for CSV / W&B tables and plots."""
    rows = []
    for name, c in _curves(view, pred, _is_judge(view)).items():
        step = max(1, len(c.rejection) // 200)
        rows += [
            {"method": name, "rejection": float(r), "quality": float(q)}
            for r, q in zip(c.rejection[::step], c.quality[::step])
        ]
    return rows
