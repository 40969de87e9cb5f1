"""Record folders: a refused command writes nothing a rerun trusts, folders can be moved and grown, a manifest short of a shard and a full disk are errors naming the file (data_gen/record_folder.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import cli_on_a_full_disk

from specroute import cli

GEN = ["gen", "--config", "configs/gen/tiny.yaml"]


def _gen(out: Path, *extra: str) -> int:
    return cli.main([*GEN, f"output={out}", *extra])


def test_a_refused_gen_leaves_nothing_a_corrected_rerun_trusts(tmp_path, capsys):
    out = tmp_path / "X"
    assert _gen(out, "drafter=/nonexistent/model", "verifier=/nonexistent/v") == 2
    assert "does not exist" in capsys.readouterr().err
    assert not out.exists()  # no gen_config.json, examples.jsonl or stage mark to refuse the fix with
    assert _gen(out, "max_examples=8") == 0  # the corrected command runs
    assert (out / "manifest.json").exists()


def test_a_refused_gen_into_a_half_made_folder_keeps_its_work(tmp_path, capsys):
    out = tmp_path / "X"
    assert _gen(out, "max_examples=8") == 0
    (out / "manifest.json").unlink()  # an unfinished recording
    assert _gen(out, "max_examples=8", "top_k=100000") == 2
    assert (out / "gen_config.json").exists() and list(out.glob("*.arrow"))  # a refusal removes nothing


def test_a_copied_record_folder_is_repaired_resumed_and_grown(tiny_recording, tmp_path, capsys):
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tiny_recording, copy)
    (copy / "train-00001.arrow").unlink()
    assert _gen(copy, "max_examples=24") == 0  # repaired in its new place, not "differs in ['output']"
    assert "repairing it" in capsys.readouterr().out
    same = {p.name: p.read_bytes() for p in tiny_recording.glob("*.arrow")}
    assert {p.name: p.read_bytes() for p in copy.glob("*.arrow")} == same
    (copy / "manifest.json").unlink()
    assert _gen(copy, "max_examples=24") == 0  # resumed
    assert _gen(copy, "max_examples=30") == 0  # grown
    assert "recording the difference" in capsys.readouterr().out


def test_a_manifest_listing_fewer_shards_than_it_counts_is_refused(tiny_recording, tmp_path, capsys):
    copy = tmp_path / "rec"
    shutil.copytree(tiny_recording, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"] = [s for s in manifest["shards"] if s["file"] != "train-00001.arrow"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    argv = ["train", "--config", "configs/train/tiny.yaml", f"records=[{copy}]", f"output={tmp_path / 'r'}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{copy / 'manifest.json'} does not add up for split 'train'" in err and "rerun the same" in err
    assert _gen(copy, "max_examples=24") == 0  # the fix it names works
    assert (
        json.loads((copy / "manifest.json").read_text())["shards"]
        == json.loads((tiny_recording / "manifest.json").read_text())["shards"]
    )


@pytest.mark.e2e  # the CLI in a subprocess, in a user namespace
@pytest.mark.parametrize("kilobytes", [40, 400])
def test_a_full_disk_in_gen_names_the_file(tmp_path, kilobytes):
    out = tmp_path / "full" / "rec"
    run = cli_on_a_full_disk(kilobytes, [*GEN, f"output={out}", "max_examples=24"], tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"error: No space left on device while writing {out}/" in run.stderr and "Traceback" not in run.stderr
