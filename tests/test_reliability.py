"""Results that cannot be silently wrong: one writer per output folder, eval points redone when what
they depend on changes."""

import json
import pytest

from helpers import online_point

from eval.points import complete_elsewhere, point_fingerprint, same_fingerprint
from router.infra.files import OutputBusy, output_lock
from router.records import RecordsError
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


def test_online_points_are_redone_when_device_or_models_change():
    now = {"models": {"d": 1}, "dtype": "float32", "drafter": None, "verifier": None, "device": "cpu", "gamma": 5}
    assert same_fingerprint(dict(now), now)
    assert not same_fingerprint(now, {**now, "device": "cuda"})
    assert not same_fingerprint(now, {**now, "drafter": "./other-drafter"})
    assert not same_fingerprint({**now, "dtype": "bfloat16"}, now)
    assert not same_fingerprint({k: v for k, v in now.items() if k != "device"}, now)  # a key missing: redone
    assert not same_fingerprint(None, now)


def _point(fingerprint: dict):
    return online_point("opt", 0.5, fingerprint=fingerprint)


def test_point_files_round_trip_and_another_format_is_refused_with_the_fix(tmp_path):
    import json
    from dataclasses import replace

    from eval.points import read_points

    good, old, odd = tmp_path / "opt@0.5.json", tmp_path / "opt@0.7.json", tmp_path / "opt@0.9.json"
    _point({"gamma": 4}).write(good)
    back, missing = read_points([good, tmp_path / "missing.json"])
    assert back == replace(_point({"gamma": 4}), relative_latency=back.relative_latency) and missing is None
    data = json.loads(good.read_text())
    old.write_text(json.dumps({k: v for k, v in data.items() if k != "format"}))  # before points had a format
    odd.write_text(json.dumps({**data, "quality": 1.0}))  # a field this specroute does not know
    for path in (old, odd):
        with pytest.raises(ValueError, match=r"another format .* output=<new folder>"):
            read_points([good, path])


def test_a_complete_set_of_points_from_another_machine_is_reused_whole():
    """Latencies of two machines never meet in one table: a partial set from another machine is
    redone, a complete one (every point, one machine, everything else unchanged) is kept whole."""
    now = {"models": {"d": 1}, "gamma": 5, "machine": "AMD EPYC x2", "dtype": "float32"}
    there = {**now, "machine": "Intel Xeon (AMX) x2", "dtype": "bfloat16"}
    points = [_point(there), _point(there)]
    both = [now, now]
    assert complete_elsewhere(points, both) == {"machine": "Intel Xeon (AMX) x2", "dtype": "bfloat16"}
    assert complete_elsewhere([points[0], None], both) is None  # one point missing: redo the other machine's
    assert complete_elsewhere([points[0], _point({**there, "machine": "third"})], both) is None
    assert complete_elsewhere([points[0], _point({**there, "gamma": 4})], both) is None
    assert complete_elsewhere([_point(now)] * 2, both) is None  # same machine: the usual resume
    assert complete_elsewhere([], []) is None
    # the report says so when, and only when, the points were timed elsewhere than this run's fingerprint
    from eval.online_report import _notes
    from eval.points import timed_on

    for timed, here, said in ((there, now, True), (now, now, False)):
        online = {"dtype": {"dtype": "gguf", "engine": "llamacpp"}, "timing_warnings": [], "timed_on": {}}
        online["timed_on"] = timed_on([_point(timed)], here)
        note = "Note: every online point was timed by an earlier run on Intel Xeon (AMX) x2 (llama.cpp)"
        assert online["timed_on"]["elsewhere"] is said and any(note in n for n in _notes(online)) is said


def test_a_point_depends_on_its_own_router_only():
    """Adding or retraining a router redoes that router's points only."""
    run = {"models": {"d": 1}, "gamma": 5, "routers": {"mlp": "aa", "judge": "bb"}}
    rule, mlp = point_fingerprint(run, "token_v2"), point_fingerprint(run, "mlp")
    assert rule["routers"] == {} and mlp["routers"] == {"mlp": "aa"}
    assert same_fingerprint(rule, point_fingerprint({**run, "routers": {"mlp": "zz", "new": "cc"}}, "token_v2"))
    assert not same_fingerprint(mlp, point_fingerprint({**run, "routers": {"mlp": "zz"}}, "mlp"))
    judge = point_fingerprint(run, "judge")
    assert same_fingerprint(judge, point_fingerprint({**run, "routers": {"mlp": "zz", "judge": "bb"}}, "judge"))
    assert not same_fingerprint(judge, point_fingerprint({**run, "routers": {"judge": "retrained"}}, "judge"))


@pytest.mark.parametrize(
    "cls,overrides,message",
    [
        ("gen", ["max_prompt_tokens=-5"], "max_prompt_tokens must be >= 1"),
        ("gen", ["max_prompt_tokens=0"], "max_prompt_tokens must be >= 1"),
        ("gen", ["max_continuation_tokens=0"], "max_continuation_tokens must be >= 1"),
        ("gen", ["max_examples=abc"], "max_examples must be int or None"),
        ("gen", ["dtype=float33"], "dtype must be one of"),
        ("train", ["width=0"], "width must be >= 1"),
        ("train", ["depth=-1"], "depth must be >= 1"),
        ("train", ["max_epochs=0"], "max_epochs must be >= 1"),
        ("train", ["arch=transformer"], "arch must be one of"),
        ("eval", ["cost_ratio=-1"], "cost_ratio"),
        ("eval", ["alphas=[0.5]"], "alphas must be dict"),
        ("eval", ["temperature=.nan"], "temperature must be >= 0"),
        ("eval", ["top_p=1.5"], r"top_p in \(0, 1\]"),
        ("eval", ["online_rejection_targets=[0.5,2]"], r"online_rejection_targets .* each in \(0, 1\]"),
        ("eval", ["online_rejection_targets=[0]"], r"online_rejection_targets"),
        ("gen", ["task=nonsense"], r"task must be one of gsm8k"),
        ("gen", ["metric=nonsense"], r"metric must be one of gsm8k"),
        ("eval", ["metric=nonsense"], r"metric must be one of gsm8k"),
        ("gen", ["sandbox=nonsense"], r"sandbox must be one of auto"),
        ("eval", ["device=nonsense"], r"device 'nonsense' is not a device name"),
        ("gen", ["device=nonsense"], r"device 'nonsense' is not a device name"),
    ],
)
def test_nonsense_settings_are_refused_with_the_field_named(cls, overrides, message):
    from data_gen.config import GenConfig
    from eval.config import EvalConfig
    from router.infra.config import ConfigError, load_config
    from train.config import TrainConfig

    config_cls = {"gen": GenConfig, "train": TrainConfig, "eval": EvalConfig}[cls]
    with pytest.raises(ConfigError, match=message):
        load_config(config_cls, None, overrides)


def test_alphas_for_methods_not_run_are_refused():
    from eval.config import EvalConfig
    from eval.grid import online_grid
    from router.infra.config import ConfigError

    cfg = EvalConfig(online_methods=["lossless"], alphas={"opt": [0.5]})
    with pytest.raises(ConfigError, match=r"alphas are set for \['opt'\]"):
        online_grid(cfg, {}, 0.1, {})


def test_cli_reports_bad_settings_in_one_line(capsys):
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", "max_examples=abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "max_examples must be int or None" in err and "Traceback" not in err


def test_lossy_is_exact_at_the_drafter_end_and_finite_in_float16():
    import torch

    from router.loop.options import DecodeOptions
    from router.rules import get_rule

    q = torch.tensor([[0.5, 0.3, 0.2]])
    p = torch.tensor([[0.0, 0.0, 1.0]])  # the verifier gives the drafter's favourites probability 0
    assert torch.equal(get_rule("lossy").target(q, p, 1.0), q)
    half = get_rule("lossy").target(q.half(), p.half(), 0.5)
    assert half.dtype == torch.float16 and torch.isfinite(half).all()
    assert torch.allclose(half.float(), get_rule("lossy").target(q, p, 0.5), atol=1e-3)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        DecodeOptions(temperature=float("nan"))


def test_online_prompts_are_cut_as_recording_cuts_them():
    from eval.online import prepare_prompts
    from router.tasks.prompts import fit_prompt, prompt_limit

    assert fit_prompt([1, 2, 3, 4], 2) == ([3, 4], True) and fit_prompt([1, 2], 5) == ([1, 2], False)
    assert prompt_limit(32768, 128) == 32639 and prompt_limit(32768, 128, max_prompt_tokens=256) == 256

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return list(range(len(text)))

    examples = [{"example_id": "a", "prompt": "x" * 6000}, {"example_id": "b", "prompt": "short"}]
    with pytest.warns(UserWarning, match="1 prompt.*truncated from the left"):
        prompts = prepare_prompts(Tok(), examples, chat=False, max_prompts=2, limit=100)
    assert [len(p.ids) for p in prompts] == [100, 5] and prompts[0].ids[-1] == 5999  # the end survives


def test_generate_refuses_a_folder_as_output_before_loading_models(tmp_path):
    with pytest.raises(SystemExit, match="is a folder"):
        cli.main(
            ["generate", "--prompt", "hi", "--drafter", "no/such", "--verifier", "no/such", "--output", str(tmp_path)]
        )
    with pytest.raises(SystemExit, match="temperature must be >= 0"):
        cli.main(["generate", "--prompt", "hi", "--temperature", "nan", "--output", str(tmp_path / "r.json")])


def test_damaged_router_folders_are_named_not_tracebacks(tmp_path):
    import json as _json

    from router.model import RouterConfig, RouterError, RouterNet, load_router, save_router

    folder = save_router(RouterNet(RouterConfig()), tmp_path / "r")
    (folder / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(RouterError, match="damaged or was changed after export"):
        load_router(folder)
    # one flipped exponent bit in a bias loads as a valid file: the checksum in config.json catches it
    import torch
    from safetensors.torch import load_file, save_file

    folder = save_router(RouterNet(RouterConfig()), tmp_path / "bit")
    weights = load_file(str(folder / "model.safetensors"))
    name = next(k for k in weights if k.endswith("bias"))
    bits = weights[name].view(torch.int32)
    bits[0] ^= 1 << 29
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(RouterError, match="its checksum differs"):
        load_router(folder)
    folder = save_router(RouterNet(RouterConfig()), tmp_path / "r2")
    cfg = _json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(_json.dumps({**cfg, "width": 8}))  # the weights unchanged, the shape not
    with pytest.raises(RouterError, match="does not hold the weights"):
        load_router(folder)
    (folder / "config.json").write_text("{ broken")
    with pytest.raises(RouterError, match="config.json is not valid JSON"):
        load_router(folder)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_message(tmp_path, capsys):
    from router.pair import load_pair

    with pytest.raises(ValueError, match="no CUDA device"):
        load_pair("tiny:drafter", "tiny:verifier", device="cuda")
    assert (
        cli.main(
            ["gen", "--config", "configs/gen/tiny.yaml", "device=cuda", "max_examples=2", f"output={tmp_path / 'r'}"]
        )
        == 2
    )
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("content,message", [("", "is empty"), ("this is { not json\n", "cannot read")])
def test_bad_custom_data_files_are_named(tmp_path, content, message):
    from data_gen.tasks import load_user_data

    data = tmp_path / "mine.jsonl"
    data.write_text(content)
    with pytest.raises(ValueError, match=message):
        list(load_user_data(str(data), "prompt", "reference"))


def test_a_broken_gen_config_in_an_unfinished_folder_is_named(tmp_path):
    from data_gen.config import GenConfig
    from data_gen.run import run_gen
    from router.infra.config import ConfigError

    out = tmp_path / "r"
    out.mkdir()
    (out / "gen_config.json").write_text("{ broken")
    with pytest.raises(ConfigError, match="gen_config.json is not valid JSON"):
        run_gen(GenConfig(drafter="tiny:drafter", verifier="tiny:verifier", dtype="float32", output=str(out)))


def test_code_metrics_refuse_examples_they_cannot_judge():
    from router.tasks.metrics import check_metric_fields, mbpp_metric

    check_metric_fields("mbpp", {"tests": ["assert 1 == 1"]}, "ok")
    check_metric_fields("gsm8k", {}, "no fields needed")
    with pytest.raises(ValueError, match=r"example 'e1': the mbpp metric needs meta field 'tests' .* it is a str"):
        check_metric_fields("mbpp", {"tests": "assert f(1) == 2"}, "e1")
    with pytest.raises(ValueError, match=r"'tests' .* it is missing"):
        mbpp_metric("def f(): pass", {}, sandbox="python")
    with pytest.raises(ValueError, match=r"'entry_point' .* it is missing"):
        check_metric_fields("humaneval", {"test": "def check(f): pass", "function_prompt": ""}, "h")


def test_a_recording_of_blank_prompts_is_refused_not_finished(tmp_path):
    from data_gen.config import GenConfig
    from data_gen.run import run_gen
    from router.records import RecordsError

    data = tmp_path / "blank.jsonl"
    data.write_text("".join(json.dumps({"prompt": "  ", "reference": "x"}) + "\n" for _ in range(4)))
    cfg = GenConfig(
        task="custom",
        data_path=str(data),
        drafter="tiny:drafter",
        verifier="tiny:verifier",
        dtype="float32",
        output=str(tmp_path / "rec"),
    )
    with pytest.raises(RecordsError, match="every prompt of task custom is blank"):
        run_gen(cfg)
    assert not (tmp_path / "rec" / "manifest.json").exists()


def test_eval_refuses_another_pair_than_the_records_and_mixed_pairs(tmp_path, tiny, monkeypatch):
    from data_gen.config import GenConfig
    from data_gen.recorder import Recorder
    from data_gen.run import run_gen
    from eval.config import EvalConfig
    from eval.run import run_eval
    from router.pair import tiny_pair

    cfg = GenConfig(
        task="gsm8k",
        drafter="tiny:drafter",
        verifier="tiny:verifier",
        dtype="float32",
        max_examples=6,
        max_continuation_tokens=16,
        output=str(tmp_path / "rec"),
        split_fractions=[0.5, 0.0, 0.5],
    )
    run_gen(cfg, Recorder(cfg, *tiny))
    other = tiny_pair(seed=7)  # the same architecture, other weights
    cfg2 = GenConfig(**{**vars(cfg), "output": str(tmp_path / "rec2")})
    run_gen(cfg2, Recorder(cfg2, *other))
    base = dict(online=True, max_prompts=1, max_new_tokens=4, online_methods=["lossless"], cost_ratio=0.3)
    with pytest.raises(RecordsError, match="come from different model pairs"):
        run_eval(EvalConfig(records=[cfg.output, cfg2.output], output=str(tmp_path / "e1"), **base))
    # models that are not the records' pair (as a drafter=/verifier= override loads): refused
    import router.backends.torch_models as tiny_module  # where load_pair builds the tiny pair

    monkeypatch.setattr(tiny_module, "tiny_pair", lambda *a, **k: other)
    with pytest.raises(ValueError, match=r"the loaded drafter and verifier differ from the ones the records"):
        run_eval(EvalConfig(records=[cfg.output], output=str(tmp_path / "e2"), offline=False, **base))


def test_a_damaged_gamma_file_is_named_and_calibrated_again(tmp_path, capsys):
    from eval.gamma import _earlier_choice

    path = tmp_path / "gamma.json"
    assert _earlier_choice(path) is None
    for damaged in ('{"gamma": 3', "[1, 2]", '{"gamma": 3}'):
        path.write_text(damaged)
        assert _earlier_choice(path) is None
        assert f"{path} is damaged" in capsys.readouterr().out


def test_offline_only_routers_stay_out_of_the_online_grid(tmp_path, capsys):
    from eval.config import EvalConfig
    from eval.grid import online_methods
    from router.infra.config import ConfigError
    from router.model import LearnedRouter, RouterConfig, RouterNet

    routers = {n: LearnedRouter(RouterNet(RouterConfig(arch=n)), name=n) for n in ("mlp", "gru")}
    methods = online_methods(EvalConfig(), routers)
    assert "mlp" in methods and "gru" not in methods and "offline-only routers ['gru']" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="router 'gru' is a gru .* drop it from online_methods"):
        online_methods(EvalConfig(online_methods=["gru", "lossless"]), routers)


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


def test_a_read_only_output_is_a_message():
    # /proc takes no new folders, even from root: a read-only place every Linux machine has
    with pytest.raises(OutputBusy, match=r"cannot write the output folder /proc/specroute-test/out \("):
        with output_lock("/proc/specroute-test/out", "eval"):
            pass


@pytest.mark.parametrize(
    "argv,message",
    [
        (["gen", "--config", "BAD_YAML"], r"bad.yaml is not valid YAML at line 2, column 1"),
        (["gen", "--config", "A_FOLDER"], r"--config .* is a folder: name a YAML file"),
        (
            ["gen", "--config", "configs/gen/tiny.yaml", "top_k=100000", "output=OUT"],
            r"top_k 100000 is above the models' vocabulary \(259",
        ),
        (
            ["gen", "--config", "configs/gen/tiny.yaml", "drafter=./missing", "verifier=./missing", "output=OUT"],
            r"model folder missing does not exist",
        ),
        (
            ["generate", "--drafter", "./missing", "--verifier", "embedded:verifier", "--prompt", "x"],
            r"model folder missing does not exist",
        ),
    ],
)
def test_bad_inputs_are_one_line_messages(tmp_path, capsys, argv, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [unclosed\n")
    swap = {"BAD_YAML": str(bad), "A_FOLDER": str(tmp_path), "OUT": str(tmp_path / "out")}
    argv = [swap.get(a, a.replace("OUT", str(tmp_path / "out"))) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
    import re

    assert re.search(message, err), err


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


def test_calibration_refuses_implausible_timings_and_measures_again(monkeypatch, capsys, tiny):
    """Under contention a 9-token verifier pass was once timed at 1 ms beside a 1-token pass of 16 ms,
    and gamma 8 was chosen from that: implausible timings are measured again, then refused."""
    from router.machine import calibrate

    assert calibrate.implausible_costs(0.004, [0.016, 0.018, 0.020]) is None
    assert calibrate.implausible_costs(0.004, [0.016, 0.015, 0.017]) is None  # within noise
    assert "pass over 9 tokens took 1.0 ms" in calibrate.implausible_costs(0.004, [0.016] * 8 + [0.001])
    assert "not positive" in calibrate.implausible_costs(0.0, [0.016, 0.02])
    curves = iter([[0.016] * 8 + [0.001], [0.016 + 0.002 * n for n in range(9)]])  # contended, then quiet
    monkeypatch.setattr(calibrate, "measure_verify_curve", lambda v, b, n: next(curves))
    drafter, verifier, _ = tiny
    step, verify = calibrate.measure_costs(drafter, verifier, 1, 8)
    assert verify == [0.016 + 0.002 * n for n in range(9)] and "attempt 1: implausible" in capsys.readouterr().out
    monkeypatch.setattr(calibrate, "measure_verify_curve", lambda v, b, n: [0.016] * 8 + [0.001])
    with pytest.raises(ValueError, match="could not measure the pair's costs plausibly in 3 attempts"):
        calibrate.measure_costs(drafter, verifier, 1, 8)
