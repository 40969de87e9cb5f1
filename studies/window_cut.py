"""How far a window judge's rejection rate moves when its windows are cut as the loop's blocks cut them.

Recorded windows are never cut (every recorded draft has W followers); in a block of g drafts the one at
position j has g - 1 - j (router/window/follow.py). `specroute eval` matches each router's online alpha
to a target rejection rate (a fraction of the verifier's) on the held-out records, scored as the router
was trained (`follow_block`: cut for that block size, or uncut). This study takes that matched alpha and
measures the rejection rate the same router gives at it on the same rows with the windows cut for block
size --gamma: what it will do online, offline. A judge trained on uncut windows drifts there (it keeps
far more than it was matched to); one trained with follow_block = gamma should stay put.

    python -m studies.window_cut --records runs/records/mbpp-window --gamma 5 \
        --routers runs/judge/study-mbpp-window/routers/judge-window runs/judge/study-mbpp-window/routers/judge-window-cut5

Writes window_cut.json and window_cut.csv into --out and prints the table.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path

import numpy as np

from eval.grid import alphas_at_rejection
from eval.offline import greedy_curves
from router.infra.files import write_csv, write_json
from router.machine.hardware import cpu_kind
from router.model import load_router
from router.offline.inputs import RecordView, router_scores
from router.offline.views import greedy_columns, greedy_score


def scored_for_block(router, block: int):
    """The router's network, its windows read as blocks of `block` drafts cut them (0: uncut)."""
    twin = copy.copy(router.net)  # shallow: the weights are shared, only the config differs
    twin.cfg = dataclasses.replace(router.net.cfg, follow_block=block)
    return twin


def rejection_at(router, view: RecordView, alpha: float) -> float:
    """Greedy-view rejection rate at alpha: the share of positions where the drafter's argmax differs from
    the verifier's and the judge defers (its predicted gap of keeping the draft exceeds alpha)."""
    score = greedy_score(router_scores(router, view), router.cfg.head, view.cols["tv"])
    return float(np.mean(greedy_columns(view)["cost"] * (score > alpha)))


def study(records: list[str], routers: list[str], split: str, gamma: int, targets: list[float]) -> list[dict]:
    view = RecordView(records, split)
    verifier = float(np.mean(greedy_columns(view)["cost"]))  # every mismatch rejected
    rows = []
    for folder in routers:
        router = load_router(folder)
        name = Path(folder).name
        curve = greedy_curves(view, {name: router})[name]
        for target in targets:
            (alpha,) = alphas_at_rejection(curve.threshold, curve.rejection, [target * verifier], None)
            rows.append(
                dict(
                    router=name, trained_follow_block=router.cfg.follow_block, split=split, target=target,
                    alpha=alpha, verifier_rejection=verifier, matched=rejection_at(router, view, alpha),
                    at_gamma=rejection_at(scored_for_block(router, gamma), view, alpha), gamma=gamma,
                )
            )  # fmt: skip
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", nargs="+", required=True)
    parser.add_argument("--routers", nargs="+", required=True, help="window judge router folders")
    parser.add_argument("--gamma", type=int, default=5, help="the block size the eval decodes them at")
    parser.add_argument("--splits", default="test,validation", help="held-out splits to measure on")
    parser.add_argument("--targets", default="0.25,0.5,0.75", help="fractions of the verifier's rejection")
    parser.add_argument("--out", default="runs/judge/window-cut")
    args = parser.parse_args(argv)
    targets = [float(t) for t in args.targets.split(",")]
    rows = [r for s in args.splits.split(",") for r in study(args.records, args.routers, s, args.gamma, targets)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "window_cut.json", dict(records=args.records, cpu=cpu_kind(), gamma=args.gamma, rows=rows))
    write_csv(out / "window_cut.csv", list(rows[0]), rows)
    print(f"rejection rates (greedy view) at the matched alpha, uncut windows vs cut as in blocks of {args.gamma}")
    print(f"{'router':<22}{'block':>6}{'split':>12}{'target':>8}{'alpha':>9}{'matched':>9}{'at gamma':>10}")
    for r in rows:
        print(
            f"{r['router']:<22}{r['trained_follow_block']:>6}{r['split']:>12}{r['target']:>8.2f}{r['alpha']:>9.4f}"
            f"{r['matched']:>9.4f}{r['at_gamma']:>10.4f}"
        )
    print(f"results: {out / 'window_cut.json'}, {out / 'window_cut.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
