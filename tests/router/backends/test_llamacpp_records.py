"""Recording on llama.cpp (data_gen with engine=llamacpp) on the tiny GGUF pair: the record columns, judge
inputs, window inputs, short-horizon scores and consequence labels hold the torch models' numbers up to
llama.cpp's rounding; a shared prompt prefix is decoded once per model and kept between batches; `specroute gen`
records on llama.cpp end to end, says so in its manifest, and routers trained on those records decode there.
In CI llama-cpp-python is installed by the test command and these tests must run."""

import os

import numpy as np
import pytest
import torch

if os.environ.get("CI") != "true":
    pytest.importorskip("llama_cpp")

from data_gen.consequence import ConsequenceSearch  # noqa: E402
from data_gen.horizon import horizon_scores  # noqa: E402
from data_gen.scoring import score_batch  # noqa: E402
from router.decoding import generate  # noqa: E402
from router.backends.llamacpp import LlamaCppLM, choose_threads  # noqa: E402
from router.backends.llamacpp_lib import PREFIX_SEQ  # noqa: E402
from router.loop.prefix import SharedPrefix  # noqa: E402
from helpers import length_metric  # noqa: E402
from router.backends.llamacpp_backend import tiny_gguf_pair  # noqa: E402
from router.pair import tiny_pair  # noqa: E402

SEED, NOISE = 2, 0.05  # a drafter that often disagrees with the verifier: mismatches to label


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(torch pair, llama.cpp pair) of the same tiny models."""
    paths = tiny_gguf_pair(tmp_path_factory.mktemp("gguf"), SEED, NOISE)
    torch_pair = tiny_pair(SEED, NOISE)
    return torch_pair, (LlamaCppLM(paths[0], 1), LlamaCppLM(paths[1], 1), torch_pair[2])


def _batch():
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 250, (40,), generator=g).tolist()
    prompts = [shared + [5, 6, 7], shared + [9, 10]]
    conts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (12, 7)]
    return shared, prompts, conts


@pytest.mark.parametrize("shared", [False, True], ids=["no-prefix", "shared-prefix"])
def test_record_columns_on_llama_cpp_hold_the_torch_numbers(pairs, shared):
    """Every column score_batch writes (statistics, features, top-k, hidden states, judge inputs from forked
    sequences, window chains), llama.cpp against torch on the same weights (float32 both)."""
    (td, tv, _), (ld, lv, _) = pairs
    prefix_ids, prompts, conts = _batch()
    args = dict(vocab=259, pad_id=0, top_k=4, hidden="both", draft_seeds=[1, 2], judge=True, window=3)
    args["prefix"] = SharedPrefix(prefix_ids) if shared else None
    with torch.inference_mode():
        want = score_batch(td, tv, prompts, conts, **args)
    got = score_batch(ld, lv, prompts, conts, **args)
    flips = 0
    for a, b in zip(want, got):
        same_sample = a["draft_token"] == b["draft_token"]  # an inverse-CDF sample may flip at a boundary
        flips += int((~same_sample).sum())
        for key, x in a.items():
            x, y = np.asarray(x), np.asarray(b[key])
            if key.startswith("sample_") or key in ("draft_token", "q_draft", "p_draft"):
                x, y = x[same_sample], y[same_sample]
            if x.dtype.kind == "f":
                seen = np.isfinite(x)
                assert np.array_equal(seen, np.isfinite(y)), key
                assert np.abs(x[seen].astype(np.float32) - y[seen].astype(np.float32)).max() < 0.02, key
            else:
                assert np.array_equal(x, y), key
        assert np.isfinite(a["window"]).any()  # mismatches had windows: the comparison is not vacuous
    assert flips <= 2


def test_short_horizon_scores_on_llama_cpp(pairs):
    """horizon_scores with continuations read from the answer, regenerated greedily, and given, on forked
    sequences: as torch's tree-masked forwards."""
    (_, tv, _), (_, lv, _) = pairs
    prefix_ids, prompts, conts = _batch()
    answer = conts[0]
    mismatches = [(1, 40), (4, 41), (6, 42), (9, 43)]
    kw = dict(horizons=(0, 3, 5), regenerate={(4, 41): 77}, continuations={(6, 42): (12, [13, 14, 15])})
    for prefix in (None, SharedPrefix(prefix_ids)):
        with torch.inference_mode():
            want = horizon_scores(tv, prompts[0], answer, mismatches, prefix=prefix, **kw)
        got = horizon_scores(lv, prompts[0], answer, mismatches, prefix=prefix, **kw)
        assert np.abs(want - got).max() < 0.01 and np.abs(want).max() > 0.1


def test_consequence_search_on_llama_cpp_finds_the_torch_labels(pairs):
    """The consequence search (verifier answers, looked-up branches, drafter argmaxes, shared prefix) on
    llama.cpp: the same answers and labels as on torch (greedy decoding on logits within ~0.004 of each other;
    a near-tie could flip a token, none does for these prompts)."""
    found = []
    shared = [7, 9, 11, 13] * 10
    prompts = [shared + [20 + i, 30 + 2 * i, 40 + 3 * i] for i in range(4)]
    for drafter, verifier, tok in pairs:
        search = ConsequenceSearch(
            drafter, verifier, tok, length_metric, [], 259, 0, 14, 3, batch_size=2, prefix=SharedPrefix(shared)
        )
        with torch.inference_mode():
            found.append(search.run(prompts, [{}] * len(prompts)))
    assert [(s.tokens, s.labels) for s in found[0]] == [(s.tokens, s.labels) for s in found[1]]
    assert sum(s.tested for s in found[1]) > 0


def test_a_shared_prefix_is_decoded_once_and_kept_between_batches(pairs):
    """generate on prompts sharing a 40-token prefix: the same tokens with the prefix copied into each row as
    with every prompt decoded whole; the second batch finds the prefix in the context the first one left."""
    _, (ld, lv, _) = pairs
    prefix_ids, prompts, _ = _batch()
    ids = torch.tensor([prompts[0][:42], prompts[1][:42]])
    whole = generate(ld, lv, ids, rule="lossless", gamma=3, max_new_tokens=10)
    prefix = SharedPrefix(prefix_ids)
    first = generate(ld, lv, ids, rule="lossless", gamma=3, max_new_tokens=10, prefix=prefix)
    assert torch.equal(whole.sequences, first.sequences)
    kept = [c for c in lv._free if c.prefix == tuple(prefix_ids)]
    assert kept, "the verifier's context keeps the prefix for the next batch"
    before = kept[0].prefix
    again = generate(ld, lv, ids, rule="lossless", gamma=3, max_new_tokens=10, prefix=prefix)
    assert torch.equal(again.sequences, first.sequences) and kept[0].prefix is before  # reused, not re-decoded


def test_the_fork_primitive_sees_only_the_rows_first_cells(pairs):
    """A forked sequence holds its row's tokens before `at`: the logits of a token placed there equal a fresh
    decode of the row's first `at` tokens followed by that token."""
    _, (_, lv, _) = pairs
    from router.loop.layout import Layout

    row = [5, 17, 33, 41, 8, 60, 61]
    cache = lv.kv_cache(259)
    cache.feed(Layout(torch.tensor([row]), torch.ones(1, 7, dtype=torch.long)), 7, keep=1)
    seq = cache.fork(0, 3)
    assert seq != 0 and seq < PREFIX_SEQ
    placed, _ = cache.extend([(seq, [99, 100])])
    cache.drop([seq])
    fresh = lv.kv_cache(259)
    want = fresh.feed(Layout(torch.tensor([row[:3] + [99, 100]]), torch.ones(1, 5, dtype=torch.long)), 5, keep=2)
    assert (placed[0] - want[0]).abs().max() < 1e-3


def test_threads_follow_the_machine(monkeypatch):
    """threads=0 takes the physical cores, or 1 when other work is running; a number given is kept."""
    from router.backends import llamacpp_lib

    assert choose_threads(3) == (3, "as set (threads=N)")
    assert 1 <= llamacpp_lib.physical_cores() <= os.cpu_count()
    assert 0 <= llamacpp_lib.other_work(samples=2, every=0.01) < 10_000
    monkeypatch.setattr(llamacpp_lib, "physical_cores", lambda: 4)
    monkeypatch.setattr(llamacpp_lib, "other_work", lambda: 0.4)
    assert choose_threads(0)[0] == 4
    monkeypatch.setattr(llamacpp_lib, "other_work", lambda: 3.0)
    n, why = choose_threads(0)
    assert n == 1 and "busy" in why and "threads=N" in why


def test_the_engines_benchmark_records_on_both_engines_side_by_side(tmp_path):
    """benchmarks/engines.py --tiny: both stages on both engines in ABBA order, the ratio and the agreement of the
    two engines' records written (the same float32 weights: argmaxes agree, consequence answers alike)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "engines"
    cmd = [sys.executable, str(root / "benchmarks" / "engines.py"), "--tiny", "--examples", "4", "--threads", "1"]
    cmd += ["--batch-size", "2", "--mismatches", "2", "--budget", "12", "--horizon", "3", "--judge", "--out", str(out)]
    env = {**os.environ, "SPECROUTE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.with_suffix(".json").read_text())
    rows = {row["stage"]: row for row in result["stages"]}
    assert set(rows) == {"prefill", "decode batch 1", "decode batch 4", "gold", "consequence"}
    assert all(
        rows[s]["torch_tokens_per_s"] > 0 < rows[s]["llamacpp_tokens_per_s"] for s in ("prefill", "decode batch 4")
    )
    gold, labels = rows["gold"], rows["consequence"]
    assert len(gold["run_seconds"]) == 4 and gold["speedup"] > 0
    assert gold["p_argmax_agreement"] > 0.98 and gold["q_argmax_agreement"] > 0.98
    assert labels["same_answer"] >= 3 and labels["labels_agree"] == labels["labels_compared"] > 0
    assert result["llamacpp"]["threads"] == 1 and "kernels) 1 threads" in done.stdout
    assert out.with_suffix(".csv").exists()


@pytest.mark.e2e
def test_the_tiny_demo_runs_on_llama_cpp(tmp_path, capsys, monkeypatch):
    """`specroute demo --preset tiny --engine llamacpp --threads 1`: every stage on llama.cpp (the records'
    manifest and the online points say so), the time estimate priced on llama.cpp."""
    import json

    from specroute import cli

    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out), "--engine", "llamacpp", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "engine llamacpp: as set" in printed and "kernels), 1 threads" in printed  # the estimate's line
    summary = json.loads((out / "demo_summary.json").read_text())
    assert summary["engines"] == {"recording": "llamacpp", "evaluation": "llamacpp"}
    manifest = json.loads((out / "records" / "gsm8k" / "manifest.json").read_text())
    assert manifest["dtype"]["engine"] == "llamacpp"
    assert "kernels) with 1 threads" in (out / "eval" / "gsm8k" / "report.md").read_text()


def test_auto_prices_each_stage_on_both_engines_and_keeps_records_made(tmp_path, monkeypatch):
    """--engine auto on a preset that may use llama.cpp: each stage goes to the engine priced cheaper, records
    already made on one engine stay on it, and without llama-cpp-python everything stays on torch."""
    import sys

    from specroute import demo, presets
    from router.machine.costs import PairCosts
    from specroute.estimate import Estimate

    assert presets.engine_candidates("cpu", "auto")[0] == ("torch", "llamacpp")
    assert presets.engine_candidates("tiny", "auto")[0] == ("torch",)
    prices = {"torch": {"recording": 60.0, "training": 5.0, "evaluation": 900.0}}
    prices["llamacpp"] = {"recording": 240.0, "training": 5.0, "evaluation": 300.0}

    def priced(out, p):
        engine = p.models.get("engine", "torch")
        costs = PairCosts(1, 4, 0.01, 0.03, 0.02, 0.05, 0.1, 2.0)
        return Estimate(dict(prices[engine]), costs, "cpu", engine, 1.0) if prices[engine] else None

    monkeypatch.setattr(demo, "estimate", priced)
    p, expected, engines = demo.choose_engines(tmp_path, presets.PRESETS["tiny"], ("torch", "llamacpp"), 1)
    assert engines == {"recording": "torch", "evaluation": "llamacpp"}
    assert p.models["engine"] == "torch" and p.eval_extra["engine"] == "llamacpp" and p.eval_extra["threads"] == 1
    assert expected.total == 60 + 5 + 300 and set(expected.alternatives) == {"torch", "llamacpp"}
    assert (
        "torch for recording, llamacpp for evaluation" in expected.line()
        and "on llamacpp alone 9 min" in expected.line()
    )
    prices["llamacpp"] = None  # every stage finished on llama.cpp: nothing is recorded again on torch
    _, expected, engines = demo.choose_engines(tmp_path, presets.PRESETS["tiny"], ("torch", "llamacpp"), 0)
    assert expected is None and engines == {"recording": "llamacpp", "evaluation": "llamacpp"}
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if it were not installed
    candidates, why = presets.engine_candidates("cpu", "auto")
    assert candidates == ("torch",) and "scripts/setup.sh llamacpp" in why


def test_labels_searched_on_torch_replay_on_llama_cpp(tmp_path, monkeypatch, capsys):
    """A label file searched on the torch tiny pair replays into a llama.cpp recording of the GGUF files those
    models were written as: one warning (the same weights, another engine), the stored labels in the rows."""
    from data_gen.label_store import export_labels
    from router.records import load_records
    from specroute import cli

    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path / "cache"))
    base = ["gen", "--config", "configs/gen/tiny.yaml", "max_examples=6", "modes=[consequence]"]
    base += ["consequence_max_new_tokens=12", "consequence_max_mismatches=2"]
    assert cli.main([*base, f"output={tmp_path / 'torch'}"]) == 0
    header = export_labels(tmp_path / "torch", tmp_path / "labels.jsonl.gz")
    assert header["dtype"] == "float32"
    replay = [*base, f"output={tmp_path / 'llama'}", "engine=llamacpp", "threads=1"]
    assert cli.main([*replay, f"labels_from={tmp_path / 'labels.jsonl.gz'}"]) == 0
    assert "was searched on torch (float32) from the GGUF files" in capsys.readouterr().err
    torch_rows, llama_rows = (load_records(tmp_path / f).sort("example_id") for f in ("torch", "llama"))
    assert torch_rows["token"] == llama_rows["token"] and torch_rows["consequence"] == llama_rows["consequence"]
