"""The window (or lag) judge against the plain judge, out of fold on every labelled example.

Trains two cross-fitted judges (`cross_fit: K`, the same fold plan: same records and seed) on gold
records with window inputs (configs/gen/gsm8k-window.yaml), one reading the next `follow` drafts of the
block and/or the features of the `lag` positions before the drafted one (router/window/lag.py), one
reading neither, then scores both out of fold in the greedy view (eval/crossfit.py): at each target
rejection rate (fractions of the verifier's own), the share of emitted tokens equal to the gold one,
each router minus the per-fold best rule, and the richer judge minus the plain judge, paired over the
same resampled examples (95% percentile bootstrap over examples).

    python studies/window_crossfit.py --records runs/records/gsm8k-window [--k 5] [--follow 6] [--lag 0]
        [--hidden after] [--out runs/judge/window-crossfit]
    python studies/window_crossfit.py --records runs/records/gsm8k-window --follow 0 --lag 2 \
        --out runs/judge/lag-crossfit

Writes crossfit.json and crossfit.csv into --out and prints the table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eval.crossfit import BOOTSTRAP, TARGETS, _share, out_of_fold, summarise  # noqa: E402
from router.infra.files import write_csv, write_json  # noqa: E402
from router.machine.hardware import cpu_kind  # noqa: E402
from router.offline.folds import read_plan  # noqa: E402
from train.run import TrainConfig, run_train  # noqa: E402


def train(records: list[str], out: Path, k: int, follow: int, lag: int, hidden: list[str], epochs: int) -> float:
    """Fit the K fold routers of one judge into `out` (seconds)."""
    started = time.perf_counter()
    cfg = TrainConfig(
        records=records, head="judge", target="greedy_01_gap", hidden_inputs=hidden, follow=follow, lag=lag,
        cross_fit=k, max_epochs=epochs, patience=4, baselines=False, output=str(out),
    )  # fmt: skip
    run_train(cfg)
    return time.perf_counter() - started


def paired(first: dict, second: dict, reps: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Per target: quality of `first`'s router minus `second`'s on the same examples, paired bootstrap."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in first["sums"]:
        a, b = first["sums"][t][first["router"]], second["sums"][t][second["router"]]
        n = len(a["positions"])
        if n != len(b["positions"]) or not np.array_equal(a["positions"], b["positions"]):
            raise ValueError("the two cross-fits scored different examples: train them on the same records and seed")
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=reps).astype(np.float64)
        ones = np.ones((1, n))
        diff = _share(a, "quality", weights) - _share(b, "quality", weights)
        point = float(_share(a, "quality", ones)[0] - _share(b, "quality", ones)[0])
        lo, hi = np.percentile(diff, [2.5, 97.5])
        out[str(t)] = {"diff": point, "low": float(lo), "high": float(hi), "examples": n}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", nargs="+", required=True, help="gold record folders with window inputs")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--follow", type=int, default=6, help="following drafts the richer judge reads")
    parser.add_argument("--lag", type=int, default=0, help="positions before the draft the richer judge reads")
    parser.add_argument("--hidden", nargs="*", default=["after"], help="hidden inputs of both judges")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", default="runs/judge/window-crossfit")
    args = parser.parse_args()
    if not args.follow and not args.lag:
        raise SystemExit("give the richer judge --follow and/or --lag > 0")
    out = Path(args.out)
    rich = "judge" + ("-window" if args.follow else "") + ("-lag" if args.lag else "")
    folders = {rich: out / rich, "judge": out / "judge"}
    seconds = {
        name: train(
            args.records, folder, args.k, args.follow if name == rich else 0, args.lag if name == rich else 0,
            args.hidden, args.epochs,
        )
        for name, folder in folders.items()
    }  # fmt: skip
    if read_plan(folders[rich])["folds"] != read_plan(folders["judge"])["folds"]:
        raise SystemExit("the two cross-fits have different fold plans")
    results = {name: out_of_fold(folder, args.records) for name, folder in folders.items()}
    summaries = {name: summarise(r) for name, r in results.items()}
    difference = paired(results[rich], results["judge"])
    versus = f"{rich} - judge"
    rows = []
    for t in map(str, TARGETS):
        for name, s in summaries.items():
            m = s["targets"][t]["methods"]
            v = m[name]["quality_vs_best_rule"]
            rows.append(dict(target=t, method=name, quality=m[name]["quality"], best_rule=m["best_rule"]["quality"],
                             vs_best_rule=v["diff"], low=v["low"], high=v["high"]))  # fmt: skip
        d = difference[t]
        rows.append(dict(target=t, method=versus, quality=float("nan"), best_rule=float("nan"),
                         vs_best_rule=d["diff"], low=d["low"], high=d["high"]))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    result = dict(records=args.records, cpu=cpu_kind(), k=args.k, follow=args.follow, lag=args.lag,
                  hidden=args.hidden, train_seconds=seconds, summaries=summaries, richer=rich,
                  richer_minus_judge=difference)  # fmt: skip
    write_json(out / "crossfit.json", result)
    write_csv(out / "crossfit.csv", list(rows[0]), rows)
    print(f"\nout of fold, greedy view, {difference[str(TARGETS[0])]['examples']} examples, K = {args.k}; quality = "
          f"share of emitted tokens equal to gold; differences with 95% paired bootstrap intervals over examples")  # fmt: skip
    print(f"{'rejection target':<18}{'method':<24}{'quality':>9}{'diff':>9}{'95% interval':>22}")
    for r in rows:
        interval = f"[{r['low']:+.4f}, {r['high']:+.4f}]"
        pairing = "vs best rule" if r["method"] != versus else "paired"
        print(
            f"{r['target']:<18}{r['method']:<24}{r['quality']:>9.4f}{r['vs_best_rule']:>+9.4f}{interval:>22} {pairing}"
        )
    print(f"\nresults: {out / 'crossfit.json'}, {out / 'crossfit.csv'}")


if __name__ == "__main__":
    main()
