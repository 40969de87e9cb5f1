"""The demo's engine pricing with vLLM among the candidates (specroute/presets.py, specroute/demo.py): vLLM is a
candidate for evaluation where it is installed, records stay on torch, a calibrated gamma becomes vLLM's fixed
block size, and its measured step costs price the online stage. (The measurement itself runs in the vLLM
environment: tests/vllm_plugin/test_vllm_eval.py.)"""

import pytest

from router.machine.costs import PairCosts
from router.rules import get_rule
from specroute import demo, presets
from specroute.estimate import Estimate, served_online_seconds
from specroute.stages import _decodes


def test_vllm_is_an_evaluation_candidate_where_it_is_installed(monkeypatch):
    monkeypatch.setattr(presets, "installed", lambda engine: True)
    assert presets.engine_candidates("cpu", "auto")[0] == ("torch", "llamacpp", "vllm")
    assert presets.engine_candidates("tiny", "auto")[0] == ("torch",)
    monkeypatch.setattr(presets, "installed", lambda engine: engine == "vllm")
    assert presets.engine_candidates("cpu", "auto")[0] == ("torch", "vllm")
    assert presets.engine_candidates("cpu", "vllm") == (("vllm",), "as set (--engine)")


def test_evaluating_in_vllm_records_on_torch_with_a_fixed_block_size():
    p = presets.with_engines(presets.PRESETS["cpu"], presets.recording_engine("vllm"), "vllm")
    assert p.models["engine"] == "torch"
    assert p.eval_extra["engine"] == "vllm" and p.eval_extra["gamma"] == presets.SERVED_GAMMA
    with pytest.raises(ValueError, match="bonus_from=target, which vLLM's loop cannot"):
        presets.with_engines(presets.PRESETS["long"], "torch", "vllm")


def test_each_stage_goes_to_the_engine_priced_cheaper_and_vllm_records_nothing(tmp_path, monkeypatch):
    prices = {
        "torch": {"recording": 60.0, "training": 5.0, "evaluation": 900.0},
        "vllm": {"recording": 61.0, "training": 5.0, "evaluation": 300.0},
    }

    def priced(out, p):
        engine = p.eval_extra.get("engine", "torch")
        costs = PairCosts(1, 4, 0.01, 0.03, 0.02, 0.05, 0.1, 2.0)
        return Estimate(dict(prices[engine]), costs, "cpu", engine, 1.0)

    monkeypatch.setattr(demo, "estimate", priced)
    p, expected, engines = demo.choose_engines(tmp_path, presets.PRESETS["cpu"], ("torch", "vllm"), 0)
    assert engines == {"recording": "torch", "evaluation": "vllm"}
    assert p.models["engine"] == "torch" and p.eval_extra["engine"] == "vllm"
    assert expected.total == 60 + 5 + 300
    prices["vllm"]["recording"] = 50.0  # vLLM's candidate priced the cheaper recording: still made on torch
    p, expected, engines = demo.choose_engines(tmp_path, presets.PRESETS["cpu"], ("vllm",), 0)
    assert engines == {"recording": "torch", "evaluation": "vllm"} and p.models["engine"] == "torch"
    assert expected.total == 50 + 5 + 300


def test_served_online_seconds_add_vllms_steps_and_the_torch_scoring_pass():
    served = {"verifier": 0.5, "drafter": 0.1, "speculative": 0.3}
    # 3 prompts at batch 2: steps of the longest row per batch, x (verifier + drafter + 2 speculative methods)
    seconds = served_online_seconds([10, 20, 30], 2, 8, served, 2, [4, 8, 100], 0.01)
    per_step = 0.5 + 0.1 + 2 * 0.3
    scoring = (10 + 4 + 20 + 8 + 30 + 8) * 0.01
    assert seconds == pytest.approx(8 * per_step + 8 * per_step + scoring)


def test_the_demo_evaluating_in_vllm_picks_a_policy_the_plugin_can_decode():
    assert _decodes(get_rule("token_v2"), "vllm") and _decodes(get_rule("fly"), "torch")
    assert not _decodes(get_rule("fly"), "vllm")  # its follow window spans steps vLLM does not keep
