"""The window (or lag) judge against the plain judge, out of fold on every labelled example.

Trains two cross-fitted judges (`cross_fit: K`, the same fold plan: same records and seed) on gold
records with window inputs (configs/studies/gen/gsm8k-window.yaml), one reading the next `follow` drafts of the
block and/or the features of the `lag` positions before the drafted one (router/window/lag.py), one
reading neither, then scores both out of fold in the greedy view (eval/crossfit.py): at each target
rejection rate (fractions of the verifier's own), the share of emitted tokens equal to the gold one,
each router minus the per-fold best rule, and the richer judge minus the plain judge, paired over the
same resampled examples (95% percentile bootstrap over examples).

    python -m studies.window_crossfit --records runs/records/gsm8k-window [--k 5] [--follow 6] [--lag 0]
        [--hidden after] [--out runs/judge/window-crossfit]
    python -m studies.window_crossfit --records runs/records/gsm8k-window --follow 0 --lag 2 \
        --out runs/judge/lag-crossfit
    python -m studies.window_crossfit --records runs/records/mbpp-window --follow-block 5 \
        --out runs/judge/window-crossfit-cut5    # the window judge as it decodes at gamma 5 (cut windows)

With `--labels consequence` (record folders with consequence rows and window inputs, e.g.
configs/studies/gen/gsm8k-consequence.yaml) both judges learn the answer-level label instead (mode
consequence, target consequence) and are scored on the answer-level measure over the tested
mismatches at matched rejection rates (eval/crossfit.py): the share of IMPORTANT mismatches kept (lower
is better) and of HARMLESS ones kept (higher is better), paired the same way; window rules such as
`fly` are among the rules the per-fold best rule is chosen from where the windows are wide enough.

    python -m studies.window_crossfit --labels consequence --records runs/records/gsm8k-consequence-150 \
        --out runs/judge/window-crossfit-consequence

Writes crossfit.json and crossfit.csv into --out and prints the table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from eval.crossfit import TARGETS, out_of_fold
from eval.crossfit_summary import BOOTSTRAP, summarise, weighted_share
from router.infra.files import write_csv, write_json
from router.machine.hardware import cpu_kind
from router.offline.folds import read_plan
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train


LABELS = {  # what the judges learn, and the measures they are scored on (higher first is better?)
    "gold": dict(mode="gold", target="greedy_01_gap", measures={"quality": "higher"}),
    "consequence": dict(mode="consequence", target="consequence", measures={"important": "lower", "harmless": "higher"}),
}  # fmt: skip


def train(
    records: list[str],
    out: Path,
    k: int,
    follow: int,
    lag: int,
    hidden: list[str],
    epochs: int,
    labels: str = "gold",
    follow_block: int = 0,
) -> float:
    """Fit the K fold routers of one judge into `out` (seconds); follow_block > 0: its windows cut as blocks
    of that many drafts cut them (train's follow_block), in training and in the out-of-fold scoring."""
    started = time.perf_counter()
    what = LABELS[labels]
    cfg = TrainConfig(records=records, mode=what["mode"], target=what["target"], cross_fit=k, max_epochs=epochs, patience=4, baselines=False, output=str(out), router=RouterArch(head="judge", hidden_inputs=hidden, follow=follow, lag=lag, follow_block=follow_block if follow else 0))  # fmt: skip
    run_train(cfg)
    return time.perf_counter() - started


def paired(first: dict, second: dict, reps: int = BOOTSTRAP, seed: int = 0, what: str = "quality") -> dict:
    """Per target: a measure (quality, or the kept share of important / harmless mismatches) of `first`'s
    router minus `second`'s on the same examples, paired bootstrap."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in first["sums"]:
        a, b = first["sums"][t][first["router"]], second["sums"][t][second["router"]]
        n = len(a["positions"])
        if n != len(b["positions"]) or not np.array_equal(a["positions"], b["positions"]):
            raise ValueError("the two cross-fits scored different examples: train them on the same records and seed")
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=reps).astype(np.float64)
        ones = np.ones((1, n))
        diff = weighted_share(a, what, weights) - weighted_share(b, what, weights)
        point = float(weighted_share(a, what, ones)[0] - weighted_share(b, what, ones)[0])
        lo, hi = np.percentile(diff, [2.5, 97.5])
        out[str(t)] = {"diff": point, "low": float(lo), "high": float(hi), "examples": n}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", nargs="+", required=True, help="record folders with window inputs")
    parser.add_argument("--labels", choices=sorted(LABELS), default="gold", help="what the judges learn (above)")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--follow", type=int, default=6, help="following drafts the richer judge reads")
    parser.add_argument(
        "--follow-block", type=int, default=0, help="cut the window judge's windows as blocks of this gamma (0: uncut)"
    )
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
            args.hidden, args.epochs, args.labels, args.follow_block,
        )
        for name, folder in folders.items()
    }  # fmt: skip
    if read_plan(folders[rich])["folds"] != read_plan(folders["judge"])["folds"]:
        raise SystemExit("the two cross-fits have different fold plans")
    answer_level = args.labels == "consequence"  # over the tested mismatches, at matched rejection rates
    results = {
        name: out_of_fold(folder, args.records, tested_only=answer_level, matched=answer_level)
        for name, folder in folders.items()
    }
    summaries = {name: summarise(r) for name, r in results.items()}
    measures = LABELS[args.labels]["measures"]
    difference = {m: paired(results[rich], results["judge"], what=m) for m in measures}
    versus = f"{rich} - judge"
    rows = []
    for t in map(str, TARGETS):
        for measure in measures:
            for name, s in summaries.items():
                m = s["targets"][t]["methods"]
                v = m[name][f"{measure}_vs_best_rule"]
                rows.append(dict(target=t, measure=measure, method=name, value=m[name][measure],
                                 best_rule=m["best_rule"][measure], vs_best_rule=v["diff"], low=v["low"],
                                 high=v["high"]))  # fmt: skip
            d = difference[measure][t]
            rows.append(dict(target=t, measure=measure, method=versus, value=float("nan"), best_rule=float("nan"),
                             vs_best_rule=d["diff"], low=d["low"], high=d["high"]))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    result = dict(records=args.records, labels=args.labels, cpu=cpu_kind(), k=args.k, follow=args.follow,
                  follow_block=args.follow_block, lag=args.lag, hidden=args.hidden, train_seconds=seconds,
                  summaries=summaries, richer=rich, richer_minus_judge=difference)  # fmt: skip
    write_json(out / "crossfit.json", result)
    write_csv(out / "crossfit.csv", list(rows[0]), rows)
    examples = difference[next(iter(measures))][str(TARGETS[0])]["examples"]
    meaning = (
        "important / harmless = share of the tested IMPORTANT / HARMLESS mismatches kept (lower / higher is better), "
        "rejection rates matched over the tested mismatches"
        if answer_level
        else "quality = share of emitted tokens equal to gold"
    )
    print(f"\nout of fold, greedy view, {examples} examples, K = {args.k}; {meaning}; differences with 95% paired "
          f"bootstrap intervals over examples")  # fmt: skip
    print(f"{'rejection target':<18}{'measure':<11}{'method':<24}{'value':>9}{'diff':>9}{'95% interval':>22}")
    for r in rows:
        interval = f"[{r['low']:+.4f}, {r['high']:+.4f}]"
        pairing = "vs best rule" if r["method"] != versus else "paired"
        print(
            f"{r['target']:<18}{r['measure']:<11}{r['method']:<24}{r['value']:>9.4f}{r['vs_best_rule']:>+9.4f}"
            f"{interval:>22} {pairing}"
        )
    print(f"\nresults: {out / 'crossfit.json'}, {out / 'crossfit.csv'}")


if __name__ == "__main__":
    main()
