"""Labels per hour: what a labelling recording cost, per machine and dtype, from its shards' receipts.

    python -m studies.label_rate runs/records/gsm8k-horizon runs/records/mbpp-horizon --out runs/studies/label-rate

Every shard of a record folder writes `<shard>.counts.json` (data_gen/record_folder.py): the seconds its
answers and searches took (`consequence_seconds`), its short-horizon scores (`horizon_seconds`), the
whole shard (`shard_seconds`, wall; `shard_cpu_seconds`, the process's CPU time, which neither a
pause nor another job's load inflates), the mismatches it labelled and the CPU and dtype it ran on.
A folder may hold shards from several machines (a recording resumed on another CPU), so rates are
given per (folder, CPU, dtype). Shards that replayed problems from a label file (labels_from) did not
search them and are left out of the rates (counted apart). Older shards have no whole-shard times:
they count in the rates per hour of labelling work (answers, searches and scores, not the record
rows) only; the wall and CPU rates read the shards timed whole.
Writes label_rate.json and label_rate.csv to --out and prints one line per group.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path


TESTED = ("consequence_important", "consequence_harmless")  # full-answer verdicts
TIMED = ("timed_problems", "timed_horizon_mismatches", "timed_tested_mismatches")
SUMMED = (
    "consequence_seconds",
    "horizon_seconds",
    "shard_seconds",
    "shard_cpu_seconds",
    "horizon_mismatches",
    "consequence_important",
    "consequence_harmless",
)


def shard_receipts(folder: Path) -> list[dict]:
    """One entry per finished shard: its examples, counts and machine (shards without counts are skipped)."""
    out = []
    for counts_file in sorted(folder.glob("*.arrow.counts.json")):
        receipt = folder / counts_file.name.replace(".counts.json", ".json")
        if not receipt.exists():
            continue
        done = json.loads(counts_file.read_text())
        dtype = done.get("dtype") or {}
        out.append(
            {
                "shard": receipt.name.removesuffix(".json"),
                "examples": len(json.loads(receipt.read_text()).get("examples", [])),
                "counts": done["counts"],
                "cpu": dtype.get("cpu", "unknown"),
                "dtype": dtype.get("dtype", "unknown"),
            }
        )
    return out


def group_rates(folder: Path) -> list[dict]:
    """Sums and per-hour rates per (CPU, dtype) over the folder's shards that searched every problem."""
    groups: dict[tuple, dict] = {}
    for r in shard_receipts(folder):
        g = groups.setdefault(
            (r["cpu"], r["dtype"]),
            {"folder": str(folder), "cpu": r["cpu"], "dtype": r["dtype"], "shards": 0, "problems": 0}
            | {"replayed_shards": 0, "replayed_problems": 0, "timed_shards": 0}
            | dict.fromkeys(SUMMED, 0.0)
            | dict.fromkeys(TIMED, 0.0),
        )
        if r["counts"].get("replayed_examples", 0):  # its labels came from a file: no search cost to count
            g["replayed_shards"] += 1
            g["replayed_problems"] += r["examples"]
            continue
        g["shards"] += 1
        g["problems"] += r["examples"]
        for key in SUMMED:
            g[key] += r["counts"].get(key, 0)
        if "shard_seconds" in r["counts"]:  # timed whole: the wall and CPU rates read these shards only
            g["timed_shards"] += 1
            g["timed_problems"] += r["examples"]
            g["timed_horizon_mismatches"] += r["counts"].get("horizon_mismatches", 0)
            g["timed_tested_mismatches"] += sum(r["counts"].get(k, 0) for k in TESTED)
    return [_rates(g) for g in groups.values()]


def _rates(g: dict) -> dict:
    """Per-hour rates: problems and labels per hour of labelling work (every counted shard), and per hour
    of whole-shard wall time and per CPU-hour (the shards timed whole)."""
    tested = sum(g[k] for k in TESTED)
    labelling = g["consequence_seconds"] + g["horizon_seconds"]
    out = dict(g, tested_mismatches=tested, labelling_seconds=labelling)
    every = (g["problems"], g["horizon_mismatches"], tested)
    timed = (g["timed_problems"], g["timed_horizon_mismatches"], g["timed_tested_mismatches"])
    for name, seconds, counted in (
        ("per_labelling_hour", labelling, every),
        ("per_wall_hour", g["shard_seconds"], timed),
        ("per_cpu_hour", g["shard_cpu_seconds"], timed),
    ):
        hours = seconds / 3600 if seconds > 0 else math.nan
        for what, n in zip(("problems", "horizon_labels", "tested_labels"), counted):
            out[f"{what}_{name}"] = n / hours
    return out


def _line(r: dict) -> str:
    def f(x: float) -> str:
        return "n/a" if x != x else f"{x:.0f}"

    return (
        f"{r['folder']}  [{r['cpu']}, {r['dtype']}]: {r['problems']} problems searched in {r['shards']} shards "
        f"({r['replayed_problems']} replayed, not counted); {int(r['horizon_mismatches'])} short-horizon and "
        f"{int(r['tested_mismatches'])} full-answer labels. Per hour of labelling work: "
        f"{f(r['problems_per_labelling_hour'])} problems, {f(r['horizon_labels_per_labelling_hour'])} short-horizon, "
        f"{f(r['tested_labels_per_labelling_hour'])} full-answer labels; over the {r['timed_shards']} shards "
        f"timed whole: {f(r['problems_per_wall_hour'])} problems per wall hour, "
        f"{f(r['problems_per_cpu_hour'])} per CPU-hour"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="record folders (finished or still recording)")
    parser.add_argument("--out", required=True, help="folder for label_rate.json and label_rate.csv")
    args = parser.parse_args(argv)
    rows = []
    for folder in map(Path, args.folders):
        if not (folder / "gen_config.json").exists():
            raise SystemExit(
                f"error: {folder} is not a record folder (no gen_config.json): name one `specroute gen` wrote"
            )
        rows += group_rates(folder)
    if not rows:
        raise SystemExit("error: no finished shard in these folders yet: rerun once a shard is written")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "label_rate.json").write_text(json.dumps(rows, indent=2))
    with open(out / "label_rate.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for r in rows:
        print(_line(r))
    print(f"  {out}/label_rate.json, {out}/label_rate.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
