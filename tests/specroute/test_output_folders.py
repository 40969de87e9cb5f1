"""No command deletes or overwrites what it did not write (router/infra/stage_folders.py): --overwrite and
--fresh remove only a stage's own files, in a folder holding nothing else; no stage writes into another's
folder or over a user's; a refused command creates nothing. Each case is one a hostile review broke."""

import hashlib
import json
from pathlib import Path

import pytest

from router.infra.files import output_lock
from router.infra.stage_folders import STAGE_MARK, OutputBusy, clear_output
from specroute import cli

ROOT = Path(__file__).resolve().parents[2]
GEN = ["gen", "--config", str(ROOT / "configs/gen/tiny.yaml")]


def _tree(folder: Path) -> dict:
    """Every file under `folder` with its sha256: what must be unchanged after a refused command."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs/ holding a tiny recording and a router trained on it."""
    runs = tmp_path_factory.mktemp("runs")
    assert cli.main([*GEN, f"output={runs / 'records'}"]) == 0
    train = ["train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{runs / 'records'}]"]
    assert cli.main([*train, f"output={runs / 'router'}", "max_epochs=1"]) == 0
    return runs


@pytest.fixture
def checkout(tmp_path):
    """A user's checkout: a .git folder, a README and a file of their own."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "README.md").write_text("the project's readme\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    return tmp_path


def test_overwrite_of_a_checkout_deletes_nothing_and_creates_nothing(checkout, monkeypatch, capsys):
    monkeypatch.chdir(checkout)
    before = _tree(checkout)
    assert cli.main([*GEN, "output=.", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: output . is not a folder specroute wrote") and err.count("\n") == 1
    assert ".git" in err and "README.md" in err
    assert _tree(checkout) == before and not list(checkout.glob(".*specroute*"))  # no lock, no mark


def test_overwrite_of_a_parent_of_stage_folders_deletes_nothing(runs, capsys):
    before = _tree(runs)
    assert cli.main([*GEN, f"output={runs}", "--overwrite"]) == 2
    assert "holds records, router" in capsys.readouterr().err
    assert _tree(runs) == before


def test_overwrite_removes_only_the_stages_own_files_and_keeps_its_mark(runs, tmp_path, capsys):
    import shutil

    rec = tmp_path / "rec"
    shutil.copytree(runs / "records", rec)
    (rec / "thesis.tex").write_text("a user's file")
    before = _tree(rec)
    assert cli.main([*GEN, f"output={rec}", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds what `specroute gen` did not write (thesis.tex): nothing removed" in err
    assert _tree(rec) == before
    (rec / "thesis.tex").unlink()
    assert cli.main([*GEN, f"output={rec}", "--overwrite"]) == 0
    assert (rec / STAGE_MARK).read_text() == "gen" and (rec / "manifest.json").exists()
    assert not list(rec.glob(".specroute-lock*"))  # the lock goes with the command


def test_no_stage_writes_inside_another_stages_folder(runs, capsys):
    from router.model import load_router, save_router

    before = _tree(runs)
    inside = runs / "records" / "router"
    argv = ["train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{runs / 'records'}]"]
    assert cli.main([*argv, f"output={inside}"]) == 2
    err = capsys.readouterr().err
    assert "lies inside" in err and "the output of `specroute gen`" in err
    with pytest.raises(OutputBusy, match="lies inside .*the output of `specroute gen`"):
        save_router(load_router(runs / "router"), inside)
    with pytest.raises(OutputBusy, match="holds the output of `specroute gen`"):
        load_router(runs / "router").save_pretrained(runs / "records")
    assert _tree(runs) == before and not inside.exists()


def test_train_into_a_checkout_keeps_its_readme(runs, checkout, monkeypatch, capsys):
    monkeypatch.chdir(checkout)
    before = _tree(checkout)
    argv = ["train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{runs / 'records'}]", "output=."]
    assert cli.main(argv) == 2
    assert "is not a folder specroute wrote" in capsys.readouterr().err
    assert _tree(checkout) == before


def test_demo_fresh_keeps_a_users_file(tmp_path, capsys):
    demo = tmp_path / "demo"
    (demo / "important").mkdir(parents=True)
    (demo / "important" / "thesis.tex").write_text("years of work")
    (demo / "records").mkdir()
    before = _tree(demo)
    assert cli.main(["demo", "--preset", "tiny", "--output", str(demo), "--fresh"]) == 2
    assert "is not a folder specroute wrote" in capsys.readouterr().err
    assert _tree(demo) == before
    (demo / STAGE_MARK).write_text("demo")  # a demo folder a user dropped a file into
    before = _tree(demo)
    with (
        output_lock(demo, "demo"),
        pytest.raises(OutputBusy, match=r"holds what `specroute demo` did not write \(important\)"),
    ):
        clear_output(demo, "demo")
    assert _tree(demo) == before


def test_demo_fresh_removes_only_its_stage_folders(runs, tmp_path):
    import shutil

    demo = tmp_path / "demo"
    shutil.copytree(runs / "records", demo / "records" / "gsm8k")
    shutil.copytree(runs / "router", demo / "routers" / "mlp")
    (demo / "demo_summary.json").write_text("{}")
    with output_lock(demo, "demo"):
        removed = clear_output(demo, "demo")
    assert sorted(p.name for p in removed) == ["demo_summary.json", "records", "routers"]
    assert [p.name for p in demo.iterdir()] == [STAGE_MARK]


def test_file_outputs_never_overwrite_a_stages_or_a_users_file(runs, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    before = _tree(runs)
    manifest = runs / "records" / "manifest.json"
    gen_argv = ["generate", "--drafter", "tiny:drafter", "--verifier", "tiny:verifier", "--prompt", "x"]
    with pytest.raises(SystemExit, match="lies inside .* the output of `specroute gen`"):
        cli.main([*gen_argv, "--output", str(manifest)])
    for output, said in (
        (manifest, "writes a .onnx file"),
        (runs / "records" / "decision.onnx", "lies inside"),
        (runs, "is a folder: name the file to write"),
    ):
        assert cli.main(["export-onnx", str(runs / "router"), "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(b"a user's graph")
    assert cli.main(["export-onnx", str(runs / "router"), "--output", str(mine)]) == 2
    assert "exists and was not written by `specroute export-onnx`" in capsys.readouterr().err
    assert mine.read_bytes() == b"a user's graph"
    assert cli.main(["prompts", str(runs / "records"), "--output", str(runs / "records" / "examples.jsonl")]) == 2
    assert "lies inside" in capsys.readouterr().err
    assert _tree(runs) == before


def test_a_generate_output_is_replaced_only_when_generate_wrote_it(tmp_path, capsys):
    argv = [
        "generate",
        "--drafter",
        "tiny:drafter",
        "--verifier",
        "tiny:verifier",
        "--prompt",
        "x",
        "--max-new-tokens",
        "2",
    ]
    out = tmp_path / "out.json"
    assert cli.main([*argv, "--output", str(out)]) == 0
    assert json.loads(out.read_text())["written_by"] == "specroute generate"
    assert cli.main([*argv, "--output", str(out)]) == 0  # a rerun replaces its own file
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"a": 1}')
    with pytest.raises(SystemExit, match="exists and was not written by `specroute generate`"):
        cli.main([*argv, "--output", str(theirs)])
    assert theirs.read_text() == '{"a": 1}'


def test_refused_commands_create_nothing(runs, tmp_path, capsys):
    train = ["train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{runs / 'records'}]"]
    evaluate = ["eval", "--config", str(ROOT / "configs/eval/tiny.yaml"), f"records=[{runs / 'records'}]"]
    for argv in (
        [*train, "router.head=judge", "target=greedy_01_gap"],  # refused once the records are read
        [*evaluate, "routers=[]", "online_methods=[nonexistent]"],
        [*GEN, "drafter=/nonexistent/model"],
    ):
        out = tmp_path / "new" / "deeper" / "out"
        assert cli.main([*argv, f"output={out}"]) == 2, argv
        assert not (tmp_path / "new").exists(), (argv, capsys.readouterr().err)
        assert not list(tmp_path.rglob("*specroute-lock*"))
    err = capsys.readouterr().err
    assert "every training label falls on one side" not in err  # the judge refusal comes alone


def test_a_recording_listed_twice_is_refused(runs, capsys):
    rec = runs / "records"
    for stage in ("train", "eval"):
        argv = [stage, "--config", str(ROOT / f"configs/{stage}/tiny.yaml"), f"records=[{rec}, {rec}/../records]"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "records lists" in err and "twice" in err and err.count("\n") == 1


def test_a_folder_of_another_stage_given_as_records_is_named(runs, capsys):
    argv = ["train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{runs / 'router'}]"]
    assert cli.main([*argv, f"output={runs.parent / 'unused'}"]) == 2
    assert "is the output of `specroute train`, not a recording" in capsys.readouterr().err


def test_a_damaged_manifest_is_repaired_by_a_plain_rerun_as_the_message_says(runs, tmp_path, capsys):
    """train used to advise `gen --overwrite` (a full re-record) where rerunning gen repairs the folder."""
    import shutil

    rec = tmp_path / "rec"
    shutil.copytree(runs / "records", rec)
    (rec / "manifest.json").write_text("{not json")
    train = ["train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{rec}]", "max_epochs=1"]
    assert cli.main([*train, f"output={tmp_path / 'router'}"]) == 2
    err = capsys.readouterr().err
    assert "rerun the same `specroute gen` command" in err and "overwrite" not in err
    assert cli.main([*GEN, f"output={rec}"]) == 0
    assert cli.main([*train, f"output={tmp_path / 'router'}"]) == 0
