"""python -m benchmarks.serve_vllm runs on the tiny pair: every method decodes every prompt, the plugin's lossless gives
vLLM's own tokens, and the report holds the ratios and intervals docs/results.md quotes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serve_vllm import SUMMARY_ENTRIES

pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm (bash scripts/setup.sh vllm)")

ROOT = Path(__file__).resolve().parents[2]


def test_the_serving_benchmark_runs_on_the_tiny_pair(tmp_path):
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "serve_vllm.py"), "--tiny", "--prompts", "4", "--batch", "2"]
    argv += ["--max-tokens", "8", "--methods", "verifier", "vllm-lossless", "vllm-lossless@2", "plugin:lossless"]
    argv += ["plugin:opt@0.4"]
    done = subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    methods = report["methods"]
    assert {m: r["prompts"] for m, r in methods.items() if m not in SUMMARY_ENTRIES} == dict.fromkeys(
        ["verifier", "vllm-lossless", "vllm-lossless@2", "plugin:lossless", "plugin:opt@0.4"], 4
    )
    batches = [json.loads(line) for line in out.with_suffix(".batches.jsonl").read_text().splitlines()[1:]]
    for batch in batches:  # float32: every lossless method writes the verifier's text, at either block size
        texts = {m: got["texts"] for m, got in batch["methods"].items()}
        assert texts["vllm-lossless@2"] == texts["vllm-lossless"] == texts["plugin:lossless"] == texts["verifier"]
    assert methods["plugin_overhead"]["same_tokens"] is True
    opt = methods["plugin:opt@0.4"]
    bound = methods["kept_drafts_bound"]["plugin:opt@0.4"]  # at --gamma's default, 4 drafts a step
    kept = methods["plugin:lossless"]["acceptance"], opt["acceptance"]
    assert bound["bound"] == pytest.approx((1 + 4 * kept[0]) / (1 + 4 * kept[1]))
    lo, hi = opt["time_per_token_vs_baseline_ci"]
    assert report["baseline"] == "verifier" and "time_per_token_vs_baseline" not in methods["verifier"]
    assert lo <= opt["time_per_token_vs_baseline"] <= hi and opt["acceptance"] is not None
    assert report["machine"]["dtype"] == "float32" and "plugin overhead" in done.stdout
    assert report["machine"]["cores"] == ",".join(map(str, sorted(os.sched_getaffinity(0))))  # every core, none kept
    # the run again: every batch is in its journal, so it summarises them without starting an engine
    again = subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0 and "engines up" not in again.stdout, again.stderr[-3000:]
    assert json.loads(out.read_text())["methods"] == methods
