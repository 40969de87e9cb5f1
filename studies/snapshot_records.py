"""A readable copy of a recording still in progress: its finished shards, with a manifest.

    python studies/snapshot_records.py runs/records/gsm8k-consequence runs/records/gsm8k-consequence-snap

A long labelling run (hours on 2 CPU cores) writes manifest.json only when it finishes; until then its
folder cannot be read by train or eval. This copies the finished shards (and the folder's config and
example files) to DST and writes the manifest a finished run would write for them, so cross-fitted
training and out-of-fold evaluation can use the labels so far. The source folder is only read: the
recording goes on (and resumes) there. Loads the pair once (the manifest records its fingerprints).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def main() -> int:
    from data_gen.config import GenConfig
    from data_gen.record_folder import finish_manifest
    from data_gen.plan import load_examples, plan_shards, recorded_shards
    from data_gen.recorder import Recorder
    from data_gen.record_folder import intact_shard

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a record folder being recorded (gen_config.json, shards, no manifest yet)")
    parser.add_argument("dest", help="the new folder (must not exist)")
    args = parser.parse_args()
    src, dst = Path(args.source), Path(args.dest)
    if dst.exists():
        raise SystemExit(f"error: {dst} exists: name a new folder")
    raw = json.loads((src / "gen_config.json").read_text())
    cfg = GenConfig(**{**raw, "output": str(dst)})
    plan = plan_shards(load_examples(cfg), cfg, recorded_shards(src))  # a grown folder's short shards too
    done = [s for s in plan if intact_shard(src, s[0], [ex.example_id for ex in s[2]]) is not None]
    if not done:
        raise SystemExit(f"error: {src} has no finished shard yet")
    dst.mkdir(parents=True)
    for name in ("gen_config.json", "examples.jsonl", "heldout.jsonl"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    for name, _, _ in done:
        for suffix in ("", ".json", ".counts.json"):
            if (src / f"{name}{suffix}").exists():
                shutil.copy2(src / f"{name}{suffix}", dst / f"{name}{suffix}")
    manifest = finish_manifest(dst, cfg, done, Recorder(cfg), seconds=0.0)
    examples = sum(len(s[2]) for s in done)
    print(f"{dst}: {len(done)} of {len(plan)} shards ({examples} examples), manifest {manifest.id}")
    if manifest.consequence:
        print(f"  consequence labels: {manifest.consequence}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
