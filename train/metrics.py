"""Validation metrics of a router's predictions against its records.

- auc: ROC-AUC of the prediction against the oracle decision (gap > 0);
- calibration: mean |mean predicted gap - mean true gap| over 10 equal-count bins (regression
  losses; for the cost-sensitive loss the prediction is a logit and this is reported as NaN);
- area: normalised area of the offline trade-off curve (router/tradeoff.py: 0 = drafter,
  1 = oracle), next to the same area for each cascade plug-in rule and the best of them.
"""

from __future__ import annotations

import numpy as np

from router.tradeoff import curve, defer_scores, normalised_area

PLUGINS = ("chow", "diff", "opt")


def _curves(aux: dict, learned: np.ndarray | None = None) -> dict:
    args = (aux["tv"], aux["q_token"], aux["p_token"])
    out = {"oracle": curve(defer_scores("oracle", aux["q_max"], aux["p_max"], aux["tv"], aux["q_token"],
                                        aux["p_token"]), *args)}
    for name in PLUGINS:
        out[name] = curve(defer_scores(name, aux["q_max"], aux["p_max"], aux["tv"]), *args)
    if learned is not None:
        out["router"] = curve(defer_scores("learned", aux["q_max"], aux["p_max"], aux["tv"], learned=learned), *args)
    return out


def plugin_areas(aux: dict) -> dict:
    curves = _curves(aux)
    areas = {name: normalised_area(curves[name], curves["oracle"]) for name in PLUGINS}
    return {**areas, "best_plugin": max(areas.values())}


def router_metrics(pred: np.ndarray, gap: np.ndarray, aux: dict, regression: bool) -> dict:
    from sklearn.metrics import roc_auc_score

    oracle_label = gap > 0
    auc = float(roc_auc_score(oracle_label, pred)) if 0 < oracle_label.sum() < len(gap) else float("nan")
    curves = _curves(aux, pred)
    return {"auc": auc, "calibration": calibration_error(pred, gap) if regression else float("nan"),
            "area": normalised_area(curves["router"], curves["oracle"])}


def calibration_error(pred: np.ndarray, gap: np.ndarray, bins: int = 10) -> float:
    order = np.argsort(pred)
    groups = np.array_split(order, bins)
    return float(np.mean([abs(pred[g].mean() - gap[g].mean()) for g in groups if len(g)]))


def tradeoff_table(pred: np.ndarray, aux: dict) -> list[dict]:
    """Curve points of the router and the plug-in rules, for CSV / W&B tables and plots."""
    rows = []
    for name, c in _curves(aux, pred).items():
        rows += [{"method": name, "rejection": float(r), "quality": float(q)} for r, q in
                 zip(c.rejection[:: max(1, len(c.rejection) // 200)], c.quality[:: max(1, len(c.quality) // 200)])]
    return rows
