"""Eval outputs: curves.csv, PNG plots and report.md (metrics.json is written by eval/run.py).

Plots: quality vs rejection rate and quality vs analytic relative latency (offline, one line per
method), quality vs measured relative latency and vs measured rejection rate (online, one line per
method across its alphas); the verifier and drafter are dashed reference lines in each.
"""

from __future__ import annotations

import math
from pathlib import Path

from eval.offline import BOUNDS, REFERENCE_METHODS
from eval.online import BASELINES
from eval.paired import divergences
from router.infra.files import write_csv, write_text
from router.rules import rule_names
from router.offline.views import VIEW_TITLES

REFERENCE_STYLE = {"verifier": dict(color="black", linestyle="--"), "drafter": dict(color="grey", linestyle=":")}
SKIP_LINES = ("verifier", "drafter")


def is_learned(name: str) -> bool:
    """Routers (drawn strong and thick) vs rules, baselines and references (drawn pale)."""
    return name not in (*rule_names(), *BASELINES, *REFERENCE_METHODS)


def write_curves_csv(path: Path, rows: list[dict]) -> None:
    write_csv(path, ["stage", "method", "alpha", "rejection", "quality", "top1", "relative_latency"], rows)


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


def write_per_prompt_csv(path: Path, per_prompt: dict[str, list[dict]]) -> None:
    """online_per_prompt.csv: every point's outcome on every prompt (what the paired statistics use)."""
    ref = {e["example_id"]: e.get("new_ids") for e in per_prompt.get("verifier@0", [])}
    rows = [
        {
            "point": name,
            **{k: e.get(k, "") for k in PER_PROMPT_COLUMNS[1:]},
            "same_output_as_verifier": int(e.get("new_ids") == ref.get(e["example_id"])) if ref else "",
        }
        for name, examples in per_prompt.items()
        for e in examples
    ]
    write_csv(path, PER_PROMPT_COLUMNS, rows)


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


def online_plots(out: Path, points: list[dict], task: str) -> list[Path]:
    ref = {m: next((p["quality"] for p in points if p["method"] == m), None) for m in SKIP_LINES}
    by_method: dict[str, list[dict]] = {}
    for p in points:
        if p["method"] not in SKIP_LINES:
            by_method.setdefault(p["method"], []).append(p)
    paths = []
    for x_key, xlabel, name, vline in (
        ("relative_latency", "measured latency per token relative to the verifier", "online_quality_vs_latency", 1.0),
        ("rejection_rate", "measured rejection rate", "online_quality_vs_rejection", None),
    ):
        lines = {}
        for m, ps in by_method.items():
            ps = sorted((p for p in ps if not math.isnan(p[x_key])), key=lambda p: p[x_key])
            if ps:
                lines[m] = ([p[x_key] for p in ps], [p["quality"] for p in ps])
        path = out / f"{name}.png"
        _plot(path, f"{task}: online, real decoding loop", xlabel, "task metric", lines, ref, vline)
        paths.append(path)
    return paths


def _fmt(x) -> str:
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.4f}"
    return str(x)


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


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
                    [n, m["gap_closed"], _ci(m["gap_closed_ci"]), m["normalised_area"], _ci(m["normalised_area_ci"])]
                    for n, m in rows
                ],
            ),
            "",
        ]
    return parts


def _ci(interval) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _pm(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"


def paired_rows(paired: list[dict]) -> list[list]:
    """One row per point: quality, its difference to the verifier with the interval, McNemar p,
    agreement with the verifier, the verifier's log-probability, and rejection offline vs online."""
    rows = []
    for r in paired:
        off = r["offline"]
        quality = f"{r.get('quality', math.nan):.3f} {_ci(r.get('quality_ci', [math.nan] * 2))}"
        rows.append(
            [
                r["method"],
                r["alpha"],
                quality,
                f"{_pm(r.get('quality_diff', math.nan))} {_ci(r.get('quality_diff_ci', [math.nan] * 2))}",
                r.get("mcnemar_p", math.nan),
                r.get("identical_output", math.nan),
                r.get("same_answer", math.nan),
                r.get("verifier_logprob", math.nan),
                r["relative_latency"],
                off["greedy_rejection"],
                off["measured_rejection"],
                off["rejection_ratio"],
            ]
        )
    return rows


PAIRED_HEADER = [
    "method",
    "alpha",
    "quality [95% CI]",
    "diff to verifier [95% CI]",
    "McNemar p",
    "identical output",
    "same answer",
    "verifier log-prob / token",
    "relative latency",
    "offline rejection (greedy)",
    "online rejection",
    "online / offline",
]


def pairwise_section(pairwise: list[dict]) -> list[str]:
    """report.md: `paired_with`, each point against another method's point on the same prompts."""
    return [
        "### Paired with other methods (`paired_with`)",
        "",
        "Difference: the point's quality minus the other's, mean over the same prompts, with a 95% percentile "
        "bootstrap interval over prompts; McNemar: exact two-sided test on the prompts where exactly one is "
        "correct; latency ratio: the point's seconds per token over the other's (< 1: faster).",
        "",
        markdown_table(
            ["point", "against", "prompts", "quality", "diff [95% CI]", "McNemar p", "same answer", "latency ratio"],
            [
                [
                    r["point"],
                    r["against"],
                    r["prompts"],
                    r["quality"],
                    f"{_pm(r['quality_diff'])} {_ci(r['quality_diff_ci'])}",
                    r["mcnemar_p"],
                    r["same_answer"],
                    r["latency_ratio"],
                ]
                for r in pairwise
            ],
        ),
        "",
    ]


def paired_sections(paired: list[dict], online: dict) -> list[str]:
    """report.md: the paired comparison with the verifier, offline vs online, and the time split."""
    n = paired[0].get("prompts", online["prompts"])
    parts = [
        "### Paired with the verifier (same prompts)",
        "",
        f"{n} prompts ({online.get('recorded_test_prompts', n)} from the records' test split, the rest unrecorded "
        f"task examples the split rule holds out). Difference to verifier-only decoding: mean over prompts with a "
        f"95% percentile bootstrap interval over prompts; McNemar: exact two-sided test on the prompts where "
        f"exactly one of the two is correct. Identical output: the same tokens as the verifier's greedy output; "
        f"same answer: the same outcome under the metric (final number / test result). Log-prob: the "
        f"verifier's mean log-probability of the produced tokens (teacher-forced, after decoding). Offline "
        f"rejection: the held-out records' greedy-view rejection rate at the point's alpha.",
        "",
        markdown_table(PAIRED_HEADER, paired_rows(paired)),
        "",
    ]
    parts += [
        "### Offline prediction vs online measurement",
        "",
        markdown_table(
            [
                "method",
                "alpha",
                "offline rejection (t=1)",
                "offline rejection (greedy)",
                "online rejection",
                "online / offline",
                "predicted latency",
                "measured latency",
                "measured / predicted",
            ],
            [
                [
                    r["method"],
                    r["alpha"],
                    r["offline"]["t1_rejection"],
                    r["offline"]["greedy_rejection"],
                    r["offline"]["measured_rejection"],
                    r["offline"]["rejection_ratio"],
                    r["offline"]["predicted_latency"],
                    r["offline"]["measured_latency"],
                    r["offline"]["latency_ratio"],
                ]
                for r in paired
            ],
        ),
        "",
    ]
    far = divergences(paired)
    parts += (
        ["Where they diverge (ratio outside [0.67, 1.5]):", ""] + [f"- {line}" for line in far]
        if far
        else ["Every point's online rejection and latency is within [0.67, 1.5]x of the offline prediction."]
    ) + ["", *DIVERGENCE_NOTES, ""]
    parts += [
        "### Where the time goes (share of each point's wall time)",
        "",
        markdown_table(
            [
                "method",
                "alpha",
                "drafting",
                "verifying",
                "bonus drafter",
                "rule / router",
                "other",
                "relative latency",
                "tokens",
                "batch fill",
                "relative latency (longest rows)",
            ],
            [
                [
                    r["method"],
                    r["alpha"],
                    *[r["time_split"][k] for k in TIME_SPLIT],
                    r["relative_latency"],
                    r["tokens"],
                    r["batch_fill"],
                    r["relative_row_latency"],
                ]
                for r in paired
            ],
        ),
        "",
        f"Batch fill: tokens emitted / (rows x longest row) over the decoding batches of "
        f"{online.get('batch_size', 1)} prompts. A batch decodes until its longest row ends, and a decoding step costs about as much for one "
        f"row as for four, so at batch > 1 a method whose rows end at very different lengths (low fill) pays "
        f"more seconds per token whatever its rejection rate; at batch 1 the fill is 1. Relative latency "
        f"(longest rows): each batch's seconds per token of its longest row, relative to the verifier's: a "
        f"batch takes about as long as its longest row would alone, so this approximates per-prompt latency "
        f"without that confound (equal to the relative latency at batch 1).",
        "",
        f"Shared prompt prefix: {online['shared_prefix']['tokens']} tokens prefilled once per model "
        f"({online['shared_prefix']['seconds']:.1f} s, in no point's time).",
        "",
    ]
    return parts


TIME_SPLIT = ("drafting", "verifying", "bonus_drafter", "rule", "other")
DIVERGENCE_NOTES = [
    "Why offline and online differ: (1) prefixes - the records score every position after the *gold* prefix, online "
    "decoding after its own output (a cascade that defers less drifts to text the records never scored); (2) blocks - "
    "online, a rejection ends the block, so drafts after it are never evaluated, and the rejection rate counts "
    "rejections per evaluated draft, while offline every position counts once; (3) the analytic latency assumes "
    "i.i.d. acceptance, a fixed drafter/verifier cost ratio and no time outside the two models, which the time split "
    "above measures; (4) the t=1 rejection is the expected TV(q, pi) under sampling, the greedy one what argmax "
    "drafting meets, and online decoding here is greedy."
]


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


def write_report(
    path: Path, cfg, offline: dict | None, online: dict | None, plots: list[Path], gamma: dict | None = None
) -> None:
    parts = [
        f"# specroute eval: {cfg.name}",
        "",
        f"Records: {', '.join(cfg.records)}; routers: {', '.join(cfg.routers) or 'none'}; gamma {cfg.gamma}, "
        f"temperature {cfg.temperature}.",
        "",
    ]
    if gamma and "latency" in gamma:  # gamma: auto
        chosen = gamma["gamma"]
        parts += [
            f"gamma {chosen} was chosen on {gamma['machine']} in {gamma['dtype']} at batch {gamma['batch']} "
            f"from the records' acceptance rate {gamma['acceptance']:.3f} and the measured costs (drafter step "
            f"{gamma['drafter_step'] * 1e3:.1f} ms; verifier pass over n = 1..{len(gamma['verify_seconds'])} "
            f"tokens: {', '.join(f'{t * 1e3:.0f}' for t in gamma['verify_seconds'])} ms): expected "
            f"{gamma['latency'][chosen]:.3f}x the verifier's time per token"
            + ("." if gamma["pays"] else "; speculation is NOT expected to pay on this machine."),
            "",
        ]
    if offline:
        s, refs = offline["summary"]["methods"], offline["summary"]["references"]
        parts += [
            "## Offline (held-out records, no model calls)",
            "",
            f"{offline['positions']} test positions; analytic latency with drafter/verifier cost ratio "
            f"{offline['cost_ratio']:.3f} ({offline['cost_ratio_source']}). Quality = probability of the gold "
            f"token under pi; area: 0 = drafter, 1 = cascade oracle.",
            "",
        ]
        keys = [
            "area",
            "best_quality",
            "best_top1",
            "quality_at_25pct",
            "quality_at_50pct",
            "quality_at_75pct",
            "latency_at_verifier_quality",
            "quality_at_verifier_latency",
        ]
        rows = [[m] + [v.get(k, float("nan")) for k in keys] for m, v in s.items()]
        rows.sort(key=lambda r: -r[1] if not math.isnan(r[1]) else math.inf)
        parts += [
            markdown_table(["method", *keys], rows),
            "",
            f"Drafter: quality {refs['drafter']['quality']:.4f}, top-1 {refs['drafter']['top1']:.4f}; verifier: "
            f"quality {refs['verifier']['quality']:.4f}, top-1 {refs['verifier']['top1']:.4f}, rejection "
            f"{refs['verifier']['rejection']:.4f}.",
            "",
        ]
        parts += view_sections(offline["views"])
        parts += consequence_section(offline.get("consequence"))
    if online:
        pts = online["points"]
        parts += [
            "## Online (real decoding loop, task metric)",
            "",
            f"{online['prompts']} held-out prompts, max {cfg.max_new_tokens} new tokens, batch "
            f"{cfg.batch_size}; latency per token relative to verifier-only in the same run. Models in "
            f"{online['dtype']['dtype']} on {online['dtype']['cpu'] if cfg.device == 'cpu' else cfg.device} "
            f"({online['dtype']['reason']}).",
            "",
        ]
        if "mixed" in online["dtype"]:
            parts += [f"Note: {online['dtype']['mixed']}.", ""]
        timed = online.get("timed_on", {})
        if timed.get("machine") and (timed["machine"], timed["dtype"]) != (
            online["dtype"]["cpu"] if cfg.device == "cpu" else timed["machine"],
            online["dtype"]["dtype"],
        ):
            parts += [
                f"Note: every online point was timed by an earlier run on {timed['machine']} in {timed['dtype']} "
                f"and reused as a complete set; the numbers below are that machine's.",
                "",
            ]
        header = [
            "method",
            "alpha",
            "quality",
            "relative latency",
            "verifier calls / token",
            "rejection rate",
            "tokens",
        ]
        parts += [
            markdown_table(
                header,
                [
                    [
                        p["method"],
                        p["alpha"],
                        p["quality"],
                        p["relative_latency"],
                        p["verifier_calls_per_token"],
                        p["rejection_rate"],
                        p["tokens"],
                    ]
                    for p in pts
                ],
            ),
            "",
        ]
        forms = online["tables"]
        parts += [
            "### (a) lowest latency at the verifier's quality, (b) best quality at no more than its latency",
            "",
            markdown_table(
                ["method", "(a) relative latency", "alpha", "(b) quality", "alpha"],
                [
                    [
                        m,
                        f["a_latency_at_verifier_quality"],
                        f["a_alpha"],
                        f["b_quality_at_verifier_latency"],
                        f["b_alpha"],
                    ]
                    for m, f in forms.items()
                ],
            ),
            "",
        ]
        if online.get("paired"):
            parts += paired_sections(online["paired"], online)
        if online.get("pairwise"):
            parts += pairwise_section(online["pairwise"])
    parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    write_text(path, "\n".join(parts))
