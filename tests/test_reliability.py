"""Results that cannot be silently wrong: one writer per output folder, eval points redone when what
they depend on changes."""

import pytest

from eval.online import same_fingerprint
from router.files import OutputBusy, output_lock
from specroute import cli


def test_a_second_writer_of_an_output_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "records"
    with output_lock(out, "gen"):
        with pytest.raises(OutputBusy, match=r"being written by another `specroute gen` \(pid"):
            with output_lock(out, "gen"):
                pass
        for argv in (["gen", "--config", "configs/gen/tiny.yaml", f"output={out}", "max_examples=2"],
                     ["train", "--config", "configs/train/tiny.yaml", f"records=[{tmp_path}]", f"output={out}"],
                     ["eval", "--config", "configs/eval/tiny.yaml", f"records=[{tmp_path}]", f"output={out}"]):
            assert cli.main(argv) == 2
            assert "being written by another" in capsys.readouterr().err
        assert not (out / "manifest.json").exists()
    with output_lock(out, "gen"):  # released when the first writer is done
        pass


def test_online_points_are_redone_when_device_or_models_change():
    now = {"models": {"d": 1}, "dtype": "float32", "drafter": None, "verifier": None, "device": "cpu", "gamma": 5}
    older = {k: v for k, v in now.items() if k not in ("drafter", "verifier", "device")}  # written before them
    assert same_fingerprint(older, now)
    assert not same_fingerprint(older, {**now, "device": "cuda"})
    assert not same_fingerprint(older, {**now, "drafter": "./other-drafter"})
    assert not same_fingerprint({**now, "dtype": "bfloat16"}, now)
    assert not same_fingerprint(None, now)
