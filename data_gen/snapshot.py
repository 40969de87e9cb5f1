"""A readable copy of a recording still in progress: its finished shards, with a manifest (`specroute snapshot`).

A long labelling run (hours on 2 CPU cores) writes manifest.json only when it finishes; until then its folder
cannot be read by train or eval. `snapshot_recording` copies the finished shards (and the folder's config and
example files) to a new folder and writes the manifest a finished run would write for them, so cross-fitted
training and out-of-fold evaluation can use the labels so far. The source folder is only read: the recording
goes on (and resumes) there. Loads the pair once (the manifest records its fingerprints).

`leave_out` (shard-name globs, e.g. 'test-*' 'train-0005[2-8]') copies a finished folder without the matching
shards and lists only the copied examples in examples.jsonl, so `specroute prompts DST` returns the left-out
problems as held-out online prompts: a router trained on DST, its alphas matched on DST's validation split,
never saw them.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

COPIED_FILES = ("gen_config.json", "examples.jsonl", "heldout.jsonl")
SHARD_SUFFIXES = ("", ".json", ".counts.json")  # a shard, its receipt, its label counts


def snapshot_recording(source: str | Path, dest: str | Path, leave_out: list[str] = ()) -> dict:
    """Copy `source`'s finished shards (less those `leave_out` names) to the new folder `dest` with a manifest;
    returns what was copied: shards, planned, examples, manifest id, consequence labels, left-out shards and
    examples. A bad request (dest exists, no finished shard, a pattern naming nothing, a gap) is a ValueError
    naming the fix, raised before anything is written."""
    from data_gen.config import GenConfig
    from data_gen.plan import load_examples, plan_shards, recorded_shards, write_examples
    from data_gen.record_folder import finish_manifest, intact_shard
    from data_gen.recorder import Recorder

    src, dst = Path(source), Path(dest)
    if dst.exists():
        raise ValueError(f"{dst} exists: name a new folder (a snapshot never writes into an existing one)")
    if not (src / "gen_config.json").exists():
        raise ValueError(f"{src} is not a recording (no gen_config.json): name the output folder of `specroute gen`")
    raw = json.loads((src / "gen_config.json").read_text())
    cfg = GenConfig(**{**raw, "output": str(dst)})
    plan = plan_shards(load_examples(cfg), cfg, recorded_shards(src))  # a grown folder's short shards too
    done = [s for s in plan if intact_shard(src, s[0], [ex.example_id for ex in s[2]]) is not None]
    left_out = _left_out(src, done, list(leave_out))
    done = [s for s in done if s not in left_out]
    if not done:
        raise ValueError(f"{src} has no finished shard yet (or every one is left out): wait for its first shard")
    dst.mkdir(parents=True)
    _copy(src, dst, done)
    if left_out:  # examples.jsonl lists the copied examples only (gen's own writer): the left-out ones count
        write_examples(dst, done, cfg)  # as unrecorded; heldout.jsonl remade to match
    manifest = finish_manifest(dst, cfg, done, Recorder(cfg), seconds=0.0)
    return {
        "shards": len(done),
        "planned": len(plan),
        "examples": sum(len(s[2]) for s in done),
        "manifest": manifest.id,
        "consequence": manifest.consequence,
        "left_out_shards": len(left_out),
        "left_out_examples": sum(len(s[2]) for s in left_out),
    }


def _left_out(src: Path, done: list, patterns: list[str]) -> list:
    """The finished shards the patterns name; every pattern must name one, and what stays must have no gap."""
    left_out = [s for s in done if any(_names(s[0], p) for p in patterns)]
    unmatched = [p for p in patterns if not any(_names(s[0], p) for s in done)]
    if unmatched:
        example = Path(done[0][0]).stem if done else "train-00000"
        raise ValueError(f"--leave-out {unmatched[0]!r} names no finished shard of {src} (e.g. {example})")
    gap = _first_gap([s for s in done if s not in left_out])
    if gap:
        raise ValueError(
            f"--leave-out leaves a gap before {gap} (a split's shards must number from 00000 on): "
            f"leave out the last shards of a split, or all of it"
        )
    return left_out


def _copy(src: Path, dst: Path, done: list) -> None:
    for name in COPIED_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    for name, _, _ in done:
        for suffix in SHARD_SUFFIXES:
            if (src / f"{name}{suffix}").exists():
                shutil.copy2(src / f"{name}{suffix}", dst / f"{name}{suffix}")


def _first_gap(done: list) -> str | None:
    """The first copied shard whose split has a shard missing before it (readers refuse such a folder)."""
    for split in {s[1] for s in done}:
        names = sorted(Path(s[0]).name for s in done if s[1] == split)
        for i, name in enumerate(names):
            if name != f"{split}-{i:05d}.arrow":
                return name
    return None


def _names(shard: str, pattern: str) -> bool:
    """A shard file (train-00051.arrow) matched by a glob on its name, with or without the suffix."""
    return fnmatch.fnmatch(Path(shard).name, pattern) or fnmatch.fnmatch(Path(shard).stem, pattern)
