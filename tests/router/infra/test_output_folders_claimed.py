"""One writer per output folder, and each stage keeps to folders of its own (router/infra/files.py, stage_folders.py)."""

import pytest

from router.infra.files import OutputBusy, output_lock
from specroute import cli


def test_a_second_writer_of_an_output_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "records"
    with output_lock(out, "gen"):
        with pytest.raises(OutputBusy, match=r"being written by another `specroute gen` \(pid"):
            with output_lock(out, "gen"):
                pass
        for argv, said in (
            (
                ["gen", "--config", "configs/gen/tiny.yaml", f"output={out}", "max_examples=2"],
                "being written by another",
            ),
            (
                ["train", "--config", "configs/train/tiny.yaml", f"records=[{tmp_path}]", f"output={out}"],
                "`specroute gen`",
            ),
            (
                ["eval", "--config", "configs/eval/tiny.yaml", f"records=[{tmp_path}]", f"output={out}"],
                "`specroute gen`",
            ),
        ):
            assert cli.main(argv) == 2
            assert said in capsys.readouterr().err
        assert not (out / "manifest.json").exists()
    with output_lock(out, "gen"):  # released when the first writer is done
        pass


def test_stages_keep_to_their_own_folders(tmp_path):
    """Each output folder says which stage made it; another stage refuses to write there (an eval
    pointed at a router folder used to overwrite the router's metrics.json)."""
    router = tmp_path / "router"
    with output_lock(router, "train"):
        (router / "metrics.json").write_text("{}")
    assert (router / ".specroute-stage").read_text() == "train"
    with pytest.raises(OutputBusy, match="holds the output of `specroute train`: `specroute eval` will not write"):
        with output_lock(router, "eval"):
            pass
    (router / ".specroute-stage").unlink()  # a folder without the mark is known by its files
    (router / "model.safetensors").write_bytes(b"")
    with pytest.raises(OutputBusy, match="`specroute train`"):
        with output_lock(router, "gen"):
            pass
    with output_lock(router, "train"):  # its own stage may write again (resume, retrain)
        pass
    a_file = tmp_path / "result.json"
    a_file.write_text("{}")
    with pytest.raises(OutputBusy, match="is a file: name a folder"):
        with output_lock(a_file, "eval"):
            pass
    assert not list(tmp_path.glob(".result.json.specroute-lock*"))  # no stray lock file
