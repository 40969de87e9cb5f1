"""Eval plots (PNG): quality vs rejection rate and quality vs analytic relative latency (offline,
one line per method), quality vs measured relative latency and vs measured rejection rate (online,
one line per method across its alphas); the verifier and drafter are dashed reference lines in each.
Routers are drawn strong and thick, rules and baselines pale.
"""

from __future__ import annotations

import math
from pathlib import Path

from eval.grid import BASELINES
from eval.offline import BOUNDS, REFERENCE_METHODS
from eval.points import OnlinePoint
from router.rules import rule_names

REFERENCE_STYLE = {"verifier": dict(color="black", linestyle="--"), "drafter": dict(color="grey", linestyle=":")}
SKIP_LINES = ("verifier", "drafter")


def is_learned(name: str) -> bool:
    """Routers (drawn strong and thick) vs rules, baselines and references (drawn pale)."""
    return name not in (*rule_names(), *BASELINES, *REFERENCE_METHODS)


def _plot(path: Path, title: str, xlabel: str, ylabel: str, lines: dict, refs: dict, vline: float | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    strong, pale = plt.get_cmap("tab10").colors, plt.get_cmap("tab20").colors[1::2]
    n_strong = n_pale = 0
    for name, (x, y) in lines.items():
        learned = is_learned(name)  # routers stand out: strong colour, thick
        reference = name in BOUNDS  # dotted
        if learned:
            color, n_strong = strong[n_strong % 10], n_strong + 1
        else:
            color, n_pale = pale[n_pale % 10], n_pale + 1
        ax.plot(
            x,
            y,
            ":" if reference else "-",
            color=color,
            linewidth=2.6 if learned else 1.6,
            marker="o" if len(x) < 12 else None,
            markersize=4,
            label=f"{name} (learned)" if learned else name,
        )
    for name, y in refs.items():
        if y is not None and not math.isnan(y):
            ax.axhline(y, label=f"{name} only", **REFERENCE_STYLE[name])
    if vline is not None:
        ax.axvline(vline, color="black", linewidth=0.8, alpha=0.5)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _frontier_line(rows: list[dict], x_key: str) -> tuple[list, list]:
    """Points sorted by x with the running best quality (router/offline/tradeoff.py: frontier)."""
    rows = sorted(rows, key=lambda r: r[x_key])
    best, ys = -math.inf, []
    for r in rows:
        best = max(best, r["quality"])
        ys.append(best)
    return [r[x_key] for r in rows], ys


def offline_plots(out: Path, rows: list[dict], summary: dict, task: str) -> list[Path]:
    refs = {name: summary["references"][name]["quality"] for name in ("verifier", "drafter")}
    by_method: dict[str, list[dict]] = {}
    for r in rows:
        if r["method"] != "drafter":  # drawn as a reference line
            by_method.setdefault(r["method"], []).append(r)
    paths = []
    for x_key, xlabel, name, vline in (
        ("rejection", "expected rejection rate TV(q, pi)", "offline_quality_vs_rejection", None),
        ("relative_latency", "analytic latency relative to the verifier", "offline_quality_vs_latency", 1.0),
    ):
        lines = {m: _frontier_line(rs, x_key) for m, rs in by_method.items()}
        path = out / f"{name}.png"
        _plot(
            path,
            f"{task}: offline trade-off (held-out records)",
            xlabel,
            "best P(gold token) under pi at this x, over alpha",
            lines,
            refs,
            vline,
        )
        paths.append(path)
    return paths


def online_plots(out: Path, points: list[OnlinePoint], task: str) -> list[Path]:
    ref = {m: next((p.quality for p in points if p.method == m), None) for m in SKIP_LINES}
    by_method: dict[str, list[OnlinePoint]] = {}
    for p in points:
        if p.method not in SKIP_LINES:
            by_method.setdefault(p.method, []).append(p)
    paths = []
    for x_key, xlabel, name, vline in (
        ("relative_latency", "measured latency per token relative to the verifier", "online_quality_vs_latency", 1.0),
        ("rejection_rate", "measured rejection rate", "online_quality_vs_rejection", None),
    ):
        lines = {}
        for m, ps in by_method.items():
            ps = sorted((p for p in ps if not math.isnan(getattr(p, x_key))), key=lambda p: getattr(p, x_key))
            if ps:
                lines[m] = ([getattr(p, x_key) for p in ps], [p.quality for p in ps])
        path = out / f"{name}.png"
        _plot(path, f"{task}: online, real decoding loop", xlabel, "task metric", lines, ref, vline)
        paths.append(path)
    return paths
