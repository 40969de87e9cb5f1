"""specroute's policies inside vLLM's speculative decoding (router/vllm/), on vLLM's CPU backend with the tiny
pair saved as Hugging Face folders (a real byte tokenizer): exactness against vLLM alone and specroute's own
loop, the sampled law against pi, counts, golden vectors, bad input. Runs in the vLLM environment
(`bash scripts/setup.sh vllm`); scripts/test.sh runs this folder there after the main suite. One engine with
the plugin serves every policy (each request names its own), so few engines start."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from router.decoding import generate
from router.loop.tiny import save_tiny_pair
from router.pair import load_pair
from router.rules import get_rule
from router.sampling import process_logits
from router.view import BlockView

vllm = pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm (bash scripts/setup.sh vllm)")

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def fib(n):", "2 + 2 =", "The capital of France is", "import numpy as np\n"]
GAMMA, TOKENS = 4, 24
ALPHAS = {"token_v2": 0.4, "opt": 0.4, "kl_gate": 2.0}


def _engine(verifier: Path, drafter: Path | None, env: dict, monkeypatch):
    """A vLLM engine on the pair, float32, its engine core started with `env` (the plugin's settings)."""
    from vllm import LLM

    for key in ("SPECROUTE_POLICY", "SPECROUTE_ALPHA", "SPECROUTE_STATS", "SPECROUTE_STATS_EVERY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": GAMMA} if drafter else None
    return LLM(
        model=str(verifier),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        kv_cache_memory_bytes=256 << 20,
        speculative_config=spec,
        seed=0,
        disable_log_stats=False,  # vLLM's spec-decode metrics, read by the counts test
    )


def _shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), hidden=128)


@pytest.fixture(scope="module")
def hf_pair(pair):
    return load_pair(str(pair[0]), str(pair[1]), dtype="float32")


@pytest.fixture(scope="module")
def router_dir(pair, tmp_path_factory):
    """An mlp router recorded and trained on this pair with specroute's own commands."""
    work = tmp_path_factory.mktemp("router")
    models = [f"drafter={pair[0]}", f"verifier={pair[1]}"]
    cli = [sys.executable, "-m", "specroute.cli"]
    gen = [*cli, "gen", "--config", str(ROOT / "configs/gen/tiny.yaml"), *models, f"output={work / 'records'}"]
    train = [*cli, "train", "--config", str(ROOT / "configs/train/tiny.yaml"), f"records=[{work / 'records'}]"]
    for argv in (gen, [*train, f"output={work / 'mlp'}"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
    return work / "mlp"


@pytest.fixture(scope="module")
def plugin(pair, tmp_path_factory):
    """One engine with the plugin on (server default lossless); requests choose their own policy."""
    stats = tmp_path_factory.mktemp("stats") / "counts.json"
    mp = pytest.MonkeyPatch()
    env = {"SPECROUTE_POLICY": "lossless", "SPECROUTE_STATS": str(stats), "SPECROUTE_STATS_EVERY": "0"}
    llm = _engine(pair[1], pair[0], env, mp)
    yield llm, stats
    _shutdown(llm)
    mp.undo()


def _greedy(llm, prompts, extra=None, max_tokens=TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, extra_args=extra)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def _specroute(hf_pair, prompt, rule, alpha, max_tokens=TOKENS) -> list[int]:
    """specroute's loop on the same request as vLLM runs it: vLLM's prefill step emits the verifier's first
    token before any draft, so specroute decodes on from the prompt and that token, with the same gamma; and
    vLLM drafts whole blocks up to its length limit, then cuts, where specroute's last block is shortened to
    fit, so specroute decodes a block further and is cut the same way."""
    drafter, verifier, tok = hf_pair
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        first = int(verifier(ids).logits[0, -1].argmax())
    ids = torch.cat([ids, torch.tensor([[first]])], 1)
    longer = max_tokens + GAMMA + 1
    out = generate(drafter, verifier, ids, rule=rule, alpha=alpha, gamma=GAMMA, max_new_tokens=longer, check_pair=False)
    return [first, *out.sequences[0, ids.shape[1] :].tolist()][:max_tokens]


def test_lossless_through_the_plugin_is_specroutes_lossless(hf_pair, plugin):
    """(vLLM's own speculative decoding and the verifier alone decode the same: tests/vllm_plugin/test_vllm_lossless.py,
    in engines of their own after this module's, whose metrics they would take over.)"""
    llm, _ = plugin
    assert _greedy(llm, PROMPTS) == [_specroute(hf_pair, p, "lossless", 0.0) for p in PROMPTS]


@pytest.mark.parametrize("rule", sorted(ALPHAS))
def test_cascade_rules_decode_what_specroutes_loop_decodes(rule, hf_pair, plugin):
    """Temperature 0, same policy, alpha and gamma: one request alone, then all prompts at once."""
    llm, _ = plugin
    extra = {"specroute_policy": rule, "specroute_alpha": ALPHAS[rule]}
    want = [_specroute(hf_pair, p, rule, ALPHAS[rule]) for p in PROMPTS]
    assert _greedy(llm, PROMPTS[:1], extra) == want[:1]
    assert _greedy(llm, PROMPTS, extra) == want
    assert want != [_specroute(hf_pair, p, "lossless", 0.0) for p in PROMPTS]  # the cascade kept some mismatch


def test_concurrent_requests_with_different_policies_each_decode_their_own(hf_pair, plugin):
    """One generate call whose requests name different policies: vLLM verifies them in the same steps, and each
    decodes what specroute's loop decodes with its own policy."""
    from vllm import SamplingParams

    llm, _ = plugin
    chosen = [("token_v2", 0.4), ("lossless", 0.0), ("kl_gate", 2.0), ("opt", 0.4)]
    params = [
        SamplingParams(temperature=0, max_tokens=TOKENS, extra_args={"specroute_policy": r, "specroute_alpha": a})
        for r, a in chosen
    ]
    got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == [_specroute(hf_pair, p, r, a) for p, (r, a) in zip(PROMPTS, chosen)]


def test_a_trained_router_decodes_what_specroutes_loop_decodes(router_dir, hf_pair, plugin):
    from router.model import load_router

    llm, _ = plugin
    router = load_router(router_dir)
    for alpha in (0.0, -0.05):
        extra = {"specroute_policy": str(router_dir), "specroute_alpha": alpha}
        assert _greedy(llm, PROMPTS, extra) == [_specroute(hf_pair, p, router, alpha) for p in PROMPTS]


def test_the_plugin_loads_a_router_whose_golden_vectors_reproduce(router_dir):
    """The router as the plugin loads it decides the golden inputs as the exported decision does, through the
    plugin's own scaling and view (router/vllm/acceptance.py)."""
    from router.export.golden import read_golden
    from router.targets import tv_distance
    from router.vllm.acceptance import Drafted, Sampling, targets
    from router.vllm.settings import load_policy

    router = load_policy(str(router_dir))
    inputs, alphas, expected = read_golden(router_dir)
    q_logits, p_logits = inputs["q_logits"], inputs["p_logits"]  # (N, V)
    n = q_logits.shape[0]
    sampling = Sampling(torch.ones(n), torch.zeros(n, dtype=torch.long), torch.ones(n), [None] * n)
    q_raw = q_logits.softmax(-1)[:, None]
    step = Drafted(
        q_raw.argmax(-1),
        torch.ones(n, dtype=torch.long),
        q_logits[:, None],
        p_logits[:, None],
        None,
        torch.zeros(n, dtype=torch.long),
        sampling,
    )
    for i, alpha in enumerate(alphas.tolist()):
        q, pi = targets(router, alpha, step)
        deferred = tv_distance(q, pi)[:, 0] > 1e-6
        differ = tv_distance(q_raw, p_logits.softmax(-1)[:, None])[:, 0] > 1e-6  # where deferring changes pi
        assert torch.equal(deferred[differ], expected["defer"][i].bool()[differ])


def test_sampled_output_follows_pi(hf_pair, plugin):
    """Temperature 1: the second token (the first the plugin decides, the first draft's position) of many
    requests is distributed as the policy's pi there, given the first token (chi-square)."""
    from vllm import SamplingParams

    llm, _ = plugin
    rule, alpha, prompt = "opt", 0.3, "2 + 2 ="
    params = SamplingParams(
        temperature=1.0, max_tokens=2, extra_args={"specroute_policy": rule, "specroute_alpha": alpha}
    )
    outs = [list(o.outputs[0].token_ids) for o in llm.generate([prompt] * 3000, params, use_tqdm=False)]
    first = max(set(o[0] for o in outs), key=lambda t: sum(o[0] == t for o in outs))
    second = torch.tensor([o[1] for o in outs if o[0] == first and len(o) > 1])
    drafter, verifier, tok = hf_pair
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False) + [first]])
    with torch.no_grad():
        q_raw, q = process_logits(drafter(ids).logits[0, -1], 1.0, 1.0)
        p_raw, p = process_logits(verifier(ids).logits[0, -1], 1.0, 1.0)
    pi = get_rule(rule).decide(BlockView(q[None], p[None], q_raw[None], p_raw[None]), alpha)[0]
    observed = torch.bincount(second, minlength=len(pi)).double()
    expected = pi.double() * len(second)
    keep = expected >= 5
    assert len(second) > 500 and observed[~keep].sum() <= expected[~keep].sum() + 4 * expected[~keep].sum().sqrt() + 5
    stat = chisquare(observed[keep].numpy(), (expected[keep] * observed[keep].sum() / expected[keep].sum()).numpy())
    assert stat.pvalue > 1e-3, stat


def test_counts_per_request_and_in_total_agree_with_vllms_metrics(plugin):
    from vllm import SamplingParams

    llm, stats = plugin
    before = _vllm_accepted(llm)
    counts_before = json.loads(stats.read_text())["total"]["accepted"] if stats.exists() else 0
    extra = {"specroute_policy": "token_v2", "specroute_alpha": 0.4}
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=TOKENS, extra_args=extra), use_tqdm=False)
    counts = json.loads(stats.read_text())  # the engine core (another process) rewrites it after every step here
    ids = {o.request_id for o in outs}
    assert ids <= set(counts["requests"]), (ids, list(counts["requests"])[:5])
    for rid in ids:
        row = counts["requests"][rid]
        assert (
            0 <= row["accepted"] <= row["drafts"]
            and row["rejected"] <= row["steps"]
            and row["deferred"] <= row["evaluated"]
        )
    total = counts["total"]
    assert total["drafts"] > 0 and 0 < total["acceptance_rate"] <= 1 and total["deferral_rate"] is not None
    assert total["accepted"] - counts_before == _vllm_accepted(llm) - before  # the same drafts, counted twice


def _vllm_accepted(llm) -> int:
    return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens"))


def test_a_bad_request_policy_is_refused_when_the_request_is_made(plugin):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    for extra, said in (
        ({"specroute_policy": "nope"}, "specroute_policy=nope is neither a rule"),
        ({"specroute_policy": "opt"}, "specroute_alpha is not set: opt needs its trade-off"),
        ({"specroute_policy": "token_v2", "specroute_alpha": 7}, "outside token_v2's range"),
        ({"specroute_alpha": "abc"}, "is not a number"),
    ):
        with pytest.raises(VLLMValidationError, match=said):
            SamplingParams(temperature=0, max_tokens=4, extra_args=extra)


def test_a_request_naming_a_router_of_another_pair_is_refused(plugin, router_dir, tmp_path):
    """As SPECROUTE_POLICY's router is at start-up: a request's own router is checked against the served pair's
    fingerprints (computed on the first such request), and one trained on this pair passes."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from router.arch import RouterConfig
    from router.model import LearnedRouter, RouterNet, save_router

    other = save_router(
        LearnedRouter(RouterNet(RouterConfig(pair={"drafter": "0" * 16, "verifier": "1" * 16})), name="other"),
        tmp_path / "other",
    )
    with pytest.raises(VLLMValidationError, match="differ from the ones router other was made with") as refused:
        SamplingParams(temperature=0, max_tokens=4, extra_args={"specroute_policy": str(other), "specroute_alpha": 0})
    assert "\n" not in str(refused.value) and "SPECROUTE_CHECK_PAIR=0" in str(refused.value)
    SamplingParams(temperature=0, max_tokens=4, extra_args={"specroute_policy": str(router_dir), "specroute_alpha": 0})


# ---- bad configuration: one line, no traceback, before any engine starts ----------------------------------

SCRIPT = """
import json
import sys
from vllm import LLM
if __name__ == "__main__":
    spec = None if sys.argv[2] == "none" else {{"method": "draft_model", "model": sys.argv[2], "num_speculative_tokens": 4}}
    spec = spec and {{**spec, **json.loads(sys.argv[3])}}
    {patch}
    LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 28,
        speculative_config=spec)
    print("STARTED")
"""


def _refused(tmp_path, pair, env: dict, drafter=True, patch="pass", spec_extra=None) -> str:
    script = tmp_path / "start.py"
    script.write_text(SCRIPT.format(patch=patch))
    argv = [
        sys.executable,
        str(script),
        str(pair[1]),
        str(pair[0]) if drafter else "none",
        json.dumps(spec_extra or {}),
    ]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert run.returncode != 0 and "STARTED" not in run.stdout, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if "specroute vLLM plugin: error:" in line]
    assert len(lines) == 1, run.stderr[-3000:]
    return lines[0]


def test_bad_configuration_is_one_line_before_vllm_starts(pair, tmp_path, router_dir):
    from router.arch import RouterConfig
    from router.model import LearnedRouter, RouterNet, save_router

    other = save_router(
        LearnedRouter(RouterNet(RouterConfig(pair={"drafter": "0" * 16, "verifier": "1" * 16})), name="other"),
        tmp_path / "other",
    )
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "config.json").write_text("[]")
    (damaged / "model.safetensors").write_bytes(b"")
    hidden = save_router(
        LearnedRouter(RouterNet(RouterConfig(hidden_inputs=["verifier"], hidden_sizes={"verifier": 128})), name="hid"),
        tmp_path / "hid",
    )
    cases = [
        ({"SPECROUTE_POLICY": "nope"}, True, "SPECROUTE_POLICY=nope is neither a rule"),
        ({"SPECROUTE_POLICY": "opt"}, True, "SPECROUTE_ALPHA is not set"),
        ({"SPECROUTE_POLICY": "opt", "SPECROUTE_ALPHA": "x"}, True, "SPECROUTE_ALPHA='x' is not a number"),
        ({"SPECROUTE_POLICY": str(damaged)}, True, "holds a JSON list, not a router config"),
        (
            {"SPECROUTE_POLICY": str(hidden), "SPECROUTE_ALPHA": "0"},
            True,
            "reads hidden_verifier, which the vLLM plugin cannot give it",
        ),
        ({"SPECROUTE_POLICY": "opt", "SPECROUTE_ALPHA": "0.3"}, False, "vLLM's speculative decoding is off"),
        (
            {"SPECROUTE_POLICY": str(other), "SPECROUTE_ALPHA": "0"},
            True,
            "differ from the ones router other was made with",
        ),
    ]
    for env, drafter, said in cases:
        assert said in _refused(tmp_path, pair, env, drafter), env
    version = _refused(
        tmp_path, pair, {"SPECROUTE_POLICY": "lossless"}, patch='import vllm; vllm.__version__ = "0.31.0"'
    )
    assert "vLLM 0.31.0 is installed; the plugin supports vLLM 0.32-0.34" in version
    block = _refused(tmp_path, pair, {"SPECROUTE_POLICY": "lossless"}, spec_extra={"rejection_sample_method": "block"})
    assert "rejection_sample_method='block'" in block and "unset SPECROUTE_POLICY" in block


BYPASS = """
import sys
import vllm.v1.sample.rejection_sampler as rs
from vllm import LLM, SamplingParams
vllms_own = rs.rejection_sample  # before the plugin's hooks go in
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 28,
              speculative_config={"method": "draft_model", "model": sys.argv[2], "num_speculative_tokens": 4})
    rs.rejection_sample = vllms_own  # a speculative step now completes around the plugin's acceptance
    llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=12))
    print("DECODED")
"""


def test_a_step_around_the_plugins_acceptance_stops_the_engine_with_one_line(pair, tmp_path):
    """Never silent (V1, live): with SPECROUTE_POLICY set, a speculative step decided by vLLM's own rejection sampling
    (the plugin's acceptance put back to vLLM's after start-up) stops the engine, the line naming the runner and vLLM."""
    script = tmp_path / "bypass.py"
    script.write_text(BYPASS)
    env = {**os.environ, "SPECROUTE_POLICY": "lossless", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run(
        [sys.executable, str(script), str(pair[1]), str(pair[0])], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode != 0 and "DECODED" not in run.stdout, run.stderr[-2000:]
    said = [line for line in run.stderr.splitlines() if "completed without specroute's acceptance deciding it" in line]
    assert said and "Model Runner V1" in said[-1] and f"vLLM {vllm.__version__}" in said[-1], run.stderr[-3000:]
