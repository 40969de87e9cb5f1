"""The best learned router per fold against the best rule per fold, out of fold (`specroute best-router`).

Given several cross-fitted router folders trained on one fold plan (the same records, cross_fit and
cross_fit_seed: e.g. the share-1 folders of learning-curve runs with other router settings), each fold's
"best_router" is the router best on that fold's inner validation examples, by the measure the best rule is
chosen by (eval/crossfit.py; choose_by="signed" chooses both by the signed measure). It is a router variant
chosen without looking at the scored examples, so its difference to the per-fold best rule is a fair answer to
"does the best learned router beat the best rule", where picking the best-looking router afterwards would not be.
"""

from __future__ import annotations

from pathlib import Path

from eval.crossfit import populations
from eval.crossfit_report import hindsight_cell, hindsight_header
from eval.crossfit_summary import REFERENCES, result_measures
from eval.tables import markdown_table
from router.infra.files import write_json

FAIR_POPULATIONS = ("tested-matched", "all-matched")  # tested mismatches at matched rejection, else every position


def best_router(folders: list[str], records: list[str], out: str | Path, reps: int = 2000, choose_by=None) -> dict:
    """Score the folders out of fold with the per-fold best router and best rule; write best_router.json to
    `out` (every population's summary) and return {"population": name, "summary": ..., "path": ...}."""
    if len(folders) < 2:
        raise ValueError("name two or more cross-fitted router folders: a best router is chosen among them")
    summaries = populations(folders, records, reps, choose_by)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "best_router.json"
    write_json(path, {"folders": list(folders), "records": list(records), "summaries": summaries})
    fair = next(p for p in FAIR_POPULATIONS if p in summaries)
    return {"population": fair, "summary": summaries[fair], "path": path}


def table(summary: dict) -> list[str]:
    """Markdown rows: per target, each learned method's kept shares and its difference to the best rule."""
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
