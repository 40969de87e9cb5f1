"""benchmarks.serve_vllm's summary (no vLLM needed): ratios against the verifier alone where it ran, else against
vLLM's own lossless, with intervals over the paired batches (a prompt's time is its batch's)."""

from types import SimpleNamespace

import pytest

from benchmarks.serve_vllm import baseline_of, method_plan, summarise

EXAMPLES = [SimpleNamespace(meta={"short_answer": str(i)}) for i in range(4)]


def _batch(ids, seconds: dict, right: dict) -> dict:
    """One batch of two prompts: each method's seconds, 10 tokens a prompt, the answers it got right."""
    methods = {}
    for name, sec in seconds.items():
        texts = [f"So the answer is {i if i in right[name] else 99}." for i in ids]
        methods[name] = {"seconds": sec, "texts": texts, "tokens": [10, 10], "drafts": 8, "accepted": 6}
    return {"examples": ids, "methods": methods}


def test_ratios_are_against_vllms_own_lossless_when_the_verifier_did_not_run():
    plan = method_plan(["vllm-lossless", "plugin:token_v2@0.3"])
    right = {"vllm-lossless": {0, 1, 2}, "plugin:token_v2@0.3": {0, 1}}
    batches = [
        _batch([0, 1], {"vllm-lossless": 2.0, "plugin:token_v2@0.3": 1.0}, right),
        _batch([2, 3], {"vllm-lossless": 2.0, "plugin:token_v2@0.3": 3.0}, right),
    ]
    out = summarise(plan, batches, EXAMPLES, replicates=500)
    cascade = out["plugin:token_v2@0.3"]
    assert baseline_of(plan) == "vllm-lossless" and "time_per_token_vs_baseline" not in out["vllm-lossless"]
    assert cascade["time_per_token_vs_baseline"] == pytest.approx(1.0)  # 4 s against 4 s for 40 tokens each
    lo, hi = cascade["time_per_token_vs_baseline_ci"]
    assert lo == pytest.approx(0.5) and hi == pytest.approx(1.5)  # resampled batches: (1+1)/(2+2) .. (3+3)/(2+2)
    assert cascade["accuracy_minus_baseline"] == pytest.approx(-0.25)
    assert cascade["acceptance"] == pytest.approx(0.75)


def test_the_verifier_is_the_baseline_where_it_ran():
    assert baseline_of(method_plan(["vllm-lossless", "verifier", "plugin:lossless"])) == "verifier"


def test_vllms_own_lossless_at_other_block_sizes_gets_an_engine_each():
    plan = method_plan(["vllm-lossless@2", "vllm-lossless", "vllm-lossless@3", "plugin:lossless"])
    assert [p["engine"] for p in plan] == ["vllm-lossless@2", "vllm-lossless", "vllm-lossless@3", "plugin"]
    assert [p.get("gamma") for p in plan] == [2, None, 3, None]  # None: --gamma
    assert baseline_of(plan) == "vllm-lossless"  # the one at --gamma, where it ran
    assert baseline_of(method_plan(["vllm-lossless@3", "plugin:lossless"])) == "vllm-lossless@3"
    for bad in ("vllm-lossless@0", "vllm-lossless@two", "lossless"):
        with pytest.raises(SystemExit, match="vllm-lossless@G"):
            method_plan([bad])


def test_engines_are_bound_to_the_cores_asked_with_none_reserved():
    import os

    from benchmarks.serve_vllm import bound_cores

    mine = sorted(os.sched_getaffinity(0))
    env = bound_cores(1)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": str(mine[0]), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert bound_cores(len(mine) + 5)["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, mine))  # no more than it has


def test_kept_drafts_bound_is_the_ratio_of_tokens_per_step_at_the_same_step_cost():
    plan = method_plan(["vllm-lossless", "plugin:lossless", "plugin:token_v2@0.3"])
    everyone = {0, 1, 2, 3}
    right = {name: everyone for name in ("vllm-lossless", "plugin:lossless", "plugin:token_v2@0.3")}
    times = {"vllm-lossless": 2.0, "plugin:lossless": 2.0, "plugin:token_v2@0.3": 1.5}
    batches = [_batch([0, 1], times, right), _batch([2, 3], times, right)]
    for batch in batches:  # lossless keeps half its drafts, the cascade all of them
        batch["methods"]["plugin:lossless"]["accepted"] = 4
        batch["methods"]["plugin:token_v2@0.3"]["accepted"] = 8
    bound = summarise(plan, batches, EXAMPLES, replicates=50, gamma=4)["kept_drafts_bound"]
    assert list(bound) == ["plugin:token_v2@0.3"]
    assert bound["plugin:token_v2@0.3"]["bound"] == pytest.approx((1 + 4 * 0.5) / (1 + 4 * 1.0))
    assert bound["plugin:token_v2@0.3"]["measured"] == pytest.approx(0.75)
    assert "kept_drafts_bound" not in summarise(plan, batches, EXAMPLES, replicates=50)  # no gamma: no bound
