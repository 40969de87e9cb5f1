"""Which vLLM the plugin runs in (router/vllm/compat.py) and the guard (router/vllm/step.py), without vLLM: the
supported range by release, the runner a configuration picks, the speculative settings refused or set, and a
speculative step nobody decided stopping the engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from router.rules import get_rule
from router.vllm.compat import check_release, check_speculative, release, runner_of
from router.vllm.counts import Counts
from router.vllm.settings import PluginSettingError, PluginSettings
from router.vllm.step import Engine, PluginBypassed, guarded


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.33.1rc2", "0.34.0", "0.34.3"])
def test_releases_in_range_pass(version):
    check_release(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "1.0.0", "dev", ""])
def test_releases_out_of_range_are_refused_in_one_line(version):
    with pytest.raises(PluginSettingError) as refused:
        check_release(version)
    assert (
        "\n" not in str(refused.value)
        and "0.32-0.34" in str(refused.value)
        and "unset SPECROUTE_POLICY" in str(refused.value)
    )


def test_release_reads_major_and_minor():
    assert release("0.34.0") == (0, 34) and release("0.32.0+cpu") == (0, 32) and release("x") is None


def test_the_runner_follows_vllms_choice_and_is_v2_where_vllm_has_no_choice():
    assert runner_of(SimpleNamespace(use_v2_model_runner=True)) == "v2"
    assert runner_of(SimpleNamespace(use_v2_model_runner=False)) == "v1"
    assert runner_of(SimpleNamespace()) == "v2"  # 0.34: V1 removed


def _spec(**kw):
    base = dict(rejection_sample_method="standard", draft_sample_method="greedy", enable_adaptive_verification=False)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("method", ["fly", "synthetic", "block"])
def test_another_acceptance_method_is_refused_naming_it(method):
    with pytest.raises(PluginSettingError, match=f"rejection_sample_method='{method}'"):
        check_speculative(_spec(rejection_sample_method=method), "v2", {})


def test_v2_gets_the_drafters_distribution_turned_on_unless_the_user_chose_greedy():
    spec = _spec()
    notes = check_speculative(spec, "v2", {"method": "draft_model"})
    assert spec.draft_sample_method == "probabilistic" and len(notes) == 1
    with pytest.raises(PluginSettingError, match="draft_sample_method='greedy'"):
        check_speculative(_spec(), "v2", {"draft_sample_method": "greedy"})
    v1 = _spec()
    assert check_speculative(v1, "v1", {}) == [] and v1.draft_sample_method == "greedy"  # V1: the plugin drafts


def test_adaptive_verification_is_refused():
    with pytest.raises(PluginSettingError, match="enable_adaptive_verification"):
        check_speculative(_spec(enable_adaptive_verification=True), "v2", {})


def _engine():
    return Engine(PluginSettings(get_rule("lossless"), 0.0, None, False), Counts())


def test_a_speculative_step_nobody_decided_stops_the_engine_in_one_line():
    with pytest.raises(PluginBypassed) as stopped:
        guarded(_engine(), "Model Runner V9", True, lambda: "vLLM's own tokens")
    assert "\n" not in str(stopped.value) and "Model Runner V9" in str(stopped.value)


def test_a_decided_step_and_a_step_without_drafts_pass():
    engine = _engine()
    assert guarded(engine, "V", False, lambda: 1) == 1

    def decides():
        engine.decided += 1
        return 2

    assert guarded(engine, "V", True, decides) == 2
