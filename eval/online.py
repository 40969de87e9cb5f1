"""Online evaluation: the real decoding loop on held-out task prompts, scored by the task metric.

Every (method, alpha) point decodes the same held-out prompts with `router.decoding`, one at a
time by default (batch 1: the latency a user sees; `batch_size` > 1 left-pads several per call,
every method alike), scores each output with the task's real metric
(router/tasks/metrics.py), and measures wall-clock seconds per generated token, verifier forwards per
token, rejection rate and the time spent outside model forwards. Latency is reported relative to
verifier-only decoding measured in the same run. Each point is written to `online/<point>.json`
as soon as it finishes (atomically), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from router.backends import bridge
from router.infra import clock
from router.infra.distributed import Ranks, barrier, gather
from router.loop.baselines import generate_autoregressive, generate_sequence_cascade, generate_token_cascade
from router.decoding import generate
from router.loop.layout import left_pad, tokenizer_pad_id
from router.loop.prefix import SharedPrefix
from router.tasks.prompts import StopStrings, cut_at_stop, fit_prompt, prompt_text, warn_truncated
from router.infra.files import Journal
from eval.points import (
    REFERENCE,
    OnlinePoint,
    complete_elsewhere,
    point_fingerprint,
    point_name,
    read_points,
    same_fingerprint,
)


@dataclass
class Prompt:
    example_id: str
    ids: list
    meta: dict


@dataclass
class Ends:
    """How every online row is decoded alike: its stop strings (as text, to cut outputs, and as the
    loop's `StopStrings`) and the prompt prefix all prompts share (prefilled once per model before
    any point is timed)."""

    strings: list
    stop: StopStrings | None
    prefix: SharedPrefix | None


def prepare_ends(pair, prompts: list[Prompt], stops: list[str]) -> Ends:
    """Stop strings and the shared prompt prefix, its caches made now so no point pays for them."""
    prefix = SharedPrefix.common([p.ids for p in prompts])
    if prefix is not None:
        for model in (pair.drafter, pair.verifier):
            prefix.ready(model)
    return Ends(list(stops), StopStrings.build(pair.tokenizer, stops), prefix)


def prepare_prompts(tokenizer, examples: list[dict], chat: bool, max_prompts: int, limit: int) -> list[Prompt]:
    """Token ids of the first max_prompts held-out examples, as data_gen formatted them, cut from the
    left to `limit` tokens as recording cuts them (counted and warned)."""
    out, cut = [], 0
    for ex in examples[:max_prompts]:
        text = prompt_text(tokenizer, ex["prompt"], ex.get("question", ""), chat)
        meta = {**ex.get("meta", {}), "reference": ex.get("reference", "")}  # the gold answer, for custom data
        ids, was_cut = fit_prompt(tokenizer.encode(text, add_special_tokens=False), limit)
        cut += was_cut
        out.append(Prompt(ex["example_id"], ids, meta))
    warn_truncated(cut, limit, "online evaluation")
    return out


def _decode_batch(pair, method: str, alpha: float, ids: torch.Tensor, mask: torch.Tensor, cfg, rules: dict, ends: Ends):
    if getattr(pair, "served", None) is not None:  # a served engine: the batch as concurrent requests
        return bridge(cfg.engine).decode(pair, method, alpha, unpadded(ids, mask), cfg, ends.strings, ends.prefix)
    drafter, verifier, _ = pair
    common = dict(**cfg.sampling_kwargs(), attention_mask=mask, stop=ends.stop, prefix=ends.prefix)
    if method == "verifier":
        return generate_autoregressive(verifier, ids, role="verifier", **common)
    if method == "drafter":
        return generate_autoregressive(drafter, ids, role="drafter", **common)
    if method == "token_cascade":
        return generate_token_cascade(drafter, verifier, ids, alpha=alpha, **common)
    if method == "sequence_cascade":
        return generate_sequence_cascade(drafter, verifier, ids, alpha=alpha, **common)
    speculative = {**cfg.generate_kwargs(), **common}  # the eval config is a DecodeOptions
    speculative["gamma"] = cfg.gammas.get(method, speculative["gamma"])  # e.g. FLy's window at its spd_k
    return generate(drafter, verifier, ids, rule=rules.get(method, method), alpha=alpha, **speculative)


# where a point's wall time goes (eval/paired.py splits it): stats keys summed over its batches
TIME_PARTS = ("drafter_seconds", "verifier_seconds", "bonus_drafter_seconds", "rule_seconds")


@dataclass
class PointToDo:
    """A point of the grid this run decodes: where it goes, what it depends on, its batches so far."""

    method: str
    alpha: float
    path: Path
    fingerprint: dict
    journal: Journal  # its finished batches, so a cut run resumes within the point

    @property
    def finished(self) -> dict:
        return {e["start"]: e for e in self.journal.entries if "start" in e}


def decode_interleaved(pair, todo: list[PointToDo], prompts: list[Prompt], cfg, metric, rules: dict, ends: Ends, bar):
    """Every batch of prompts decoded by every point still to do before the next batch, in an order
    that rotates batch by batch: a change in the machine's load (another job starting or ending)
    lands on every method alike instead of on whichever points ran at that time. Each finished batch
    is journaled per point; a rerun decodes only the batches a point lacks."""
    starts = range(0, len(prompts), cfg.batch_size)
    for b, t in clock.interleaved(len(starts), todo):  # the order rotates batch by batch
        start = starts[b]
        batch = prompts[start : start + cfg.batch_size]
        done = t.finished.get(start)
        if done is None or done["ids"] != [p.example_id for p in batch]:
            bar.set_description(f"online {point_name(t.method, t.alpha)}")
            t.journal.append(_decode_and_score(pair, t.method, t.alpha, start, batch, cfg, metric, rules, ends))
        bar.update(len(batch))


def assemble_point(t: PointToDo, prompts: list[Prompt], cfg) -> OnlinePoint:
    """A point from its journaled batches, in prompt order: every prompt's outcome and the sums."""
    finished = t.finished
    per_example, batches, totals = [], [], dict.fromkeys(BATCH_TOTALS, 0)
    for start in range(0, len(prompts), cfg.batch_size):
        done = finished[start]
        per_example += done["rows"]
        batches.append(done["batch"])
        for k in BATCH_TOTALS:
            totals[k] += done["totals"].get(k, 0)
    return _point(t.method, t.alpha, prompts, cfg, per_example, batches, totals)


def recheck_reference(pair, point: OnlinePoint, prompts: list[Prompt], cfg, metric, rules: dict, ends: Ends) -> None:
    """The first batch of a point decoded once more at the end of the grid, timed again: when the
    two timings disagree, the machine's speed changed during the run (eval/points.py warns)."""
    again = _decode_and_score(pair, point.method, point.alpha, 0, prompts[: cfg.batch_size], cfg, metric, rules, ends)
    point.recheck = {"first_seconds": point.batches[0]["seconds"], "again_seconds": again["batch"]["seconds"]}


def _retime_reused_reference(pair, grid, paths, done, mine, prompts, cfg, metric, rules, ends, ranks) -> None:
    """A run that decodes some points and reuses the reference (verifier) point from an earlier run compares
    timings taken hours apart: the reference's first batch is timed once more in this run (`recheck`, with
    `reused`), so a change of the machine's speed between the runs is measured and warned about."""
    if not ranks.main or not mine or any(t.method == "verifier" for t in mine):
        return
    names = [point_name(m, a) for m, a in grid]
    if REFERENCE not in names or done[names.index(REFERENCE)] is None:
        return
    i = names.index(REFERENCE)
    ref, path = done[i], paths[i]
    recheck_reference(pair, ref, prompts, cfg, metric, rules, ends)
    ref.recheck["reused"] = True
    ref.write(path)


# measurements a point sums over its batches; TIME_PARTS split its wall time (eval/paired.py)
BATCH_TOTALS = ("new_tokens", "wall_seconds", "verifier_row_forwards", "drafts_evaluated", "rejections", *TIME_PARTS)


def _decode_and_score(
    pair, method: str, alpha: float, start: int, batch: list[Prompt], cfg, metric, rules: dict, ends: Ends
) -> dict:
    """One decoding call: each prompt's output and outcome, the call's time and its measurements, as
    plain JSON values (a journal entry)."""
    tokenizer = pair.tokenizer
    ids, mask = left_pad([p.ids for p in batch], tokenizer_pad_id(tokenizer))
    out = _decode_batch(pair, method, alpha, ids, mask, cfg, rules, ends)
    rows = []
    for b, (prompt, new) in enumerate(zip(batch, out.new_tokens())):  # padding after each row's end excluded
        n_new = len(new)
        text = cut_at_stop(tokenizer.decode(new, skip_special_tokens=True), ends.strings)
        row = {
            "example_id": prompt.example_id,
            "text": text,
            "tokens": n_new,
            "new_ids": new,
            **metric(text, prompt.meta),
        }
        if out.verifier_logprobs is not None:  # computed by the loop itself (verifier-only, speculative)
            row.update(verifier_logprob=float(sum(out.verifier_logprobs[b])), verifier_logprob_tokens=n_new)
        rows.append(row)
    entry = {
        "start": start,
        "ids": [p.example_id for p in batch],
        "rows": rows,
        "batch": {"seconds": out.stats["wall_seconds"], "longest": max(r["tokens"] for r in rows)},
        "totals": {k: out.stats.get(k, 0) for k in BATCH_TOTALS},
    }
    return json.loads(json.dumps(entry, default=float))  # as a journal reads it back


def _point(
    method: str, alpha: float, prompts: list[Prompt], cfg, per_example: list[dict], batches: list[dict], totals: dict
) -> OnlinePoint:
    """A point's record: mean scores, summed measurements and every prompt's outcome."""
    n_tok = max(totals["new_tokens"], 1)
    seconds = totals["wall_seconds"]
    score_keys = [k for k in per_example[0] if k not in ("example_id", "text", "tokens", "new_ids", "answer")]
    model_seconds = totals["drafter_seconds"] + totals["verifier_seconds"]
    drafts = totals["drafts_evaluated"]
    return OnlinePoint(
        method=method,
        alpha=alpha,
        prompts=len(prompts),
        batch_size=cfg.batch_size,
        scores={k: float(np.mean([e[k] for e in per_example])) for k in score_keys},
        tokens=totals["new_tokens"],
        seconds=seconds,
        model_seconds=model_seconds,
        time_parts={k: totals[k] for k in TIME_PARTS},
        batches=batches,
        seconds_per_token=seconds / n_tok,
        verifier_calls_per_token=totals["verifier_row_forwards"] / n_tok,
        rejection_rate=totals["rejections"] / drafts if drafts else float("nan"),
        outside_model_fraction=_outside_model(seconds, model_seconds),
        examples=per_example,
    )


def _outside_model(seconds: float, model_seconds: float) -> float:
    """The share of wall time outside model forwards; nan where the engine does not split its time (vLLM)."""
    if not seconds:
        return 0.0
    return max(0.0, 1 - model_seconds / seconds) if model_seconds else float("nan")


def run_grid(
    pair,
    grid: list[tuple[str, float]],
    prompts: list[Prompt],
    cfg,
    metric,
    rules: dict,
    folder: Path,
    fingerprint: dict,
    ends: Ends,
    ranks: Ranks = Ranks(),
) -> list[OnlinePoint] | None:
    """Every grid point in grid order, resuming from finished point files with the same fingerprint.
    Under torchrun the points still to do are shared out by rank (router/infra/distributed.py); after a
    barrier rank 0 reads every point back and the other ranks get None."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{point_name(method, alpha)}.json" for method, alpha in grid]
    done = read_points(paths)
    fps = [point_fingerprint(fingerprint, method) for method, _ in grid]
    complete = complete_elsewhere(done, fps)
    if complete:
        print(
            f"[specroute] every online point was finished on {complete['machine']} in {complete['dtype']} "
            f"(this machine: {fingerprint['machine']} in {fingerprint['dtype']}): reusing the whole set"
        )
        return done if ranks.main else None
    todo = [
        (method, alpha, path, fp)
        for (method, alpha), path, point, fp in zip(grid, paths, done, fps)
        if point is None or not same_fingerprint(point.fingerprint, fp)
    ]
    todo = gather(todo)[0]  # rank 0's list: another rank may already have written a point when rank 0 looks
    mine = [
        PointToDo(m, a, path, fp, Journal(batches_path(path), batch_fingerprint(fp)))
        for m, a, path, fp in ranks.mine(todo)
    ]
    for t in mine:
        if t.journal.entries:
            print(
                f"[specroute] {point_name(t.method, t.alpha)}: resuming after {len(t.journal.entries)} finished batches"
            )
    bar = tqdm(total=len(mine) * len(prompts), desc="online", unit="prompt")
    decode_interleaved(pair, mine, prompts, cfg, metric, rules, ends, bar)
    for t in mine:
        point = assemble_point(t, prompts, cfg)
        point.fingerprint = t.fingerprint
        if point.name == REFERENCE:  # timed again now that every other point is done
            recheck_reference(pair, point, prompts, cfg, metric, rules, ends)
        point.write(t.path)
        if t.journal.stale is not None:  # batches of other settings: never mixed in
            t.journal.stale.unlink(missing_ok=True)
    _retime_reused_reference(pair, grid, paths, done, mine, prompts, cfg, metric, rules, ends, ranks)
    bar.close()
    barrier()  # every rank's points are on disk
    return read_points(paths) if ranks.main else None


def batches_path(point_path: Path) -> Path:
    """A point's batch journal (`<point>.batches.jsonl`): kept after the point is written, so a rerun
    with more prompts (max_prompts raised, the same prompts first) decodes only the new batches."""
    return point_path.with_suffix(".batches.jsonl")


def batch_fingerprint(point_fp: dict) -> dict:
    """What one journaled batch depends on: the point's fingerprint but the prompt list (each batch
    names its own prompt ids and is reused only where they match), so the prompt list can grow."""
    return {k: v for k, v in point_fp.items() if k != "prompts"}


def _output_key(example: dict) -> tuple:
    return example["example_id"], tuple(example["new_ids"])


# what the verifier's log-probability of an output depends on, beside the prompt and the output themselves
SCORED_KEYS = ("models", "dtype", "engine", "device", "verifier_device_map", "machine")


def add_verifier_logprobs(
    pair,
    points: list[OnlinePoint],
    prompts: list[Prompt],
    ends: Ends,
    folder: Path,
    batch_size: int,
    fingerprint: dict,
) -> float:
    """The verifier's log-probability of every produced token, summed per prompt
    (`verifier_logprob`, `verifier_logprob_tokens` in each example of each point file), where the
    loop did not compute it itself (drafter-only, the token and sequence cascades): one
    teacher-forced verifier pass per distinct output (identical outputs of two methods are scored
    once), after decoding so no latency includes it. Points already scored are skipped, and each
    point file is rewritten (atomically) when its examples are scored: an interrupted run resumes.
    Every score is also kept in `online/verifier_logprobs.jsonl` (under the parts of the run's `fingerprint` it
    depends on), so a run grown to more prompts, or reported at fewer, scores only outputs it has not scored before.
    Returns the seconds spent."""
    started = clock.now()
    prompt_ids = {p.example_id: p.ids for p in prompts}
    kept = Journal(folder / "verifier_logprobs.jsonl", {k: fingerprint.get(k) for k in SCORED_KEYS})
    saved = {e["key"]: (e["logprob"], e["tokens"]) for e in kept.entries}
    known = {
        _output_key(e): (e["verifier_logprob"], e["verifier_logprob_tokens"])
        for p in points
        for e in p.examples
        if "verifier_logprob" in e
    }
    todo = [p for p in points if any("verifier_logprob" not in e for e in p.examples)]
    for point in tqdm(todo, desc="verifier log-probs", unit="point", disable=not todo):
        wanted = list(dict.fromkeys(_output_key(e) for e in point.examples if _output_key(e) not in known))
        digests = {k: _digest(prompt_ids, k) for k in wanted}
        known.update({k: saved[d] for k, d in digests.items() if d in saved})
        fresh = _score_outputs(pair, [k for k in wanted if k not in known], prompt_ids, ends, batch_size)
        for key, (total, n) in fresh.items():
            kept.append({"key": digests[key], "logprob": total, "tokens": n})
        known.update(fresh)
        for e in point.examples:
            e["verifier_logprob"], e["verifier_logprob_tokens"] = known[_output_key(e)]
        point.write(folder / f"{point.name}.json")
    return clock.now() - started


def _digest(prompt_ids: dict, key: tuple) -> str:
    """A scored output's name in verifier_logprobs.jsonl: its prompt's tokens and its own."""
    example_id, output = key
    return hashlib.sha256(json.dumps([prompt_ids[example_id], list(output)]).encode()).hexdigest()[:24]


def _score_outputs(pair, wanted: list[tuple], prompt_ids: dict, ends: Ends, batch_size: int) -> dict:
    """(summed verifier log-prob, tokens) of each (example_id, output ids), `batch_size` per pass."""
    from router.loop.common import shared_vocab
    from router.loop.teacher import continuation_logprobs

    vocab = shared_vocab(pair.drafter, pair.verifier)
    scores = {w: (0.0, 0) for w in wanted if not w[1]}  # an empty output has nothing to score
    scored = [w for w in wanted if w[1]]
    for start in range(0, len(scored), batch_size):
        chunk = scored[start : start + batch_size]
        outputs = [list(t) for _, t in chunk]
        prompts = [prompt_ids[i] for i, _ in chunk]
        pad = tokenizer_pad_id(pair.tokenizer)
        sums = continuation_logprobs(pair.verifier, prompts, outputs, vocab, pad, ends.prefix)
        scores.update({key: (total, len(out)) for key, total, out in zip(chunk, sums, outputs)})
    return scores


def unpadded(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's prompt tokens without the left padding. ids, mask: (B, T)"""
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]
