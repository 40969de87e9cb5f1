"""Validation metrics of a router's predictions against its records.

- auc: ROC-AUC of the prediction against the oracle decision (gap > 0); token-head candidates are
  weighted by q(v), how often each is drafted;
- calibration: mean |mean predicted gap - mean true gap| over 10 equal-count bins (regression
  losses; for the cost-sensitive loss the prediction is a logit and this is reported as NaN);
- area: normalised area of the offline trade-off curve (router/tradeoff.py: 0 = drafter,
  1 = the cascade oracle), next to the same area for every plug-in rule, cascade form
  (chow diff opt) and token form (token_v1 token_v2 token_v3), and the best of them. Token-form
  methods may exceed 1: they choose per drafted token, which the cascade oracle cannot.
"""

from __future__ import annotations

import numpy as np

from router.tradeoff import TOKEN_METHODS, Curve, curve, defer_scores, normalised_area, token_curve, token_scores

CASCADE_PLUGINS = ("chow", "diff", "opt")
PLUGINS = CASCADE_PLUGINS + TOKEN_METHODS


def _cascade(aux: dict, method: str, learned=None) -> Curve:
    scores = defer_scores(method, aux["q_max"], aux["p_max"], aux["tv"], aux["q_token"], aux["p_token"], learned)
    return curve(scores, aux["tv"], aux["q_token"], aux["p_token"])


def _router_curve(aux: dict, learned: np.ndarray) -> Curve:
    """A router's curve: token form for (N, K) candidate scores, cascade form for (N,) gaps."""
    learned = np.asarray(learned)
    return token_curve(learned, aux["cand"]) if learned.ndim == 2 else _cascade(aux, "learned", learned)


def _curves(aux: dict, learned: np.ndarray | None = None) -> dict:
    out = {"oracle": _cascade(aux, "oracle")}
    for name in CASCADE_PLUGINS:
        out[name] = _cascade(aux, name)
    for name in TOKEN_METHODS:
        out[name] = token_curve(token_scores(name, aux["cand"]), aux["cand"])
    if learned is not None:
        out["router"] = _router_curve(aux, learned)
    return out


def plugin_areas(aux: dict) -> dict:
    curves = _curves(aux)
    areas = {name: normalised_area(curves[name], curves["oracle"]) for name in PLUGINS}
    return {**areas, "best_plugin": max(areas.values())}


def router_metrics(pred: np.ndarray, gap: np.ndarray, aux: dict, regression: bool) -> dict:
    """AUC, calibration and area of predictions (N,) (cascade) or (N, K) (token head)."""
    from sklearn.metrics import roc_auc_score

    weight = aux["cand"].q.reshape(-1) if np.ndim(pred) == 2 else None
    flat_pred, flat_gap = np.asarray(pred).reshape(-1), np.asarray(gap).reshape(-1)
    oracle_label = flat_gap > 0
    auc = float(roc_auc_score(oracle_label, flat_pred, sample_weight=weight)) \
        if 0 < oracle_label.sum() < len(flat_gap) else float("nan")
    # only the router's and the oracle's curves: this runs every validation epoch, and the plug-in
    # rules' curves (constant across epochs) were 85% of its time
    area = normalised_area(_router_curve(aux, pred), _cascade(aux, "oracle"))
    return {"auc": auc, "calibration": calibration_error(flat_pred, flat_gap) if regression else float("nan"),
            "area": area}


def calibration_error(pred: np.ndarray, gap: np.ndarray, bins: int = 10) -> float:
    order = np.argsort(pred)
    groups = np.array_split(order, bins)
    return float(np.mean([abs(pred[g].mean() - gap[g].mean()) for g in groups if len(g)]))


def tradeoff_table(pred: np.ndarray, aux: dict) -> list[dict]:
    """Curve points of the router and the plug-in rules, for CSV / W&B tables and plots."""
    rows = []
    for name, c in _curves(aux, pred).items():
        step = max(1, len(c.rejection) // 200)
        rows += [{"method": name, "rejection": float(r), "quality": float(q)}
                 for r, q in zip(c.rejection[::step], c.quality[::step])]
    return rows
