"""Out-of-fold summaries (eval/crossfit.py computes the per-example sums): per target rejection rate and
method, each measure with paired bootstrap intervals over examples against two rules:

- the per-fold best rule, chosen on each fold's inner validation examples (the fair comparison: no method
  is chosen on the examples it is scored on);
- the best rule in hindsight, the one fixed rule with the best measure over all scored examples. It is
  chosen on the scored examples, so it favours the rule: a router that beats it beats every rule, however
  the rule is chosen. Where the per-fold choice is noisy (48 validation examples may pick a rule that is not
  the strongest), this is the comparison that cannot be won by a weak choice.
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP = 2000
HIGHER_IS_BETTER = ("quality", "harmless", "signed")  # the other measures are kept shares of bad mismatches
COMBINED = ("best_rule", "best_router")  # methods that are a choice among others, not one rule
ORACLE = "oracle_signed"  # the signed labels' oracle (eval.crossfit.oracle_scores): a reference row
REFERENCES = (ORACLE,)  # rows that read the labels they are scored on: never a rule to choose


def weighted_share(sums: dict, what: str, weights: np.ndarray) -> np.ndarray:
    """(R,) ratio of sums under example weights (R, E): quality per position, or a kept share."""
    num, den = ("quality", "positions") if what == "quality" else (f"{what}_kept", what)
    return (weights @ sums[num]) / np.maximum(weights @ sums[den], 1e-12)


def result_measures(result: dict) -> tuple[str, ...]:
    """The measures of an out-of-fold result or summary (older ones: by their mode)."""
    if "measures" in result:
        return tuple(result["measures"])
    return ("important", "harmless") if result["mode"] == "consequence" else ("quality",)


def hindsight_rule(table: dict, routers: list[str], measure: str) -> str:
    """The fixed rule with the best `measure` over every scored example (kept shares: lowest; quality:
    highest); the first of equals in the table's (registry) order."""
    ones = np.ones((1, len(table["best_rule"]["positions"])))
    rules = [m for m in table if m not in routers and m not in COMBINED and m not in REFERENCES]
    sign = 1.0 if measure in HIGHER_IS_BETTER else -1.0
    return max(rules, key=lambda m: sign * float(weighted_share(table[m], measure, ones)[0]))


def _paired(sums: dict, other: dict, m: str, weights: np.ndarray, ones: np.ndarray) -> dict:
    """A measure of one method minus another's on the same examples: point and 95% percentile interval."""
    diff = weighted_share(sums, m, weights) - weighted_share(other, m, weights)
    lo, hi = np.percentile(diff, [2.5, 97.5])
    return {
        "diff": float(weighted_share(sums, m, ones)[0] - weighted_share(other, m, ones)[0]),
        "low": float(lo),
        "high": float(hi),
    }


def summarise(result: dict, seed: int = 0, reps: int = BOOTSTRAP) -> dict:
    """Per target and method: rejection rate, the measures, and the paired bootstrap intervals of the
    method minus the per-fold best rule (`<m>_vs_best_rule`) and minus the best rule in hindsight
    (`<m>_vs_hindsight_rule`, named per target as `hindsight_rule`), over examples (the same resampled
    examples for every method)."""
    measures = result_measures(result)
    chooser = result.get("chosen_by", measures[0])  # what the best rules (per fold, in hindsight) are chosen by
    routers = result.get("routers", [result["router"]])
    rng = np.random.default_rng(seed)
    out = {
        "router": result["router"],
        "routers": routers,
        "mode": result["mode"],
        "measures": list(measures),
        "chosen_by": chooser,
        "k": result["k"],
        "tested_only": result.get("tested_only", False),
        "matched": result.get("matched", False),
        "targets": {},
    }
    for t, table in result["sums"].items():
        n = len(table["best_rule"]["positions"])
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=reps).astype(np.float64)  # (R, E)
        ones = np.ones((1, n))
        hindsight = hindsight_rule(table, routers, chooser)
        rows = {}
        for method, sums in table.items():
            row = {"rejection": float(sums["rejections"].sum() / max(sums["positions"].sum(), 1)), "examples": n}
            for m in measures:
                row[m] = float(weighted_share(sums, m, ones)[0])
                row[f"{m}_vs_best_rule"] = _paired(sums, table["best_rule"], m, weights, ones)
                row[f"{m}_vs_hindsight_rule"] = _paired(sums, table[hindsight], m, weights, ones)
            rows[method] = row
        block = {"methods": rows, "best_rule_per_fold": result["best_rule_per_fold"][t], "hindsight_rule": hindsight}
        if "best_router_per_fold" in result:
            block["best_router_per_fold"] = result["best_router_per_fold"][t]
        out["targets"][str(t)] = block
    return out
