"""Every timed vLLM call finds only the prompts' shared prefix (a few-shot context) cached, as the other engines'
shared prefix is: one speculative engine decodes every plugin method on the same prompts, and without emptying
the cache every method after the first found its prompts' whole prefill cached and looked faster for its place
in the order. Checked on a stand-in engine that logs its calls (the real engines run in the other vLLM tests,
which would fail if vLLM refused the reset)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm (bash scripts/setup.sh vllm)")

from benchmarks.serve_vllm import decode_batch  # noqa: E402
from router.loop.prefix import SharedPrefix  # noqa: E402
from router.vllm.grid import decode  # noqa: E402
from router.vllm.served import ServedPair, cache_only_the_shared_prefix  # noqa: E402

SHARED = list(range(100, 140))  # 40 tokens every prompt starts with


class LoggingEngine:
    """Answers generate with one token per request and logs every call: "reset", or the prompts it decoded."""

    def __init__(self, resets: bool = True):
        self.calls, self.resets = [], resets

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset")
        return self.resets

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append([p["prompt_token_ids"] if isinstance(p, dict) else p for p in prompts])
        out = SimpleNamespace(text="x", token_ids=[7])
        return [SimpleNamespace(request_id=str(i), outputs=[out]) for i in range(len(prompts))]


def test_each_timed_call_of_eval_on_vllm_finds_only_the_shared_prefix_cached():
    engine = LoggingEngine()
    served = ServedPair("drafter", "verifier", "float32", gamma=4, engines={"speculative": engine})
    pair = SimpleNamespace(served=served, router_folders={})
    cfg = SimpleNamespace(sampling_kwargs=lambda: {"temperature": 0.0, "max_new_tokens": 4})
    rows = [SHARED + [1, 2], SHARED + [3]]
    for method, alpha in (("lossless", 0.0), ("token_v2", 0.3)):  # two methods, the same prompts, one engine
        decode(pair, method, alpha, rows, cfg, [], SharedPrefix.common(rows))
    assert engine.calls == ["reset", [SHARED], rows, "reset", [SHARED], rows]


def test_without_a_shared_prefix_each_call_starts_from_an_empty_cache():
    engine = LoggingEngine()
    served = ServedPair("drafter", "verifier", "float32", gamma=4, engines={"verifier": engine})
    served.decode("verifier", [[1, 2, 3]], {"temperature": 0.0, "max_new_tokens": 4})
    assert engine.calls == ["reset", [[1, 2, 3]]]


def test_each_timed_call_of_the_serving_benchmark_finds_only_the_shared_prefix_cached(monkeypatch):
    monkeypatch.setenv("SPECROUTE_POLICY", "lossless")  # as the benchmark sets it: requests are checked against it
    engine = LoggingEngine()
    for extra in (None, {"specroute_policy": "token_v2", "specroute_alpha": 0.3}):
        decode_batch(engine, ["a prompt"], 4, [], extra, None, SHARED)
    assert engine.calls == ["reset", [SHARED], ["a prompt"], "reset", [SHARED], ["a prompt"]]


def test_a_cache_vllm_would_not_empty_stops_the_timing_in_one_line():
    with pytest.raises(RuntimeError, match="did not empty its prefix cache"):
        cache_only_the_shared_prefix(LoggingEngine(resets=False), SHARED)
