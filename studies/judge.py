"""What a judge router needs: inputs, loss and data, measured against the best rule on held-out examples.

Trains router variants on gold records with judge inputs (`specroute gen ... judge=true`), then
scores every variant and every plug-in rule on the test split in the greedy and temperature-1
views (router/offline/views.py): the share of the gap between the best rule and the oracle each closes,
with 95% bootstrap intervals over test examples. The best rule of each view is chosen on the
validation split, as is the variant reported as "best router". A learning curve retrains the
chosen judge on growing shares of the training examples.

    python -m studies.judge --records runs/judge/records/gsm8k [--out runs/judge/study-gsm8k]
        [--variants judge-after,token] [--epochs 20] [--curve 0.25,0.5]
        [--test-records runs/judge/records/gsm8k]   # train pooled on --records, score one task
    python -m studies.judge --records runs/records/gsm8k-window --variants judge-after,judge-window \
        --curve "" --paired judge-window,judge-after fly,entropy_gate   # the window judge vs the judge

Writes study.json and study.csv (one row per variant, view) into --out and prints the tables.
Variants whose folder already holds a router trained on exactly these records are reused; a
recording that grew (or changed) retrains them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from eval.offline import compare_views
from router.infra.files import write_csv, write_json
from router.machine.hardware import cpu_kind
from router.model import load_router
from router.records import read_manifest
from router.offline.inputs import RecordView
from router.offline.views import VIEW_TITLES
from router.infra.config import build_config
from train.config import TrainConfig
from train.run import run_train

JUDGE = dict(head="judge", target="greedy_01_gap")
VARIANTS = {  # name -> TrainConfig overrides
    "cascade": dict(arch="mlp"),
    "token": dict(arch="mlp", head="token", target="token_label"),
    "judge-qp": dict(**JUDGE),  # q/p, the draft's own q/p, lookahead, class
    "judge-after": dict(**JUDGE, hidden_inputs=["after"]),  # + the verifier's state after the draft
    "judge-after-cs": dict(**JUDGE, hidden_inputs=["after"], loss="cost_sensitive"),
    "judge-after-pre": dict(**JUDGE, hidden_inputs=["after", "verifier"]),  # + its state before the draft
    "judge-all": dict(**JUDGE, hidden_inputs=["after", "verifier", "drafter"]),
    "judge-after-small": dict(**JUDGE, hidden_inputs=["after"], width=16, weight_decay=0.1),  # less capacity
    # window judges (records with window >= 6, configs/studies/gen/gsm8k-window.yaml): + the next 6 drafts' scores
    "judge-window": dict(**JUDGE, hidden_inputs=["after"], follow=6),
    "judge-window-qp": dict(**JUDGE, follow=6),
    # the window judge trained on windows cut as blocks of 5 drafts cut them (the eval's gamma): follow_block
    "judge-window-cut5": dict(**JUDGE, hidden_inputs=["after"], follow=6, follow_block=5),
}


def train_variant(
    name: str, overrides: dict, records: list[str], out: Path, epochs: int, max_train_rows: int | None = None
) -> tuple[Path, float]:
    folder = out / "routers" / name
    current = ",".join(read_manifest(r).id for r in records)
    if (
        (folder / "model.safetensors").exists()
        and (folder / "metrics.json").exists()
        and load_router(folder).cfg.records_id == current
    ):
        return folder, float("nan")  # trained on exactly these records: reuse it
    started = time.perf_counter()
    common = dict(records=records, max_epochs=epochs, patience=4, baselines=name == "judge-qp", output=str(folder))
    # the overrides name architecture keys flat (head, follow, ...), as YAML and key=value do
    run_train(build_config(TrainConfig, {**common, "max_train_rows": max_train_rows, **overrides}))
    return folder, time.perf_counter() - started


def table(rows: list[dict], view: str) -> str:
    lines = [f"{'method':<18}{'gap closed':>11}{'95% interval':>20}{'norm. area':>12}{'95% interval':>20}"]
    for r in sorted((r for r in rows if r["view"] == view), key=lambda r: -np.nan_to_num(r["gap_closed"], nan=-9)):
        gap = "[{:.3f}, {:.3f}]".format(r["gap_lo"], r["gap_hi"])
        norm = "[{:.3f}, {:.3f}]".format(r["area_lo"], r["area_hi"])
        lines.append(f"{r['method']:<18}{r['gap_closed']:>11.3f}{gap:>20}{r['normalised_area']:>12.4f}{norm:>20}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", required=True, nargs="+", help="gold record folders with judge inputs")
    parser.add_argument(
        "--test-records",
        nargs="+",
        default=None,
        help="score on these folders' validation/test splits (default: --records)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--curve", default="0.25,0.5", help="shares of training rows for the learning curve")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument(
        "--paired", nargs="*", default=[], metavar="A,B", help="method pairs: gap closed of A minus B, paired bootstrap"
    )
    args = parser.parse_args()
    out = Path(args.out or f"runs/judge/study-{Path(args.records[0]).name}")
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    seconds = {}
    for name in names:
        _, seconds[name] = train_variant(name, VARIANTS[name], args.records, out, args.epochs)
    scored = args.test_records or args.records
    test = RecordView(scored, "test")
    routers = {name: load_router(out / "routers" / name) for name in names}
    pairs = tuple(tuple(p.split(",")) for p in args.paired)
    views = compare_views(scored, test, routers, args.bootstrap, pairs)
    train_rows = len(RecordView(args.records, "train"))
    curve = learning_curve(args, out, views, test, train_rows)
    rows = [
        {
            "view": view,
            "method": m,
            "gap_closed": r["gap_closed"],
            "gap_lo": r["gap_closed_ci"][0],
            "gap_hi": r["gap_closed_ci"][1],
            "normalised_area": r["normalised_area"],
            "area_lo": r["normalised_area_ci"][0],
            "area_hi": r["normalised_area_ci"][1],
            "validation_area": v["validation_areas"].get(m, float("nan")),
        }
        for view, v in views.items()
        for m, r in v["methods"].items()
    ]
    result = {
        "records": args.records,
        "scored_on": scored,
        "cpu": cpu_kind(),
        "test_examples": views["greedy"]["examples"],
        "train_rows": train_rows,
        "train_seconds": seconds,
        "views": views,
        "learning_curve": curve,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "study.json", result)
    write_csv(out / "study.csv", list(rows[0]), rows)
    for view, v in views.items():
        print(
            f"\n{VIEW_TITLES[view]}: best rule {v['best_rule']}, best router {v['best_router']} (validation); "
            f"test, {v['examples']} examples, 95% bootstrap intervals\n{table(rows, view)}"
        )
        for pair, r in v.get("paired", {}).items():
            print(
                f"  paired: {pair}: {r['gap_closed']:+.3f} [{r['gap_closed_ci'][0]:+.3f}, {r['gap_closed_ci'][1]:+.3f}]"
            )
    for share, r in curve.items():
        print(f"learning curve: {share} of the training rows -> greedy gap closed {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]")
    print(f"\nresults: {out / 'study.json'}, {out / 'study.csv'}")


def learning_curve(args, out: Path, views: dict, test: RecordView, rows: int) -> dict:
    """The best judge on validation (greedy view), retrained on shares of the training rows (the first
    rows, i.e. whole examples in recording order), scored on the test split's greedy view."""
    judges = [n for n in views["greedy"]["validation_areas"] if n.startswith("judge")]
    if not judges or not args.curve:
        return {}
    best = max(judges, key=lambda n: views["greedy"]["validation_areas"][n])
    curve = {}
    for share in (float(x) for x in args.curve.split(",")):
        name = f"{best}@{share:g}"
        train_variant(name, VARIANTS[best], args.records, out, args.epochs, max(1, int(rows * share)))
        got = compare_views(
            args.test_records or args.records, test, {name: load_router(out / "routers" / name)}, args.bootstrap
        )
        r = got["greedy"]["methods"][name]
        curve[f"{share:g}"] = [r["gap_closed"], *r["gap_closed_ci"]]
    r = views["greedy"]["methods"][best]
    curve["1"] = [r["gap_closed"], *r["gap_closed_ci"]]
    return curve


if __name__ == "__main__":
    main()
