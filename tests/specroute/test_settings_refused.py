"""Nonsense settings are refused with the field named, in one line, before any model loads (the config classes and the CLI)."""

import pytest

from specroute import cli


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
