"""A read-only output and a full disk are one-line messages that say how to go on (specroute/cli.py)."""

import pytest

from router.infra.files import OutputBusy, output_lock
from specroute import cli


def test_a_read_only_output_is_a_message():
    # /proc takes no new folders, even from root: a read-only place every Linux machine has
    with pytest.raises(OutputBusy, match=r"cannot write the output folder /proc/specroute-test/out \("):
        with output_lock("/proc/specroute-test/out", "eval"):
            pass


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_a_full_disk_in_train_and_eval_is_a_message(tmp_path, capsys, monkeypatch, stage):
    import errno

    import router.infra.files as files

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    rec = tmp_path / "rec"
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", f"output={rec}", "max_examples=12"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(files, "atomic_write_bytes", full)
    argv = {
        "train": ["train", "--config", "configs/train/tiny.yaml", f"records=[{rec}]", f"output={tmp_path / 't'}"],
        "eval": [
            "eval",
            "--config",
            "configs/eval/tiny.yaml",
            f"records=[{rec}]",
            "online=false",
            "cost_ratio=0.3",
            f"output={tmp_path / 'e'}",
        ],
    }[stage]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: No space left on device while writing" in err and "rerun the same command" in err
