"""Eval's report: report.md (offline sections here, online ones in eval/online_report.py) and the
summary printed at the end of `specroute eval`, its terminal twin; both read the run's metrics
(metrics.json is written by eval/run.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from eval.crossfit_report import out_of_fold_section
from eval.online_report import online_lines, online_sections
from eval.tables import ci, markdown_table
from router.infra.console import summary_table
from router.infra.files import write_text
from router.offline.views import VIEW_TITLES

SUMMARY_KEYS = [
    "area",
    "best_quality",
    "best_top1",
    "quality_at_25pct",
    "quality_at_50pct",
    "quality_at_75pct",
    "latency_at_verifier_quality",
    "quality_at_verifier_latency",
]


def _by_area(methods: dict) -> list[tuple[str, dict]]:
    return sorted(methods.items(), key=lambda kv: -np.nan_to_num(kv[1]["area"], nan=-np.inf))


def view_sections(views: dict) -> list[str]:
    """report.md tables of the greedy and temperature-1 views: gap closed with intervals over examples."""
    parts = []
    for view, v in views.items():
        parts += [
            f"### {VIEW_TITLES[view]}",
            "",
            f"Test split, {v['examples']} examples. Best rule **{v['best_rule']}** and best router "
            f"**{v['best_router']}** chosen on the validation split. Gap closed = (area - area of "
            f"{v['best_rule']}) / (area of the oracle - area of {v['best_rule']}); areas over rejection rates "
            f"[0, {v['span']:.4f}] (the oracle's range); 95% percentile bootstrap intervals over test "
            f"examples ({v['replicates']} replicates).",
            "",
        ]
        rows = sorted(
            v["methods"].items(),
            key=lambda kv: -kv[1]["gap_closed"] if not math.isnan(kv[1]["gap_closed"]) else math.inf,
        )
        parts += [
            markdown_table(
                ["method", "gap closed", "95% interval", "normalised area", "95% interval"],
                [
                    [n, m["gap_closed"], ci(m["gap_closed_ci"]), m["normalised_area"], ci(m["normalised_area_ci"])]
                    for n, m in rows
                ],
            ),
            "",
        ]
    return parts


def consequence_section(catch: dict | None) -> list[str]:
    """Offline on consequence labels: the share of important mismatches each method catches."""
    if not catch:
        return []
    rows = sorted(catch["methods"].items(), key=lambda kv: -kv[1]["caught_at_50pct"])
    return [
        "### Important mismatches caught (consequence labels, greedy view)",
        "",
        f"{catch['important']} important mismatches among {catch['positions']} test positions; the share each "
        f"method defers at, at 25/50/75% of the verifier's own rejection rate "
        f"({catch['lossless_rejection']:.4f}; alphas swept on these labels, an upper bound for each method).",
        "",
        markdown_table(
            ["method", "caught @25%", "caught @50%", "caught @75%"],
            [[m, v["caught_at_25pct"], v["caught_at_50pct"], v["caught_at_75pct"]] for m, v in rows],
        ),
        "",
    ]


def gamma_section(gamma: dict) -> list[str]:
    """report.md: how gamma: auto chose the draft length (nothing when the config fixed it)."""
    if "latency" not in gamma:
        return []
    chosen = gamma["gamma"]
    verify = ", ".join(f"{t * 1e3:.0f}" for t in gamma["verify_seconds"])
    return [
        f"gamma {chosen} was chosen on {gamma['machine']} in {gamma['dtype']} at batch {gamma['batch']} "
        f"from the records' acceptance rate {gamma['acceptance']:.3f} and the measured costs (drafter step "
        f"{gamma['drafter_step'] * 1e3:.1f} ms; verifier pass over n = 1..{len(gamma['verify_seconds'])} "
        f"tokens: {verify} ms): expected {gamma['latency'][chosen]:.3f}x the verifier's time per token"
        + ("." if gamma["pays"] else "; speculation is NOT expected to pay on this machine."),
        "",
    ]


def offline_sections(offline: dict) -> list[str]:
    """report.md: the offline summary per method, the views' gap closed and the consequence catch."""
    s, refs = offline["summary"]["methods"], offline["summary"]["references"]
    rows = [[m] + [v.get(k, math.nan) for k in SUMMARY_KEYS] for m, v in _by_area(s)]
    d, v = refs["drafter"], refs["verifier"]
    return [
        "## Offline (held-out records, no model calls)",
        "",
        f"{offline['positions']} test positions; analytic latency with drafter/verifier cost ratio "
        f"{offline['cost_ratio']:.3f} ({offline['cost_ratio_source']}). Quality = probability of the gold "
        f"token under pi; area: 0 = drafter, 1 = cascade oracle.",
        "",
        markdown_table(["method", *SUMMARY_KEYS], rows),
        "",
        f"Drafter: quality {d['quality']:.4f}, top-1 {d['top1']:.4f}; verifier: quality {v['quality']:.4f}, "
        f"top-1 {v['top1']:.4f}, rejection {v['rejection']:.4f}.",
        "",
        *view_sections(offline["views"]),
        *consequence_section(offline["consequence"]),
        *out_of_fold_section(offline.get("out_of_fold") or {}),
    ]


def write_report(path: Path, cfg, metrics: dict, plots: list[Path]) -> None:
    """report.md from the run's metrics (the same numbers metrics.json holds)."""
    routers = ", ".join(cfg.routers) or "none"
    parts = [
        f"# specroute eval: {cfg.name}",
        "",
        f"Records: {', '.join(cfg.records)}; routers: {routers}; gamma {cfg.gamma}, temperature {cfg.temperature}.",
        "",
        *gamma_section(metrics["gamma"]),
    ]
    if metrics["offline"]:
        parts += offline_sections(metrics["offline"])
    if metrics["online"]:
        parts += online_sections(metrics["online"], cfg)
    parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    write_text(path, "\n".join(parts))


def view_lines(views: dict) -> list[str]:
    """Gap closed per view for the best rule's rivals: the routers, the oracle and the other rules."""
    lines = []
    for view, v in views.items():
        lines.append(
            f"\n{VIEW_TITLES[view]}: gap closed vs {v['best_rule']} (chosen on validation), test, "
            f"95% interval over {v['examples']} examples"
        )
        for name, m in sorted(v["methods"].items(), key=lambda kv: -np.nan_to_num(kv[1]["gap_closed"], nan=-9)):
            lo, hi = m["gap_closed_ci"]
            lines.append(f"  {name:<20}{m['gap_closed']:>9.3f}  [{lo:.3f}, {hi:.3f}]   area {m['normalised_area']:.4f}")
    return lines


def offline_lines(offline: dict) -> list[str]:
    """The terminal's offline tables: the views' gap closed, then area and latency per method."""
    lines = view_lines(offline["views"])
    lines.append(f"\n{'offline method':<22}{'area':>8}{'best quality':>14}{'latency @ verifier quality':>28}")
    for m, v in _by_area(offline["summary"]["methods"]):
        lines.append(f"{m:<22}{v['area']:>8.4f}{v['best_quality']:>14.4f}{v['latency_at_verifier_quality']:>28.3f}")
    return lines


def gamma_line(gamma: dict) -> str:
    if "latency" not in gamma:
        return f"{gamma['gamma']} ({gamma['source']})"
    return (
        f"{gamma['gamma']} (auto: expected {gamma['latency'][gamma['gamma']]:.3f}x the verifier per token at "
        f"acceptance {gamma['acceptance']:.3f}{'' if gamma['pays'] else '; speculation does not pay here'})"
    )


def print_eval_summary(metrics: dict, out: Path) -> None:
    """The end of `specroute eval`: its tables and where the files are."""
    lines = online_lines(metrics["online"]) if metrics["online"] else []
    if metrics["offline"]:
        lines += offline_lines(metrics["offline"])
    rows = [
        ("task", metrics["task"]),
        ("gamma", gamma_line(metrics["gamma"])),
        ("seconds", f"{metrics['seconds']:.1f}"),
        ("report", str(out / "report.md")),
        ("metrics", str(out / "metrics.json")),
    ]
    print("\n" + "\n".join(lines) + "\n\n" + summary_table(rows))
