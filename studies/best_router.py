"""The best learned router per fold against the best rule per fold, out of fold.

    python studies/best_router.py runs/studies/curve300/share-1 runs/studies/curve300-lag-ens5/share-1 \
        --records runs/records/gsm8k-consequence --out runs/studies/best-router300

Given several cross-fitted router folders trained on one fold plan (the same records, cross_fit and
cross_fit_seed: e.g. the share-1 folders of studies/learning_curve.py runs with other router settings),
each fold's "best_router" is the router best on that fold's inner validation examples, by the measure
the best rule is chosen by (eval/crossfit.py; `--choose-by signed` chooses both by the signed measure). It is a router variant chosen without looking at the
scored examples, so its difference to the per-fold best rule is a fair answer to "does the best learned
router beat the best rule", where picking the best-looking router afterwards would not be.

Writes best_router.json (every population's summary, eval/crossfit.py) to --out and prints, for the
tested mismatches at matched rejection rates (consequence rows; else every position), each router, the
best router and the best rule, with paired intervals against the best rule.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def table(summary: dict) -> list[str]:
    """Markdown rows: per target, each learned method's kept shares and its difference to the best rule."""
    from eval.crossfit_summary import REFERENCES, result_measures
    from eval.crossfit_report import hindsight_cell, hindsight_header
    from eval.tables import markdown_table

    measures = result_measures(summary)
    chooser = summary.get("chosen_by", measures[0])
    lines = []
    for target, block in summary["targets"].items():
        rows = []
        references = [r for r in REFERENCES if r in block["methods"]]  # the signed oracle: how far labels allow
        for method in [*summary["routers"], "best_router", "best_rule", *references]:
            row = block["methods"][method]
            cells = [method, f"{row['rejection']:.4f}"]
            for m in measures:
                d = row[f"{m}_vs_best_rule"]
                cells += [f"{row[m]:.4f}", f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"]
            rows.append(cells + hindsight_cell(row, chooser, block))
        header = ["method", "rejection", *[h for m in measures for h in (m, f"{m} - best rule [95%]")]]
        header += hindsight_header(chooser, block)
        lines += [
            f"At {float(target):g} x the verifier's rejection rate (chosen by {chooser}; best router per fold: "
            f"{', '.join(block['best_router_per_fold'])}; best rule per fold: {', '.join(block['best_rule_per_fold'])}):",
            "",
            markdown_table(header, rows),
            "",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    from eval.crossfit import populations
    from router.infra.files import write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="cross-fitted router folders on one fold plan (two or more)")
    parser.add_argument("--records", nargs="+", required=True, help="the record folders to score on")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument(
        "--choose-by",
        default=None,
        help="the measure best rules and routers are chosen by (e.g. signed; default: the first)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if len(args.folders) < 2:
        parser.error("name two or more cross-fitted folders: a best router is chosen among them")
    summaries = populations(args.folders, args.records, args.reps, args.choose_by)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "best_router.json", {"folders": args.folders, "records": args.records, "summaries": summaries})
    fair = next(p for p in ("tested-matched", "all-matched") if p in summaries)
    print(f"Out of fold, population {fair} ({summaries[fair]['k']} folds):\n")
    print("\n".join(table(summaries[fair])))
    print(f"wrote {out / 'best_router.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
