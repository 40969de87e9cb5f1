"""A full disk while training names the file, not a temporary (train/run.py)."""

from __future__ import annotations

import pytest

from helpers import cli_on_a_full_disk


@pytest.mark.e2e  # the CLI in a subprocess, in a user namespace
def test_a_full_disk_in_train_names_the_file_not_a_temporary(tiny_recording, tmp_path):
    out = tmp_path / "full" / "router"
    argv = ["train", "--config", "configs/train/tiny.yaml", f"records=[{tiny_recording}]", f"output={out}"]
    run = cli_on_a_full_disk(100, argv, tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"error: No space left on device while writing {out}/" in run.stderr, run.stderr
