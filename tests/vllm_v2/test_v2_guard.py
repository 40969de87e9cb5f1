"""Never silent under Model Runner V2: with the plugin's hooks in, a speculative step that vLLM's own
`GPUModelRunner.sample` completes on a path the hooks do not cover (here: no rejection sampler, so vLLM samples the
drafts' rows plainly) stops the engine with one line naming the runner and vLLM's version; a step the plugin
decided, or one with no drafts, passes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import vllm
from v2_steps import Request, V2Step, engine

from router.rules import get_rule
from router.vllm import runner_v2
from router.vllm.step import PluginBypassed


def _runner(rejection_sampler):
    """The attributes vLLM 0.32-0.34's GPUModelRunner.sample reads, with the model's logits the hidden states."""
    out = SimpleNamespace(num_sampled=torch.ones(2, dtype=torch.int32), num_rejected=torch.zeros(2, dtype=torch.int32))
    return SimpleNamespace(
        batch_sharder=None,
        model=SimpleNamespace(compute_logits=lambda h: h),
        model_state=SimpleNamespace(compute_sample_logits=lambda h: h),
        structured_outputs_worker=None,
        sampler=lambda logits, batch: out,
        rejection_sampler=rejection_sampler,
        speculator=SimpleNamespace(draft_logits=None),
    )


def _batch(drafts: int):
    return SimpleNamespace(num_reqs=2, num_draft_tokens=drafts, logits_indices=torch.arange(2 + drafts))


def test_a_speculative_step_the_plugin_did_not_decide_stops_the_engine(restore_vllm):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner_v2.install(engine(get_rule("token_v2"), 0.3))
    with pytest.raises(PluginBypassed) as stopped:
        GPUModelRunner.sample(_runner(None), torch.randn(5, 8), _batch(3), None)
    line = str(stopped.value)
    assert "\n" not in line and "Model Runner V2" in line and f"vLLM {vllm.__version__}" in line
    assert "SPECROUTE_POLICY=token_v2" in line


def test_a_step_without_drafts_and_a_decided_step_pass(restore_vllm):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    eng = engine(get_rule("lossless"))
    runner_v2.install(eng)
    GPUModelRunner.sample(_runner(None), torch.randn(2, 8), _batch(0), None)  # no drafts: vLLM's plain sampler
    step = V2Step([Request(slot=0, drafts=2), Request(slot=1, drafts=1)], 2, vocab=8)

    def decides(logits, batch, draft_logits, *rest):  # the rejection sampler's call, through the hooked _verify
        step.rs._verify(**step.kwargs())
        return _runner(None).sampler(logits, batch)

    GPUModelRunner.sample(_runner(decides), torch.randn(5, 8), _batch(3), None)
    assert eng.decided == 1 and eng.counts.total["steps"] == 2
