"""Paired online comparisons: every method decoded the same prompts, so each is compared with the
verifier prompt by prompt.

Per online point (method, alpha), against the verifier's greedy point of the same run:
- quality difference (mean over prompts of method - verifier) with a 95% percentile bootstrap
  interval over prompts (both outcomes of a prompt resampled together), and for 0/1 metrics the
  exact McNemar p-value (two-sided binomial test on the discordant prompts);
- agreement with the verifier's own output: identical token sequence, and same outcome (the
  metric's `answer`: the final number, the test run's status), each with a bootstrap interval;
- the verifier's mean log-probability of the produced tokens (token-weighted; computed after
  decoding by one teacher-forced verifier pass, eval/online.py) and its difference to the
  verifier's own, with an interval;
- offline vs online: the rejection rate and relative latency the held-out records predict at
  the point's alpha, next to the measured ones, and their ratios;
- where the point's wall time went: drafting, verifying, the bonus-position drafter forward, the
  rule or router, and the rest (sampling, bookkeeping, cache trimming).

`paired_with` (eval config) pairs every point with other methods' points the same way (e.g. a
consequence-label router against the gold-label router and the best rule): quality difference,
its interval and McNemar p, and the latency ratio.
"""

from __future__ import annotations

import math

import numpy as np

from eval.points import REFERENCE, OnlinePoint


def bootstrap_mean(values: np.ndarray, replicates: int, seed: int = 0) -> list[float]:
    """95% percentile interval of the mean of per-prompt values, prompts resampled."""
    values = np.asarray(values, np.float64)
    if len(values) == 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (replicates, len(values)))].mean(1)
    return [float(x) for x in np.quantile(means, [0.025, 0.975])]


def bootstrap_ratio(num: np.ndarray, den: np.ndarray, replicates: int, seed: int = 0) -> list[float]:
    """95% interval of sum(num) / sum(den) with prompts resampled (token-weighted means)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if len(num) == 0 or den.sum() <= 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), (replicates, len(num)))
    ratios = num[idx].sum(1) / np.maximum(den[idx].sum(1), 1e-12)
    return [float(x) for x in np.quantile(ratios, [0.025, 0.975])]


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes (NaN when they are not 0/1)."""
    a, b = np.asarray(a), np.asarray(b)
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        return math.nan
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def _by_prompt(examples: list[dict]) -> dict[str, dict]:
    return {e["example_id"]: e for e in examples}


def logprob_sums(examples: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: summed verifier log-probability of its tokens and their count (0 when unscored)."""
    total = np.array([e.get("verifier_logprob", 0.0) or 0.0 for e in examples], np.float64)
    count = np.array([e.get("verifier_logprob_tokens", 0) for e in examples], np.float64)
    return total, count


def compare_point(mine: list[dict], ref: list[dict], replicates: int, seed: int = 0) -> dict:
    """One point's paired measures against the reference's outcomes on the same prompts."""
    ref_by = _by_prompt(ref)
    pairs = [(e, ref_by[e["example_id"]]) for e in mine if e["example_id"] in ref_by]
    a = np.array([e["quality"] for e, _ in pairs], np.float64)
    b = np.array([r["quality"] for _, r in pairs], np.float64)
    same_output = np.array([e.get("new_ids") == r.get("new_ids") for e, r in pairs], np.float64)
    same_answer = np.array(
        [e.get("answer", e["quality"]) == r.get("answer", r["quality"]) for e, r in pairs], np.float64
    )
    lp, n_lp = logprob_sums([e for e, _ in pairs])
    lp_ref, n_ref = logprob_sums([r for _, r in pairs])
    scored = (n_lp > 0) & (n_ref > 0)
    out = {
        "prompts": len(pairs),
        "quality": float(a.mean()) if len(a) else math.nan,
        "quality_ci": bootstrap_mean(a, replicates, seed),
        "quality_diff": float((a - b).mean()) if len(a) else math.nan,
        "quality_diff_ci": bootstrap_mean(a - b, replicates, seed),
        "mcnemar_p": mcnemar_exact(a, b),
        "identical_output": float(same_output.mean()) if len(a) else math.nan,
        "identical_output_ci": bootstrap_mean(same_output, replicates, seed),
        "same_answer": float(same_answer.mean()) if len(a) else math.nan,
        "same_answer_ci": bootstrap_mean(same_answer, replicates, seed),
    }
    if scored.any():
        mine_lp = lp[scored].sum() / n_lp[scored].sum()
        ref_lp = lp_ref[scored].sum() / n_ref[scored].sum()
        out.update(
            verifier_logprob=float(mine_lp),
            verifier_logprob_ci=bootstrap_ratio(lp[scored], n_lp[scored], replicates, seed),
            logprob_diff=float(mine_lp - ref_lp),
            logprob_prompts=int(scored.sum()),
        )
    else:
        out.update(
            verifier_logprob=math.nan,
            verifier_logprob_ci=[math.nan, math.nan],
            logprob_diff=math.nan,
            logprob_prompts=0,
        )
    return out


def time_split(point: OnlinePoint) -> dict:
    """Shares of the point's wall time: drafting, verifying, bonus-position drafter forwards, the
    rule or router, and the rest."""
    parts = point.time_parts
    wall = point.seconds or math.nan
    if not point.model_seconds:  # an engine that does not split its time by model (vLLM): not measured
        return dict.fromkeys(("drafting", "verifying", "bonus_drafter", "rule", "other"), math.nan)
    split = {
        "drafting": parts["drafter_seconds"] - parts["bonus_drafter_seconds"],
        "verifying": parts["verifier_seconds"],
        "bonus_drafter": parts["bonus_drafter_seconds"],
        "rule": parts["rule_seconds"],
    }
    split["other"] = max(0.0, point.seconds - sum(split.values()))
    return {k: v / wall for k, v in split.items()}


def batch_fill(examples: list[dict], batch_size: int) -> float:
    """Tokens emitted / (rows x longest row) over the point's decoding batches: 1 when every row of
    a batch is as long as its longest; low when one long row keeps a batch decoding alone, which
    raises seconds per token at batch > 1 whatever the method (memory-bound steps cost about the
    same for 1 row as for 4)."""
    tokens = [e["tokens"] for e in examples]
    batches = [tokens[i : i + batch_size] for i in range(0, len(tokens), batch_size)]
    capacity = sum(len(b) * max(b) for b in batches if b)
    return sum(tokens) / capacity if capacity else math.nan


def longest_row_latency(point: OnlinePoint) -> float:
    """Seconds per token of each batch's longest row: sum of batch seconds / sum of longest rows. A
    memory-bound decoding step costs about as much for one row as for all, so a batch takes about as
    long as its longest row alone would: this approximates per-prompt (batch 1) latency without the
    fill confound of seconds per emitted token. Equal to seconds per token at batch 1."""
    batches = point.batches
    longest = sum(b["longest"] for b in batches)
    return sum(b["seconds"] for b in batches) / longest if longest else math.nan


def divergences(rows: list[dict], low: float = 2 / 3, high: float = 1.5) -> list[str]:
    """Plain sentences for the points whose online rejection or latency is far from the offline
    prediction (ratio outside [low, high])."""
    out = []
    for r in rows:
        off = r["offline"]
        for what, ratio, measured, predicted in (
            ("rejection rate", off["rejection_ratio"], off["measured_rejection"], off["greedy_rejection"]),
            ("relative latency", off["latency_ratio"], off["measured_latency"], off["predicted_latency"]),
        ):
            if np.isfinite(ratio) and not low <= ratio <= high:
                out.append(
                    f"{r['point']}: online {what} {measured:.3f} is {ratio:.2f}x the offline prediction {predicted:.3f}"
                )
    return out


def offline_prediction(point: OnlinePoint, curves: dict, greedy: dict, gamma: int, cost_ratio: float) -> dict:
    """What the held-out records predict at the point's alpha (NaN for methods without a curve):
    the temperature-1 expected rejection TV(q, pi) (the curve alphas were matched on), the greedy
    view's rejection (defer and the drafter's argmax differs from the verifier's), and the
    analytic relative latency of the greedy-view rejection; measured / predicted ratios."""
    from eval.offline import relative_latency

    method, alpha = point.method, point.alpha
    t1 = _at_alpha(curves.get(method), alpha)
    g = _at_alpha(greedy.get(method), alpha)
    predicted = float(relative_latency(np.array([g]), gamma, cost_ratio)[0]) if np.isfinite(g) else math.nan
    measured_rej, measured_lat = point.rejection_rate, point.relative_latency
    return {
        "t1_rejection": t1,
        "greedy_rejection": g,
        "measured_rejection": measured_rej,
        "rejection_ratio": _ratio(measured_rej, g),
        "predicted_latency": predicted,
        "measured_latency": measured_lat,
        "latency_ratio": _ratio(measured_lat, predicted),
    }


def _at_alpha(curve, alpha: float) -> float:
    """The curve's rejection at the threshold nearest alpha (point curves: their one point)."""
    if curve is None:
        return math.nan
    thresholds, rejection = np.asarray(curve.threshold, np.float64), np.asarray(curve.rejection, np.float64)
    if len(rejection) == 1:
        return float(rejection[0])
    finite = np.isfinite(thresholds)
    if not finite.any():
        return math.nan
    i = int(np.argmin(np.where(finite, np.abs(thresholds - alpha), np.inf)))
    return float(rejection[i])


def _ratio(a: float, b: float) -> float:
    return a / b if np.isfinite(a) and np.isfinite(b) and b > 0 else math.nan


def paired_table(
    per_prompt: dict[str, list[dict]],
    points: list[OnlinePoint],
    curves: dict,
    greedy: dict,
    gamma: int,
    cost_ratio: float,
    replicates: int,
    batch_size: int = 1,
) -> list[dict]:
    """Every point's row: paired measures vs the verifier, offline vs online, time split."""
    ref = per_prompt.get(REFERENCE, [])  # without a verifier point every paired measure is NaN
    ref_point = next((p for p in points if p.name == REFERENCE), None)
    ref_row_latency = longest_row_latency(ref_point) if ref_point else math.nan
    rows = []
    for p in points:
        name = p.name
        row = {
            "point": name,
            "method": p.method,
            "alpha": p.alpha,
            "relative_latency": p.relative_latency,
            "rejection_rate": p.rejection_rate,
            **compare_point(per_prompt[name], ref, replicates),
        }
        row["offline"] = offline_prediction(p, curves, greedy, gamma, cost_ratio)
        row["time_split"] = time_split(p)
        row["batch_fill"] = batch_fill(per_prompt[name], batch_size)
        row["relative_row_latency"] = _ratio(longest_row_latency(p), ref_row_latency)
        row["tokens"] = p.tokens
        rows.append(row)
    return rows


def points_of(points: list[OnlinePoint], method: str) -> list[str]:
    """The point names (method@alpha) a method was decoded at."""
    return [p.name for p in points if p.method == method]


def pairwise_table(
    per_prompt: dict[str, list[dict]], points: list[OnlinePoint], against: list[str], replicates: int
) -> list[dict]:
    """Every point against every point of each method in `against`, prompt by prompt: the quality
    difference (point - other) with its 95% bootstrap interval over prompts, McNemar p, and the
    ratio of their seconds per token (< 1: the point is faster)."""
    latency = {p.name: p.relative_latency for p in points}
    rows = []
    for method in against:
        for other in points_of(points, method):
            for name in latency:
                if name == other:
                    continue
                c = compare_point(per_prompt[name], per_prompt[other], replicates)
                rows.append(
                    {
                        "point": name,
                        "against": other,
                        "prompts": c["prompts"],
                        "quality": c["quality"],
                        "quality_diff": c["quality_diff"],
                        "quality_diff_ci": c["quality_diff_ci"],
                        "mcnemar_p": c["mcnemar_p"],
                        "same_answer": c["same_answer"],
                        "latency_ratio": _ratio(latency[name], latency[other]),
                    }
                )
    return rows
