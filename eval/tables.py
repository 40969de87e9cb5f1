"""Eval's tables as files: markdown tables for report.md, curves.csv and online_per_prompt.csv."""

from __future__ import annotations

import math
from pathlib import Path

from eval.points import REFERENCE
from router.infra.files import write_csv

CURVE_COLUMNS = ["stage", "method", "alpha", "rejection", "quality", "top1", "relative_latency"]
PER_PROMPT_COLUMNS = [
    "point",
    "example_id",
    "quality",
    "answer",
    "tokens",
    "same_output_as_verifier",
    "verifier_logprob",
    "verifier_logprob_tokens",
]


def fmt(x) -> str:
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.4f}"
    return str(x)


def ci(interval) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def plus_minus(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_curves_csv(path: Path, rows: list[dict]) -> None:
    """curves.csv: offline curve points and online points, one row each."""
    write_csv(path, CURVE_COLUMNS, rows)


def write_per_prompt_csv(path: Path, per_prompt: dict[str, list[dict]]) -> None:
    """online_per_prompt.csv: every point's outcome on every prompt (what the paired statistics use);
    a column a metric does not produce (e.g. `answer`) is left empty."""
    ref = {e["example_id"]: e["new_ids"] for e in per_prompt.get(REFERENCE, [])}
    rows = [
        {
            "point": name,
            **{k: e.get(k, "") for k in PER_PROMPT_COLUMNS[1:]},
            "same_output_as_verifier": int(e["new_ids"] == ref.get(e["example_id"])) if ref else "",
        }
        for name, examples in per_prompt.items()
        for e in examples
    ]
    write_csv(path, PER_PROMPT_COLUMNS, rows)
