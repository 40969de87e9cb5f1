"""A full disk while training names the file, not a temporary (train/run.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def recorded(tiny_recording) -> Path:
    return tiny_recording  # shared by the session (tests/conftest.py): read, never changed


def _full_disk(kilobytes: int, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`specroute ARGV` with /mnt/full a tmpfs of `kilobytes` (a user and mount namespace: no root needed)."""
    if not shutil.which("unshare"):
        pytest.skip("util-linux's unshare is not installed")
    script = f'mount -t tmpfs -o size={kilobytes}k tmpfs {tmp_path / "full"} && exec "$@"'
    (tmp_path / "full").mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs in a user namespace here: {probe.stderr.strip()}")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", sys.executable, "-m", "specroute.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.e2e  # the CLI in a subprocess, in a user namespace
def test_a_full_disk_in_train_names_the_file_not_a_temporary(recorded, tmp_path):
    out = tmp_path / "full" / "router"
    argv = ["train", "--config", "configs/train/tiny.yaml", f"records=[{recorded}]", f"output={out}"]
    run = _full_disk(100, argv, tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"error: No space left on device while writing {out}/" in run.stderr, run.stderr
