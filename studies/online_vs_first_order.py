"""How far the signed measure's first-order prediction is from an online run that exists, prompt by prompt.

    python -m studies.online_vs_first_order runs/eval/gsm8k-signed-heldout \
        --records runs/records/gsm8k-consequence-all --out runs/studies/online-vs-first-order

studies/first_order_check.py decodes its own sample with the recording's torch pair; this reads an online run
already made (`specroute eval`'s online_per_prompt.csv: every point's verdict on every prompt, the verifier's
among them) and the labels of the same problems in a consequence recording that holds them (for a run on
left-out problems: the full recording, not the copy the router learned from). Per problem and per online point
(every rule and router point, at its own alpha) it compares the first-order change the labels predict (keeping a
rescuing draft +1, a harmful one -1, tested one swap at a time along the recorded greedy answer) with the change
measured online (the point's verdict minus the verifier's on the same prompt). The online verifier may answer
otherwise than the recorded one (another engine, near-ties): how often they agree is reported beside.

Writes online_vs_first_order.json (summary and per-problem rows per point) and .csv to --out; prints a summary.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np


REFERENCE = "verifier@0"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_dir", help="a finished `specroute eval` output (online_per_prompt.csv, eval_config.json)")
    ap.add_argument("--records", required=True, help="a consequence recording holding the prompts' labels")
    ap.add_argument("--reps", type=int, default=2000, help="bootstrap replicates over problems")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def online_verdicts(eval_dir: Path) -> dict[str, dict[str, float]]:
    """point name -> example id -> its verdict (quality) from online_per_prompt.csv."""
    path = eval_dir / "online_per_prompt.csv"
    if not path.exists():
        raise SystemExit(f"error: {path} does not exist: name a finished `specroute eval` output folder")
    out: dict[str, dict[str, float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault(row["point"], {})[row["example_id"]] = float(row["quality"])
    if REFERENCE not in out:
        raise SystemExit(f"error: {path} has no {REFERENCE} rows: the online run decoded no verifier reference")
    return out


def point_scores(view, eval_dir: Path, points: list[str]) -> dict[str, tuple[np.ndarray, float]]:
    """Each scorable point's greedy defer score on the view's rows (N,) and its alpha: a rule's offline score,
    a router's from its folder (as eval_config.json names it); the others (lossless, drafter) are skipped."""
    from eval.offline import load_routers
    from router.offline.views import greedy_rule_scores, greedy_score, router_scores

    folders = json.loads((eval_dir / "eval_config.json").read_text()).get("routers", [])
    routers = load_routers(folders) if folders else {}
    rules = greedy_rule_scores(view)
    out = {}
    for point in points:
        method, _, alpha = point.partition("@")
        if method in routers:
            r = routers[method]
            out[point] = (greedy_score(router_scores(r, view, name=method), r.cfg.head, view.cols["tv"]), float(alpha))
        elif method in rules:
            out[point] = (np.asarray(rules[method]), float(alpha))
    return out


def compare_point(view, ids, score, alpha, verdicts: dict, reference: dict, reps: int) -> tuple[dict, list[dict]]:
    """One point: per problem the predicted and the measured change, and their comparison."""
    from studies.first_order_check import compare, predicted_changes

    problems = sorted(set(verdicts) & set(reference) & set(ids.tolist()))
    if not problems:
        raise SystemExit("error: the recording holds none of the online run's prompts: name the full recording")
    predicted = predicted_changes(view, ids, score, alpha, problems)
    rows = [
        {"problem": p, **predicted[p], "verifier_online": reference[p], "point_online": verdicts[p],
         "measured": verdicts[p] - reference[p]}
        for p in problems
    ]  # fmt: skip
    agree = float(np.mean([r["verifier_online"] == r["answer_correct"] for r in rows]))
    return {**compare(rows, reps), "verifier_online_matches_recorded_verdict": agree}, rows


def main(argv=None) -> dict:
    from studies.first_order_check import _ids
    from router.offline.inputs import RecordView

    args = parse(argv)
    eval_dir = Path(args.eval_dir)
    verdicts = online_verdicts(eval_dir)
    view = RecordView([args.records], "all", mode="consequence")
    ids = _ids(view)  # (N,) each row's problem
    scored = point_scores(view, eval_dir, [p for p in verdicts if p != REFERENCE])
    if not scored:
        raise SystemExit(f"error: {eval_dir} holds no rule or router point to predict (only {sorted(verdicts)})")
    result, all_rows = {}, []
    for point, (score, alpha) in scored.items():
        result[point], rows = compare_point(view, ids, score, alpha, verdicts[point], verdicts[REFERENCE], args.reps)
        all_rows += [{"point": point, **r} for r in rows]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "online_vs_first_order.json").write_text(json.dumps({"points": result, "rows": all_rows}, indent=2))
    with open(out / "online_vs_first_order.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows)
    for point, r in result.items():
        print(
            f"{point}: {r['problems']} problems, predicted {r['predicted_change']:+.4f}, measured online "
            f"{r['measured_change']:+.4f}, measured - predicted {r['measured_minus_predicted']:+.4f} "
            f"[{r['interval'][0]:+.4f}, {r['interval'][1]:+.4f}]; same per problem {r['same_per_problem']:.3f}; "
            f"online verifier = recorded verdict on {r['verifier_online_matches_recorded_verdict']:.3f}"
        )
    print(f"wrote {out / 'online_vs_first_order.json'}, online_vs_first_order.csv")
    return result


if __name__ == "__main__":
    main()
