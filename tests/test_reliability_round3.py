"""Reliability outside the sandbox: nothing lost and nothing silent (a refused
command writes nothing a rerun trusts, record folders can be moved, a manifest short of a shard, a point file
at odds with its receipts, a truncated label file and stale golden vectors are errors naming the file and
the fix, no API writes a router into another stage's folder) and one-line messages before any model loads."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specroute import cli

GEN = ["gen", "--config", "configs/gen/tiny.yaml"]


def _gen(out: Path, *extra: str) -> int:
    return cli.main([*GEN, f"output={out}", *extra])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "tiny"
    assert _gen(out, "max_examples=24") == 0
    return out


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


def test_a_copied_record_folder_is_repaired_resumed_and_grown(recorded, tmp_path, capsys):
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(recorded, copy)
    (copy / "train-00001.arrow").unlink()
    assert _gen(copy, "max_examples=24") == 0  # repaired in its new place, not "differs in ['output']"
    assert "repairing it" in capsys.readouterr().out
    same = {p.name: p.read_bytes() for p in recorded.glob("*.arrow")}
    assert {p.name: p.read_bytes() for p in copy.glob("*.arrow")} == same
    (copy / "manifest.json").unlink()
    assert _gen(copy, "max_examples=24") == 0  # resumed
    assert _gen(copy, "max_examples=30") == 0  # grown
    assert "recording the difference" in capsys.readouterr().out


def test_a_manifest_listing_fewer_shards_than_it_counts_is_refused(recorded, tmp_path, capsys):
    copy = tmp_path / "rec"
    shutil.copytree(recorded, copy)
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
        == json.loads((recorded / "manifest.json").read_text())["shards"]
    )


def test_a_point_file_at_odds_with_its_receipts_is_refused(tmp_path):
    from eval.points import read_points
    from tests.helpers import online_point

    path = tmp_path / "opt@0.5.json"
    online_point("opt", 0.5).write(path)
    assert read_points([path])[0].tokens == 3
    for field, value, named in [
        ("tokens", 1036, "tokens 1036, but its prompts' tokens sum to 3"),
        ("seconds", 9.0, "seconds 9, but its batches sum to 1"),
        ("scores", {"quality": 0.25}, "scores['quality'] 0.25"),
        ("prompts", 2, "prompts 2"),
    ]:
        data = json.loads(path.read_text())
        path.with_name("edited.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(ValueError, match="disagrees with its own") as err:
            read_points([path.with_name("edited.json")])
        assert named in str(err.value) and "delete it and rerun" in str(err.value)


LABELS = Path(__file__).resolve().parents[1] / "data/labels/gsm8k-consequence.jsonl.gz"


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


def _changed_weights(folder: Path) -> None:
    """New weights with an updated sha in config.json (a retrained router copied over the old one)."""
    from safetensors.torch import load_file, save_file

    from router.infra.files import file_sha256

    weights = folder / "model.safetensors"
    tensors = {k: v + 0.5 if v.is_floating_point() else v for k, v in load_file(str(weights)).items()}
    save_file(tensors, str(weights))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "weights_sha256": file_sha256(weights)}))


@pytest.mark.parametrize("old_golden_file", [False, True])
def test_stale_golden_vectors_are_named_with_the_fix(tmp_path, capsys, old_golden_file):
    pytest.importorskip("onnxruntime")
    from safetensors.torch import load_file, save_file

    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router

    folder = save_router(LearnedRouter(RouterNet(RouterConfig())), tmp_path / "mlp")
    if old_golden_file:  # written before golden vectors recorded their weights: caught by the torch check
        golden = folder / "golden.safetensors"
        save_file(load_file(str(golden)), str(golden))
    _changed_weights(folder)
    assert cli.main(["export-onnx", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"error: {folder / 'golden.safetensors'} is stale" in err and "--refresh-golden" in err
    assert cli.main(["export-onnx", str(folder), "--refresh-golden"]) == 0
    assert "decisions equal: True" in capsys.readouterr().out


def test_no_api_writes_a_router_into_another_stages_folder(recorded, tmp_path):
    from router.infra.files import OutputBusy
    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router

    router = LearnedRouter(RouterNet(RouterConfig()))
    before = sorted(p.name for p in recorded.iterdir())
    for save in (lambda: router.save_pretrained(recorded), lambda: save_router(router, recorded)):
        with pytest.raises(OutputBusy, match="holds the output of `specroute gen`"):
            save()
    assert sorted(p.name for p in recorded.iterdir()) == before
    router.save_pretrained(tmp_path / "mine")  # its own folder: fine


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
@pytest.mark.parametrize("kilobytes", [40, 400])
def test_a_full_disk_in_gen_names_the_file(tmp_path, kilobytes):
    out = tmp_path / "full" / "rec"
    run = _full_disk(kilobytes, [*GEN, f"output={out}", "max_examples=24"], tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"error: No space left on device while writing {out}/" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.e2e  # the CLI in a subprocess, in a user namespace
def test_a_full_disk_in_train_names_the_file_not_a_temporary(recorded, tmp_path):
    out = tmp_path / "full" / "router"
    argv = ["train", "--config", "configs/train/tiny.yaml", f"records=[{recorded}]", f"output={out}"]
    run = _full_disk(100, argv, tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"error: No space left on device while writing {out}/" in run.stderr, run.stderr


@pytest.mark.parametrize("content", ["", "# only a comment\n", "{}\n"])
def test_an_empty_config_is_refused_not_run_as_the_default_job(tmp_path, capsys, content):
    empty = tmp_path / "empty.yaml"
    empty.write_text(content)
    for stage in ("gen", "train", "eval"):
        assert cli.main([stage, "--config", str(empty)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {empty} holds no settings") and err.count("\n") == 1


def _generate(*extra: str) -> list[str]:
    return ["generate", "--drafter", "tiny:drafter", "--verifier", "tiny:verifier", *extra]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prompt", ""], "error: --prompt is empty"),
        (["--prompt", "x", "--output", "/proc/specroute-test/out.json"], "error: cannot write --output /proc/"),
    ],
)
def test_generate_refuses_bad_input_in_one_line_before_loading_models(monkeypatch, capsys, argv, message):
    import router.pair

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded before the input was checked")

    monkeypatch.setattr(router.pair, "load_pair", no_models)
    with pytest.raises(SystemExit) as exit_:
        cli.main(_generate(*argv))
    assert str(exit_.value).startswith(message) and "\n" not in str(exit_.value)
    assert "resume" not in str(exit_.value)  # generate has none to promise


def test_token_ids_outside_the_vocabulary_are_named(tiny):
    import torch

    from router.decoding import generate

    for ids in (torch.tensor([[10**6]]), torch.tensor([[-3, 5]])):
        with pytest.raises(ValueError, match=r"input_ids holds token id .* outside the models' vocabulary \(0 to "):
            generate(tiny.drafter, tiny.verifier, ids, rule="opt", alpha=0.3, max_new_tokens=2)


def test_quieting_third_party_output_imports_no_library():
    """The wrapper around every command turns bars off in libraries already imported and sets the variables the
    others read on import: importing transformers and datasets for it cost every command (`specroute rules`
    included) about 1.7 s."""
    code = (
        "import sys\nfrom specroute import cli\nassert cli.main(['rules']) == 0\n"
        "print(sorted(m for m in ('transformers', 'datasets', 'huggingface_hub') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"
