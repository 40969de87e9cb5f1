"""The online half of eval's report: report.md sections and their terminal twins, read from
metrics.json's `online` entry (its points, their paired comparison with the verifier and with the
`paired_with` methods; eval/paired.py computes them).
"""

from __future__ import annotations

from eval.paired import divergences
from eval.tables import ci, markdown_table, plus_minus
from router.backends import DEFAULT_ENGINE, ENGINES

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


def online_sections(online: dict, cfg) -> list[str]:
    """report.md: the online points, the paper's two table forms, and the paired comparisons."""
    parts = ["## Online (real decoding loop, task metric)", "", _setting(online, cfg), ""]
    parts += _notes(online)
    keys = ["method", "alpha", "quality", "relative_latency", "verifier_calls_per_token", "rejection_rate", "tokens"]
    header = ["method", "alpha", "quality", "relative latency", "verifier calls / token", "rejection rate", "tokens"]
    parts += [markdown_table(header, [[p[k] for k in keys] for p in online["points"]])]
    forms = [
        [m, f["a_latency_at_verifier_quality"], f["a_alpha"], f["b_quality_at_verifier_latency"], f["b_alpha"]]
        for m, f in online["tables"].items()
    ]
    parts += [
        "",
        "### (a) lowest latency at the verifier's quality, (b) best quality at no more than its latency",
        "",
        markdown_table(["method", "(a) relative latency", "alpha", "(b) quality", "alpha"], forms),
        "",
    ]
    if online["paired"]:
        parts += paired_sections(online["paired"], online)
    if online["pairwise"]:
        parts += pairwise_section(online["pairwise"])
    return parts


def _setting(online: dict, cfg) -> str:
    dtype = online["dtype"]
    where = dtype["cpu"] if cfg.device == "cpu" else cfg.device
    if dtype.get("setting"):  # an engine's own line: its threads (and kernels, drafts per step) beside every figure
        where += f", {dtype['setting']}"
    return (
        f"{online['prompts']} held-out prompts, max {cfg.max_new_tokens} new tokens, batch {cfg.batch_size}; "
        f"latency per token relative to verifier-only (timed in the same run, or retimed: see warnings). Models in {dtype['dtype']} on {where} "
        f"({dtype['reason']})."
    )


def _notes(online: dict) -> list[str]:
    """Where the numbers come from, when not simply from this run on this machine, and timings that
    fail their plausibility checks."""
    parts = [f"Note: {online['dtype']['mixed']}.", ""] if "mixed" in online["dtype"] else []
    for warning in online["timing_warnings"]:
        parts += [f"**Timing warning**: {warning}.", ""]
    timed = online["timed_on"]
    if timed.get("elsewhere"):  # compared with this run's own fingerprint (eval.points.timed_on)
        engine = ENGINES.get(online["dtype"].get("engine", DEFAULT_ENGINE))
        how = engine.label if engine is not None and engine.own_weights else timed["dtype"]  # its files' own types
        parts += [
            f"Note: every online point was timed by an earlier run on {timed['machine']} ({how}) and reused as a "
            f"complete set; the numbers below are that machine's.",
            "",
        ]
    return parts


def paired_rows(paired: list[dict]) -> list[list]:
    """One row per point: quality, its difference to the verifier with the interval, McNemar p,
    agreement with the verifier, the verifier's log-probability, and rejection offline vs online."""
    return [
        [
            r["method"],
            r["alpha"],
            f"{r['quality']:.3f} {ci(r['quality_ci'])}",
            f"{plus_minus(r['quality_diff'])} {ci(r['quality_diff_ci'])}",
            r["mcnemar_p"],
            r["identical_output"],
            r["same_answer"],
            r["verifier_logprob"],
            r["relative_latency"],
            r["offline"]["greedy_rejection"],
            r["offline"]["measured_rejection"],
            r["offline"]["rejection_ratio"],
        ]
        for r in paired
    ]


def prompt_source(online: dict) -> str:
    """Where the online prompts came from, in words."""
    if online.get("prompts_file"):
        return f"from {online['prompts_file']}: task examples the records and the routers' records did not learn from"
    return (
        f"{online['recorded_test_prompts']} from the records' test split, the rest unrecorded task examples the "
        f"split rule holds out"
    )


def paired_sections(paired: list[dict], online: dict) -> list[str]:
    """report.md: the paired comparison with the verifier, offline vs online, and the time split."""
    n = paired[0]["prompts"]
    parts = [
        "### Paired with the verifier (same prompts)",
        "",
        f"{n} prompts ({prompt_source(online)}). Difference to verifier-only decoding: mean over prompts with a "
        f"95% percentile bootstrap interval over prompts; McNemar: exact two-sided test on the prompts where "
        f"exactly one of the two is correct. Identical output: the same tokens as the verifier's greedy output; "
        f"same answer: the same outcome under the metric (final number / test result). Log-prob: the "
        f"verifier's mean log-probability of the produced tokens (teacher-forced, after decoding). Offline "
        f"rejection: the held-out records' greedy-view rejection rate at the point's alpha.",
        "",
        markdown_table(PAIRED_HEADER, paired_rows(paired)),
        "",
    ]
    return parts + _prediction_section(paired) + _time_section(paired, online)


PREDICTION_KEYS = (
    "t1_rejection",
    "greedy_rejection",
    "measured_rejection",
    "rejection_ratio",
    "predicted_latency",
    "measured_latency",
    "latency_ratio",
)
PREDICTION_HEADER = [
    "offline rejection (t=1)",
    "offline rejection (greedy)",
    "online rejection",
    "online / offline",
    "predicted latency",
    "measured latency",
    "measured / predicted",
]


def _prediction_section(paired: list[dict]) -> list[str]:
    """Offline prediction vs online measurement, and where they diverge."""
    rows = [[r["method"], r["alpha"], *[r["offline"][k] for k in PREDICTION_KEYS]] for r in paired]
    far = divergences(paired)
    parts = [
        "### Offline prediction vs online measurement",
        "",
        markdown_table(["method", "alpha", *PREDICTION_HEADER], rows),
        "",
    ]
    if far:
        parts += ["Where they diverge (ratio outside [0.67, 1.5]):", ""] + [f"- {line}" for line in far]
    else:
        parts += ["Every point's online rejection and latency is within [0.67, 1.5]x of the offline prediction."]
    return parts + ["", *DIVERGENCE_NOTES, ""]


TIME_HEADER = [
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
]


def _time_section(paired: list[dict], online: dict) -> list[str]:
    """Where each point's wall time goes, its batch fill and its per-row latency."""
    rows = [
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
    ]
    prefix = online["shared_prefix"]
    return [
        "### Where the time goes (share of each point's wall time)",
        "",
        markdown_table(TIME_HEADER, rows),
        "",
        f"Batch fill: tokens emitted / (rows x longest row) over the decoding batches of {online['batch_size']} "
        f"prompts. A batch decodes until its longest row ends, and a decoding step costs about as much for one "
        f"row as for four, so at batch > 1 a method whose rows end at very different lengths (low fill) pays "
        f"more seconds per token whatever its rejection rate; at batch 1 the fill is 1. Relative latency "
        f"(longest rows): each batch's seconds per token of its longest row, relative to the verifier's: a "
        f"batch takes about as long as its longest row would alone, so this approximates per-prompt latency "
        f"without that confound (equal to the relative latency at batch 1).",
        "",
        f"Shared prompt prefix: {prefix['tokens']} tokens prefilled once per model "
        f"({prefix['seconds']:.1f} s, in no point's time).",
        "",
    ]


def pairwise_section(pairwise: list[dict]) -> list[str]:
    """report.md: `paired_with`, each point against another method's point on the same prompts."""
    keys = ["point", "against", "prompts", "quality"]
    rows = [
        [*[r[k] for k in keys], f"{plus_minus(r['quality_diff'])} {ci(r['quality_diff_ci'])}"]
        + [r["mcnemar_p"], r["same_answer"], r["latency_ratio"]]
        for r in pairwise
    ]
    return [
        "### Paired with other methods (`paired_with`)",
        "",
        "Difference: the point's quality minus the other's, mean over the same prompts, with a 95% percentile "
        "bootstrap interval over prompts; McNemar: exact two-sided test on the prompts where exactly one is "
        "correct; latency ratio: the point's seconds per token over the other's (< 1: faster).",
        "",
        markdown_table(
            [*keys, "diff [95% CI]", "McNemar p", "same answer", "latency ratio"],
            rows,
        ),
        "",
    ]


def online_lines(online: dict) -> list[str]:
    """The terminal's online table: quality, difference to the verifier with its 95% interval over
    prompts, agreement with the verifier, latency, and rejection offline (greedy view) vs online."""
    w = max([16, *(len(r["method"]) + 2 for r in online["paired"])])  # long router names stay apart
    lines = [
        f"online, {online['prompts']} held-out prompts, batch {online['batch_size']}; diff: 95% paired "
        f"bootstrap interval over prompts; rel. lat: seconds per token vs the verifier; row lat: per token of "
        f"each batch's longest row; rej off/on: rejection predicted by the records (greedy) / measured",
        f"{'method':<{w}}{'alpha':>8}{'quality [95% CI]':>24}{'diff to verifier':>26}{'same out':>10}"
        f"{'same ans':>10}{'logp/tok':>10}{'rel. lat':>10}{'row lat':>9}{'rej off':>9}{'rej on':>8}",
    ]
    for r in online["paired"]:
        lo, hi = r["quality_diff_ci"]
        q_lo, q_hi = r["quality_ci"]
        lines.append(
            f"{r['method']:<{w}}{r['alpha']:>8.3g}{r['quality']:>9.3f} [{q_lo:.3f}, {q_hi:.3f}]"
            f"{r['quality_diff']:>+11.3f} [{lo:+.3f}, {hi:+.3f}]"
            f"{r['identical_output']:>10.3f}{r['same_answer']:>10.3f}"
            f"{r['verifier_logprob']:>10.3f}{r['relative_latency']:>10.3f}"
            f"{r['relative_row_latency']:>9.3f}"
            f"{r['offline']['greedy_rejection']:>9.3f}{r['offline']['measured_rejection']:>8.3f}"
        )
    lines += [f"TIMING WARNING: {w}" for w in online["timing_warnings"]]
    return lines + pairwise_lines(online["pairwise"])


def pairwise_lines(pairwise: list[dict]) -> list[str]:
    """The terminal's `paired_with` table: each point against another method's point on the same prompts."""
    if not pairwise:
        return []
    w, v = (max(len(r[k]) for r in pairwise) + 2 for k in ("point", "against"))  # long router names stay apart
    lines = [
        "",
        "paired with other methods (diff: point - other, 95% paired bootstrap interval over prompts; "
        "lat ratio: point / other seconds per token)",
        f"{'point':<{w}}{'against':<{v}}{'diff [95% CI]':>26}{'McNemar p':>11}{'lat ratio':>11}",
    ]
    for r in pairwise:
        lo, hi = r["quality_diff_ci"]
        lines.append(
            f"{r['point']:<{w}}{r['against']:<{v}}{r['quality_diff']:>+10.3f} [{lo:+.3f}, {hi:+.3f}]"
            f"{r['mcnemar_p']:>11.4g}{r['latency_ratio']:>11.3f}"
        )
    return lines
