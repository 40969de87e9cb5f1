"""`lossless` through the plugin decodes what vLLM's own speculative decoding (plugin off) and the verifier alone
decode. In a module of its own: each of its three engines starts after tests/vllm_plugin/test_vllm_engine.py's plugin
engine has stopped (vLLM's metrics registry is one per process: the last engine started takes it over)."""

import pytest

pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm (bash scripts/setup.sh vllm)")

from test_vllm_engine import PROMPTS, _engine, _greedy, _shutdown  # noqa: E402

from router.loop.tiny import save_tiny_pair  # noqa: E402


def test_lossless_equals_vllms_own_speculative_decoding_and_the_verifier_alone(tmp_path, monkeypatch):
    drafter, verifier = save_tiny_pair(tmp_path, hidden=128)
    outputs = []
    for drafter_dir, env in ((drafter, {"SPECROUTE_POLICY": "lossless"}), (drafter, {}), (None, {})):
        llm = _engine(verifier, drafter_dir, env, monkeypatch)  # the plugin, vLLM's own, the verifier alone
        try:
            outputs.append(_greedy(llm, PROMPTS))
        finally:
            _shutdown(llm)
    assert outputs[0] == outputs[1] == outputs[2]
