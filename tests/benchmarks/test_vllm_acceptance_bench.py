"""benchmarks.vllm_acceptance (no vLLM needed): the plugin's acceptance step timed beside vLLM's greedy one on the
same step, each as a share of the verifier step given, written as JSON."""

import json

import torch

from benchmarks.vllm_acceptance import greedy_step, main, vllms_greedy_acceptance
from router.rules import get_rule
from router.vllm.acceptance import accept


def test_vllms_greedy_acceptance_keeps_what_the_plugins_lossless_keeps():
    step = greedy_step(3, 4, 50, seed=2)
    kept = vllms_greedy_acceptance(step)
    assert kept.tolist() == accept(get_rule("lossless"), 0.0, step).n_accepted.tolist()
    assert 0 < int(kept.sum()) < 12  # some drafts kept, some not: the comparison decides something


def test_the_benchmark_reports_each_policy_against_a_verifier_step(tmp_path):
    out = tmp_path / "acc.json"
    argv = ["--batch", "2", "--drafts", "2", "--vocab", "64", "--repeats", "3", "--verifier-step", "0.5"]
    report = main([*argv, "--policies", "lossless", "token_v2@0.3", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    steps = report["steps"]
    assert list(steps) == ["vllm greedy acceptance", "plugin lossless", "plugin token_v2@0.3"]
    for row in steps.values():
        assert row["ms_per_step"] > 0 and row["share_of_verifier_step"] == row["ms_per_step"] / 1e3 / 0.5
    assert report["machine"]["threads"] == torch.get_num_threads()


def test_full_path_rows_sit_beside_the_sparse_ones(tmp_path):
    argv = ["--batch", "2", "--drafts", "2", "--vocab", "64", "--repeats", "2", "--full-path"]
    report = main([*argv, "--policies", "kl_gate@0.5", "--out", str(tmp_path / "acc.json")])
    assert list(report["steps"]) == ["vllm greedy acceptance", "plugin kl_gate@0.5", "plugin kl_gate@0.5 (full pi)"]
    assert report["steps"]["plugin kl_gate@0.5 (full pi)"]["share_of_verifier_step"] is None  # no step given
