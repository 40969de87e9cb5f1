"""studies/label_rate.py: labels per hour from shard receipts, per machine, replayed shards left out."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from studies import label_rate

XEON = {"dtype": "bfloat16", "cpu": "Xeon, AMX, 2 threads"}
EPYC = {"dtype": "float32", "cpu": "EPYC, AVX2, 2 threads"}


def _shard(folder: Path, name: str, examples: int, counts: dict, dtype: dict) -> None:
    (folder / f"{name}.arrow.json").write_text(json.dumps({"examples": [f"ex-{name}-{i}" for i in range(examples)]}))
    (folder / f"{name}.arrow.counts.json").write_text(json.dumps({"counts": counts, "rank": 0, "dtype": dtype}))


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "records"
    out.mkdir()
    (out / "gen_config.json").write_text("{}")
    timed = {"consequence_seconds": 50.0, "horizon_seconds": 10.0, "shard_seconds": 90.0, "shard_cpu_seconds": 180.0}
    _shard(out, "train-00000", 16, {**timed, "horizon_mismatches": 200}, XEON)
    _shard(out, "train-00001", 16, {**timed, "horizon_mismatches": 100, "consequence_important": 3}, XEON)
    _shard(out, "train-00002", 16, {**timed, "horizon_mismatches": 999, "replayed_examples": 16}, XEON)
    _shard(
        out, "test-00000", 8, {"consequence_seconds": 300.0, "consequence_harmless": 12}, EPYC
    )  # older: no shard times
    return out


def test_rates_per_machine_from_the_receipts(folder):
    rows = {r["dtype"]: r for r in label_rate.group_rates(folder)}
    xeon, epyc = rows["bfloat16"], rows["float32"]
    assert (xeon["shards"], xeon["problems"], xeon["replayed_problems"]) == (2, 32, 16)  # the replayed shard apart
    assert xeon["horizon_mismatches"] == 300 and xeon["tested_mismatches"] == 3
    # 32 problems in 120 s of labelling, 180 s of wall, 360 CPU-seconds
    assert xeon["problems_per_labelling_hour"] == pytest.approx(32 / 120 * 3600)
    assert xeon["horizon_labels_per_labelling_hour"] == pytest.approx(300 / 120 * 3600)
    assert xeon["problems_per_wall_hour"] == pytest.approx(32 / 180 * 3600)
    assert xeon["problems_per_cpu_hour"] == pytest.approx(32 / 360 * 3600)
    # a shard without whole-shard times: labelling rates only
    assert epyc["tested_labels_per_labelling_hour"] == pytest.approx(12 / 300 * 3600)
    assert math.isnan(epyc["problems_per_wall_hour"]) and math.isnan(epyc["problems_per_cpu_hour"])


def test_wall_and_cpu_rates_read_the_shards_timed_whole(folder):
    _shard(folder, "train-00003", 16, {"consequence_seconds": 40.0, "horizon_mismatches": 50}, XEON)  # untimed
    xeon = next(r for r in label_rate.group_rates(folder) if r["dtype"] == "bfloat16")
    assert (xeon["shards"], xeon["timed_shards"], xeon["timed_problems"]) == (3, 2, 32)
    assert xeon["problems_per_labelling_hour"] == pytest.approx(48 / 160 * 3600)  # every searched shard
    assert xeon["problems_per_wall_hour"] == pytest.approx(32 / 180 * 3600)  # the timed ones only
    assert xeon["horizon_labels_per_cpu_hour"] == pytest.approx(300 / 360 * 3600)


def test_the_command_writes_json_and_csv_and_refuses_a_non_record_folder(folder, tmp_path, capsys):
    assert label_rate.main([str(folder), "--out", str(tmp_path / "rate")]) == 0
    assert "32 problems searched in 2 shards (16 replayed, not counted)" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "rate" / "label_rate.json").read_text())) == 2
    with open(tmp_path / "rate" / "label_rate.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2
    with pytest.raises(SystemExit, match="not a record folder"):
        label_rate.main([str(tmp_path), "--out", str(tmp_path / "x")])
