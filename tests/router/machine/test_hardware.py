"""dtype `auto`: bf16 only where the hardware has it natively (capability checks mocked), explicit
dtypes win, the pair's fingerprint does not depend on the dtype it was loaded in."""

import json

import pytest
import torch

from router.machine import hardware
from router.pair import load_pair, model_fingerprint


@pytest.fixture(autouse=True)
def fresh_decisions():
    """Every test decides anew (the decision is cached per process in normal use)."""
    for fn in (hardware.resolve_dtype, hardware.bf16_slowdown, hardware.cpu_kind):
        fn.cache_clear()
    yield
    for fn in (hardware.resolve_dtype, hardware.bf16_slowdown, hardware.cpu_kind):
        fn.cache_clear()


def _cpu(monkeypatch, units: str, slowdown: float | None):
    monkeypatch.setattr(hardware, "cpu_bf16_units", lambda: units)

    def probe():
        if slowdown is None:
            raise AssertionError("the probe must not run when the CPU reports no bf16 units")
        return slowdown

    monkeypatch.setattr(hardware, "bf16_slowdown", probe)


def test_auto_is_float32_without_native_bf16(monkeypatch):
    _cpu(monkeypatch, "", None)
    choice = hardware.resolve_dtype("auto", "cpu")
    assert choice.dtype == torch.float32 and "no native bf16" in choice.reason


@pytest.mark.parametrize("units", ["AMX", "AVX512-BF16", "AMX+AVX512-BF16"])
def test_auto_is_bf16_with_native_units(monkeypatch, units):
    _cpu(monkeypatch, units, 0.4)
    choice = hardware.resolve_dtype("auto", "cpu")
    assert choice.dtype == torch.bfloat16 and units in choice.reason and "0.40x" in choice.reason


def test_auto_trusts_the_probe_over_the_flags(monkeypatch):
    _cpu(monkeypatch, "AMX", 6.0)  # e.g. a hypervisor that reports AMX but traps it
    choice = hardware.resolve_dtype("auto", "cpu")
    assert choice.dtype == torch.float32 and "6.00x" in choice.reason


@pytest.mark.parametrize("units", ["", "AMX"])
@pytest.mark.parametrize(
    "spec,expected",
    [
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_explicit_dtype_wins(monkeypatch, units, spec, expected):
    _cpu(monkeypatch, units, None)  # an explicit dtype never probes
    choice = hardware.resolve_dtype(spec, "cpu")
    assert choice.dtype == expected and choice.reason == "set explicitly"


def test_auto_on_cuda(monkeypatch):
    _cpu(monkeypatch, "", None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert hardware.resolve_dtype("auto", "cuda").dtype == torch.bfloat16
    hardware.resolve_dtype.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert hardware.resolve_dtype("auto", "cuda:0").dtype == torch.float32


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="auto"):
        hardware.resolve_dtype("fp8", "cpu")


def test_the_real_probe_measures_something():
    ratio = hardware.bf16_slowdown()
    assert ratio > 0 and ratio == hardware.bf16_slowdown()  # cached: measured once per process
    assert "threads" in hardware.cpu_kind()


def test_choice_is_announced_once(monkeypatch, capsys):
    _cpu(monkeypatch, "", None)
    choice = hardware.resolve_dtype("auto", "cpu")
    hardware._ANNOUNCED.clear()
    hardware.announce(choice)
    hardware.announce(choice)
    printed = capsys.readouterr().out
    assert printed.count("[specroute] models in float32") == 1 and "no native bf16" in printed


@pytest.mark.parametrize("units,expected", [("", torch.float32), ("AMX", torch.bfloat16)])
def test_load_pair_auto_follows_the_machine(monkeypatch, units, expected):
    _cpu(monkeypatch, units, 0.3)
    drafter, verifier, _ = load_pair("tiny:drafter", "tiny:verifier")
    assert drafter.dtype == verifier.dtype == expected
    drafter, verifier, _ = load_pair("tiny:drafter", "tiny:verifier", dtype="float32")
    assert verifier.dtype == torch.float32


def test_fingerprint_does_not_depend_on_dtype(tmp_path):
    drafter, verifier, _ = load_pair("tiny:drafter", "tiny:verifier", dtype="float32")
    verifier.save_pretrained(tmp_path / "v")  # a float32 checkpoint, loaded both ways
    from transformers import AutoModelForCausalLM

    as_f32 = AutoModelForCausalLM.from_pretrained(tmp_path / "v", dtype=torch.float32)
    as_bf16 = AutoModelForCausalLM.from_pretrained(tmp_path / "v", dtype=torch.bfloat16)
    assert model_fingerprint(as_f32) == model_fingerprint(as_bf16) == model_fingerprint(verifier)
    assert model_fingerprint(drafter) != model_fingerprint(verifier)


def test_records_in_two_dtypes_are_one_pair(tmp_path):
    """gen records the resolved dtype; the pair's hashes are equal across dtypes, so a router or an
    eval may use records made in either (eval notes the difference)."""
    from data_gen.config import GenConfig
    from data_gen.run import run_gen
    from eval.config import EvalConfig
    from eval.models import dtype_note

    manifests = {}
    for dtype in ("float32", "bfloat16"):
        cfg = GenConfig(
            drafter="tiny:drafter",
            verifier="tiny:verifier",
            dtype=dtype,
            max_examples=3,
            max_prompt_tokens=64,
            max_continuation_tokens=8,
            output=str(tmp_path / dtype),
        )
        manifests[dtype] = run_gen(cfg)
        assert json.loads((tmp_path / dtype / "manifest.json").read_text())["dtype"]["dtype"] == dtype
    assert manifests["float32"].models == manifests["bfloat16"].models
    note = dtype_note(EvalConfig(records=[str(tmp_path / "bfloat16")], dtype="float32"), [manifests["bfloat16"]])
    assert note["dtype"] == "float32" and note["records_dtype"] == ["bfloat16"] and "same pair" in note["mixed"]
    assert "mixed" not in dtype_note(EvalConfig(dtype="float32"), [manifests["float32"]])


def test_bad_dtype_in_configs_is_refused():
    from data_gen.config import GenConfig
    from eval.config import EvalConfig
    from router.infra.config import ConfigError

    with pytest.raises(ValueError, match="dtype must be one of"):
        GenConfig(dtype="bf16")
    with pytest.raises(ConfigError, match="dtype must be one of"):
        EvalConfig(dtype="half")


def test_shipped_configs_let_the_machine_choose():
    """Real-pair configs must not pin bf16 (26x slower on CPUs without native bf16)."""
    from pathlib import Path

    import yaml

    for path in Path(__file__).resolve().parents[3].glob("configs/*/*.yaml"):
        dtype = (yaml.safe_load(path.read_text()) or {}).get("dtype", "auto")
        assert dtype == "auto" or (path.stem == "tiny" and dtype == "float32"), f"{path} pins dtype {dtype}"


def test_choose_gamma_from_measured_costs():
    from router.machine.costs import block_latency, choose_gamma

    flat = [1.0] * 9  # a GPU: verifying 8 tokens costs what verifying 1 does
    best, latency = choose_gamma(0.8, 0.05, flat)
    assert best >= 4 and latency[best] < 0.5 and latency[best] == min(latency.values())
    # by hand, gamma 2 at acceptance 0.5: tokens 1.75; cost 2 x 0.05 + 1.0 + 0.25 x 0.05
    assert block_latency(2, 0.5, 0.05, flat) == pytest.approx((0.1 + 1.0 + 0.0125) / 1.75)
    steep = [1.0 + 0.6 * n for n in range(9)]  # a CPU in float32: each verified token costs 60% more
    best_cpu, latency_cpu = choose_gamma(0.8, 0.35, steep)
    assert best_cpu < best and latency_cpu[best_cpu] > 1  # speculation does not pay there
    assert block_latency(3, 0.8, 0.35, steep, bonus_drafter=False) < block_latency(3, 0.8, 0.35, steep)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        choose_gamma(0.8, 0.1, [1.0])
