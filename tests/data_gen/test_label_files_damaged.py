"""Truncated or header-only label files are errors naming the file (data_gen/label_store.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from specroute import cli

LABELS = Path(__file__).resolve().parents[2] / "data/labels/gsm8k-consequence.jsonl.gz"


def test_truncated_or_header_only_label_files_are_errors(tmp_path, capsys):
    whole = LABELS.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 3])
    assert cli.main(["labels", "show", str(cut)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: label file {cut} is not readable") and "Traceback" not in err
    header = gzip.decompress(whole).decode().splitlines()[0]
    only = tmp_path / "header.jsonl.gz"
    only.write_bytes(gzip.compress((header + "\n").encode()))
    assert cli.main(["labels", "show", str(only)]) == 2
    err = capsys.readouterr().err
    held = json.loads(header)
    assert f"does not hold what its header says (examples {held['examples']} in its header, 0 in the file" in err
    assert cli.main(["labels", "show", str(LABELS)]) == 0
    assert f"{held['examples']} examples, {held['tested']} tested mismatches" in capsys.readouterr().out
