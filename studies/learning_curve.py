"""Out-of-fold learning curve: how the answer-level measure moves with the number of labelled examples.

    python -m studies.learning_curve --config configs/studies/train/judge-consequence.yaml \
        records=[runs/records/gsm8k-consequence-snap] --shares 0.25 0.5 1.0 --out runs/studies/curve

For each share s, trains the cross-fitted router of the config (cross_fit=K, default 5) with each fold
on the share s of its training examples (`cross_fit_train_share`, nested: a smaller share's examples are
among a larger one's), and scores it out of fold with eval/crossfit.py. The folds, their inner
validation examples (where thresholds and the per-fold best rule are chosen) and the scored examples
are the same at every share, so the points pair up example by example. `--eval-records` scores on
other records than the training ones (e.g. train on short-horizon labels, score on full-answer labels
of the same examples: folds are drawn over the training records' examples).

Writes curve.json, curve.csv and curve.png to --out: per share and target rejection rate, the
router's kept share of important (and harmless) mismatches, the best rule's, and the paired
difference with its bootstrap interval, with rejection rates over all mismatches and (population
`tested`) over the tested mismatches alone, each also at matched rejection rates (`-matched`: every
method's threshold set on the scored examples to the target, eval/crossfit.py). The projection at the end (over the tested mismatches
where the records have them) is a back-of-the-envelope reading, stated as such: a least-squares line of the difference at the middle target against
log(training examples), and the interval's half-width shrinking as 1/sqrt(scored examples), give the
number of labelled examples at which the interval would exclude 0 if both trends held; `projection`
pairs with the per-fold best rule, `projection_hindsight` with the best rule in hindsight.
Each share's fold routers are kept in --out/share-<s>; a rerun reuses the finished ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np


def curve_point(cfg, share: float, out: Path, eval_records: list[str]) -> dict:
    """Train (or keep) one share's cross-fit and summarise it out of fold."""
    from eval.crossfit import populations
    from train.run import run_train

    where = out / f"share-{share:g}"
    run_train(dataclasses.replace(cfg, cross_fit_train_share=share, output=str(where)))
    summaries = populations(where, eval_records)  # "all", and "tested" on consequence rows (eval/crossfit.py)
    return {"share": share, "folder": str(where), "summaries": summaries}


def curve_rows(points: list[dict], router: str) -> list[dict]:
    """One CSV row per share, population (all / tested mismatches), target and measure: the router,
    the best rule and their paired difference."""
    rows = []
    for p in points:
        for population, summary in p["summaries"].items():
            for target, block in summary["targets"].items():
                rows += [
                    _row(
                        p,
                        population,
                        float(target),
                        m,
                        block["methods"][router],
                        block["methods"]["best_rule"],
                        block.get("hindsight_rule", ""),
                    )
                    for m in ("important", "harmless", "horizon", "quality")
                    if m in block["methods"][router]
                ]
    return rows


def _row(point: dict, population: str, target: float, measure: str, mine: dict, best: dict, hindsight: str) -> dict:
    d = mine[f"{measure}_vs_best_rule"]
    h = mine.get(f"{measure}_vs_hindsight_rule", {"diff": float("nan"), "low": float("nan"), "high": float("nan")})
    return {
        "share": point["share"],
        "train_examples": point["train_examples"],
        "population": population,
        "target": target,
        "measure": measure,
        "router": mine[measure],
        "best_rule": best[measure],
        "router_rejection": mine["rejection"],
        "best_rule_rejection": best["rejection"],
        "diff": d["diff"],
        "low": d["low"],
        "high": d["high"],
        "scored_examples": mine["examples"],
        "hindsight_rule": hindsight,
        "diff_hindsight": h["diff"],
        "low_hindsight": h["low"],
        "high_hindsight": h["high"],
    }


def projection(rows: list[dict], target: float, measure: str, population: str, against: str = "") -> dict:
    """Labelled examples at which the interval would exclude 0, if the fitted trend and 1/sqrt(n) held.
    For `important` and `horizon` (kept shares, lower is better) the router must get below the best rule:
    the sign is flipped. `against`: "" pairs with the per-fold best rule, "_hindsight" with the best rule
    in hindsight (the row's diff_hindsight / low_hindsight / high_hindsight)."""
    pts = [r for r in rows if r["target"] == target and r["measure"] == measure and r["population"] == population]
    if len(pts) < 2:
        return {"note": "fewer than two curve points"}
    diff, low, high = (f"{key}{against}" for key in ("diff", "low", "high"))
    if any(math.isnan(r[diff]) for r in pts):
        return {"note": f"no {diff} in the curve's rows"}
    sign = -1.0 if measure in ("important", "horizon") else 1.0  # kept shares: lower is better
    x = np.log([r["train_examples"] for r in pts])
    y = sign * np.array([r[diff] for r in pts])  # > 0: the router is better
    slope, intercept = np.polyfit(x, y, 1)
    last = pts[-1]
    half, n_scored, n_train = (last[high] - last[low]) / 2, last["scored_examples"], last["train_examples"]
    per_scored = (
        n_train / n_scored
    )  # training examples per labelled example at share 1 (K-fold: (K-1)/K minus validation)
    for n in np.unique(np.round(np.geomspace(n_scored, 100_000, 400))):
        gain = slope * math.log(n * per_scored) + intercept
        if gain > half * math.sqrt(n_scored / n):
            return {"slope_per_log_example": float(slope), "examples_needed": int(n), "half_width_now": half}
    return {
        "slope_per_log_example": float(slope),
        "examples_needed": None,
        "half_width_now": half,
        "note": "the fitted trend does not reach the interval below 100,000 labelled examples",
    }


def plot(rows: list[dict], path: Path, router: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fair = fair_population(rows)
    rows = [r for r in rows if r["population"] == fair]
    measures = sorted({r["measure"] for r in rows})
    fig, axes = plt.subplots(1, len(measures), figsize=(5 * len(measures), 3.6), squeeze=False)
    for ax, m in zip(axes[0], measures):
        for target in sorted({r["target"] for r in rows}):
            pts = [r for r in rows if r["measure"] == m and r["target"] == target]
            x = [r["train_examples"] for r in pts]
            ax.errorbar(
                x,
                [r["diff"] for r in pts],
                yerr=[[r["diff"] - r["low"] for r in pts], [r["high"] - r["diff"] for r in pts]],
                marker="o",
                capsize=3,
                label=f"{target:g} x verifier's rejections",
            )
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("training examples per fold")
        ax.set_ylabel(f"{m} kept: {router} - best rule ({fair})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fair_population(rows: list[dict]) -> str:
    """The population the projection and the plot read: the tested mismatches alone where the records have
    them, at matched rejection rates where measured (eval/crossfit.py says why both matter)."""
    present = {r["population"] for r in rows}
    return next(p for p in ("tested-matched", "tested", "all-matched", "all") if p in present)


def main(argv: list[str] | None = None) -> int:
    from router.infra.config import load_config
    from router.infra.files import write_csv, write_json
    from router.offline.folds import read_plan, train_share
    from train.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a train config (its records, head, target)")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    parser.add_argument(
        "--eval-records", nargs="*", default=None, help="score on these (default: the training records)"
    )
    parser.add_argument("--out", default="runs/studies/curve")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the train config")
    args = parser.parse_args(argv)
    cfg = load_config(TrainConfig, args.config, args.overrides)
    cfg = dataclasses.replace(cfg, cross_fit=cfg.cross_fit or 5, baselines=False)
    out = Path(args.out)
    points = []
    for share in sorted(args.shares):
        p = curve_point(cfg, share, out, args.eval_records or list(cfg.records))
        plan = read_plan(p["folder"])["folds"]
        p["train_examples"] = float(np.mean([len(train_share(f["train"], share, cfg.cross_fit_seed)) for f in plan]))
        points.append(p)
    rows = []
    for p in points:  # every point's router is named after its folder: read each under its own name
        rows += curve_rows([p], Path(p["folder"]).name)
    middle = sorted({r["target"] for r in rows})[len({r["target"] for r in rows}) // 2]
    present = {r["measure"] for r in rows}
    measure = next(m for m in ("important", "horizon", "quality") if m in present)  # the choosing measure
    population = fair_population(rows)
    result = {
        "config": args.config,
        "overrides": args.overrides,
        "records": list(cfg.records),
        "eval_records": args.eval_records or list(cfg.records),
        "k": cfg.cross_fit,
        "points": points,
        # the same arithmetic against the per-fold best rule and the one rule best on the scored examples
        **{
            name: {
                "target": middle,
                "measure": measure,
                "population": population,
                **projection(rows, middle, measure, population, against),
            }
            for name, against in (("projection", ""), ("projection_hindsight", "_hindsight"))
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "curve.json", result)
    write_csv(out / "curve.csv", list(rows[0]), rows)
    plot(rows, out / "curve.png", "router")
    for r in rows:
        if r["target"] == middle:
            print(
                f"  {r['train_examples']:7.1f} training examples/fold, {r['population']}: {r['measure']} kept router "
                f"{r['router']:.4f} (rejection {r['router_rejection']:.4f}), best rule {r['best_rule']:.4f} (rejection "
                f"{r['best_rule_rejection']:.4f}), diff {r['diff']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}]; vs "
                f"{r['hindsight_rule']} (best rule in hindsight) {r['diff_hindsight']:+.4f} [{r['low_hindsight']:+.4f}, "
                f"{r['high_hindsight']:+.4f}] ({r['scored_examples']} examples scored)"
            )
    print(f"  projection at {middle:g} vs the per-fold best rule: {result['projection']}")
    print(f"  projection at {middle:g} vs the best rule in hindsight: {result['projection_hindsight']}")
    print(f"  {out}/curve.json, curve.csv, curve.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
