"""A readable copy of a recording still in progress: its finished shards, with a manifest.

    python studies/snapshot_records.py runs/records/gsm8k-consequence runs/records/gsm8k-consequence-snap

A long labelling run (hours on 2 CPU cores) writes manifest.json only when it finishes; until then its
folder cannot be read by train or eval. This copies the finished shards (and the folder's config and
example files) to DST and writes the manifest a finished run would write for them, so cross-fitted
training and out-of-fold evaluation can use the labels so far. The source folder is only read: the
recording goes on (and resumes) there. Loads the pair once (the manifest records its fingerprints).

`--leave-out PATTERN ...` copies a finished folder without the shards whose names match (e.g. `'test-*'
'train-0005[2-8]'`) and lists only the copied examples in examples.jsonl, so `specroute prompts DST`
returns the left-out problems as held-out online prompts: a router trained on DST, its alphas matched on
DST's validation split, never saw them (an online check of a router once every problem is recorded).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import sys
from pathlib import Path


def main() -> int:
    from data_gen.config import GenConfig
    from data_gen.record_folder import finish_manifest
    from data_gen.plan import load_examples, plan_shards, recorded_shards, write_examples
    from data_gen.recorder import Recorder
    from data_gen.record_folder import intact_shard

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a record folder being recorded (gen_config.json, shards, no manifest yet)")
    parser.add_argument("dest", help="the new folder (must not exist)")
    parser.add_argument(
        "--leave-out", nargs="+", default=[], metavar="PATTERN", help="shard names (globs) not to copy: held out"
    )
    args = parser.parse_args()
    src, dst = Path(args.source), Path(args.dest)
    if dst.exists():
        raise SystemExit(f"error: {dst} exists: name a new folder")
    raw = json.loads((src / "gen_config.json").read_text())
    cfg = GenConfig(**{**raw, "output": str(dst)})
    plan = plan_shards(load_examples(cfg), cfg, recorded_shards(src))  # a grown folder's short shards too
    done = [s for s in plan if intact_shard(src, s[0], [ex.example_id for ex in s[2]]) is not None]
    left_out = [s for s in done if any(_names(s[0], p) for p in args.leave_out)]
    unmatched = [p for p in args.leave_out if not any(_names(s[0], p) for s in done)]
    if unmatched:
        example = Path(done[0][0]).stem if done else "train-00000"
        raise SystemExit(f"error: --leave-out {unmatched[0]!r} names no finished shard of {src} (e.g. {example})")
    done = [s for s in done if s not in left_out]
    gap = _first_gap(done)
    if gap:
        raise SystemExit(
            f"error: --leave-out leaves a gap before {gap} (a split's shards must number from 00000 on): "
            f"leave out the last shards of a split, or all of it"
        )
    if not done:
        raise SystemExit(f"error: {src} has no finished shard yet (or every one is left out)")
    dst.mkdir(parents=True)
    for name in ("gen_config.json", "examples.jsonl", "heldout.jsonl"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    for name, _, _ in done:
        for suffix in ("", ".json", ".counts.json"):
            if (src / f"{name}{suffix}").exists():
                shutil.copy2(src / f"{name}{suffix}", dst / f"{name}{suffix}")
    if left_out:  # examples.jsonl lists the copied examples only (gen's own writer), so the left-out ones
        write_examples(dst, done, cfg)  # count as unrecorded; heldout.jsonl remade to match
    manifest = finish_manifest(dst, cfg, done, Recorder(cfg), seconds=0.0)
    examples = sum(len(s[2]) for s in done)
    print(f"{dst}: {len(done)} of {len(plan)} shards ({examples} examples), manifest {manifest.id}")
    if manifest.consequence:
        print(f"  consequence labels: {manifest.consequence}")
    if left_out:
        held = sum(len(s[2]) for s in left_out)
        print(f"  left out {len(left_out)} shards ({held} examples): `specroute prompts {dst}` lists them")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
