"""`specroute gen`: task examples -> token-level record shards + manifest (docs/usage.md).

Examples are split deterministically by id (seeded hash), grouped by split into shards of
`examples_per_shard` (data_gen/plan.py), and each shard is scored by the recorder
(data_gen/recorder.py) and written atomically (data_gen/record_folder.py). A rerun skips the finished
shards (resume); a complete folder is left alone unless `overwrite`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from data_gen.config import GenConfig
from data_gen.consequence import summary_line
from data_gen.record_folder import (
    commit_config,
    finish_manifest,
    intact_shard,
    prepare_folder,
    write_shard_counts,
    write_shard_or_explain,
)
from data_gen.plan import load_examples, plan_shards, recorded_shards, write_examples
from data_gen.recorder import Recorder
from router.infra import clock
from router.infra.config import ConfigError
from router.infra.console import summary_table
from router.infra.distributed import barrier, gather, start
from router.infra.files import output_lock
from router.tasks.metrics import check_metric_fields
from router.records import Manifest, RecordsError, read_manifest


def run_gen(cfg: GenConfig, recorder: Recorder | None = None) -> dict:
    """`specroute gen`: holds a lock on cfg.output for the whole run (a second writer is refused)."""
    with output_lock(cfg.output, "gen"):  # a refused run leaves no folder it created behind
        return _run_gen(cfg, recorder)


def _run_gen(cfg: GenConfig, recorder: Recorder | None = None) -> dict:
    """Record a task into cfg.output; returns the manifest (and prints a summary). Under torchrun each
    rank records every world-th shard and rank 0 writes the manifest (router/infra/distributed.py)."""
    out = Path(cfg.output)
    ranks = start(cfg.device)
    if _on_main(ranks, lambda: prepare_folder(out, cfg)):
        barrier()
        manifest = read_manifest(out)
        print(f"{out} is complete (manifest {manifest.id}); nothing to do (overwrite=true to redo)")
        return manifest
    examples = load_examples(cfg)
    if "consequence" in cfg.modes:  # answers are judged by the task metric: every example judgeable first
        for ex in examples:
            check_metric_fields(cfg.metric or cfg.task, ex.meta, ex.example_id)
    plan = plan_shards(examples, cfg, recorded_shards(out))  # a grown folder keeps every finished shard
    recorder = recorder or Recorder(replace(cfg, device=ranks.device(cfg.device)))  # loads (or refuses) the models
    if ranks.main:  # only now, with nothing left to refuse the run, does the folder take this config
        commit_config(out, cfg)
        write_examples(out, plan, cfg)
    mine = ranks.mine(plan)  # shard k to rank k mod world: each shard's batches are what one process makes
    recorder.share_prefix(examples)
    started, tokens_done = clock.now(), 0
    bar = tqdm(total=sum(len(s[2]) for s in mine), desc=f"gen {cfg.task}{_rank_label(ranks)}", unit="ex")
    if recorder.search is not None:  # a consequence search takes minutes per batch: show its rounds
        recorder.search.report = bar.set_postfix_str
    for name, split, shard_examples in mine:
        ids = [ex.example_id for ex in shard_examples]
        if intact_shard(out, name, ids) is not None:  # finished by an earlier run, and unchanged since
            bar.update(len(shard_examples))
            continue
        rows, before = [], dict(recorder.counts)
        shard_started, shard_cpu = clock.now(), time.process_time()
        for i in range(0, len(shard_examples), cfg.batch_size):
            batch = shard_examples[i : i + cfg.batch_size]
            for mode in cfg.modes:
                new_rows = recorder.record_batch(batch, split, mode)
                tokens_done += sum(len(r["token"]) for r in new_rows)
                rows += new_rows
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{tokens_done / (clock.now() - started):.0f}")
        if rows:
            write_shard_or_explain(out, name, rows, ids)
        _count_shard_time(recorder.counts, clock.now() - shard_started, time.process_time() - shard_cpu)
        write_shard_counts(
            out, name, recorder.counts, before, ranks, recorder.dtype.as_dict()
        )  # the manifest sums them, resumes included
    bar.close()
    barrier()  # every rank's shards are on disk before rank 0 sums them
    if ranks.main:
        manifest = finish_manifest(out, cfg, plan, recorder, clock.now() - started)
        print_summary(manifest)
    barrier()
    return read_manifest(out)


def _count_shard_time(counts: dict, wall: float, cpu: float) -> None:
    """Seconds a shard took, whole (answers, searches, record rows, writing): wall time, and this process's
    CPU time, which a pause (SIGSTOP) or other jobs' load does not inflate (studies/label_rate.py reads both)."""
    counts["shard_seconds"] = counts.get("shard_seconds", 0.0) + wall
    counts["shard_cpu_seconds"] = counts.get("shard_cpu_seconds", 0.0) + cpu


def _on_main(ranks, decide):
    """decide() on rank 0, its answer (or its error, raised on every rank) shared with every rank."""
    result = None
    if ranks.main:
        try:
            result = ("ok", decide())
        except (ConfigError, RecordsError, ValueError) as err:
            result = ("error", err)
    kind, value = gather(result)[0]
    if kind == "error":
        raise value
    return value


def _rank_label(ranks) -> str:
    return f" (rank {ranks.rank}/{ranks.world})" if ranks.world > 1 else ""


def print_summary(manifest: Manifest) -> None:
    counts = manifest.counts
    if counts["truncated_prompts"] or counts["skipped_long"] or counts["skipped_empty"]:
        warnings.warn(
            f"{counts['truncated_prompts']} prompts truncated from the left, {counts['skipped_long']} "
            f"skipped as too long, {counts['skipped_empty']} skipped for an empty prompt or reference"
        )
    rows = [
        ("task", f"{manifest.task} ({', '.join(manifest.modes)})"),
        ("examples", ", ".join(f"{s} {v['examples']}" for s, v in manifest.splits.items())),
        ("tokens", str(manifest.tokens)),
        ("bytes / token", f"{manifest.bytes_per_token:.0f}"),
        ("drafter/verifier top-1 agreement", f"{manifest.drafter_verifier_top1_agreement:.3f}"),
        (
            "gold top-1 accuracy",
            f"drafter {manifest.gold_top1_accuracy['drafter']:.3f}, "
            f"verifier {manifest.gold_top1_accuracy['verifier']:.3f}",
        ),
        ("seconds", f"{manifest.seconds:.1f}"),
    ]
    if manifest.consequence:
        rows.insert(-1, ("consequence labels", summary_line(manifest.consequence)))
    print("\n" + summary_table(rows))
