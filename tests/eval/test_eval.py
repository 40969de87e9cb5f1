"""eval: offline metrics on hand-built records, task metrics and the sandboxed executor, an
end-to-end online run on tiny models (outputs, resume), bad input."""

import json
import time

import numpy as np
import pytest
from pathlib import Path
import torch

from data_gen.plan import assign_split
from router.tasks.sandbox import run_program
from eval.paired import batch_fill, bootstrap_mean, compare_point, divergences, longest_row_latency, mcnemar_exact
from router.machine.hardware import cpu_kind
from router.records import read_examples
from router.tasks.metrics import extract_code, get_metric, gsm8k_metric, humaneval_metric, mbpp_metric, qa_metric
from eval.offline import load_held_out, method_curves, relative_latency, summarise
from specroute import cli
from helpers import one_rule_online_eval
from eval.config import EvalConfig
from router.infra.config import load_config
from router.model import LearnedRouter, RouterConfig, RouterNet, load_router, save_router
from router.rules import get_rule
from router.targets import tv_distance
from router.offline.tradeoff import oracle_bound

from helpers import online_point, synthetic_token_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hand_built(tmp_path_factory):
    keep = {}
    folder = synthetic_token_records(tmp_path_factory.mktemp("rec") / "r", keep=keep)
    return folder, keep["test"]


def test_offline_lossless_drafter_and_rules_match_exact_expectations(hand_built):
    folder, (q, p, y) = hand_built
    data = load_held_out([str(folder)])
    curves = method_curves(data, {})
    rows = torch.arange(len(y))
    assert curves["lossless"].quality[0] == pytest.approx(p[rows, y].mean().item(), abs=1e-6)
    assert curves["lossless"].rejection[0] == pytest.approx(tv_distance(p, q).mean().item(), abs=1e-6)
    assert curves["drafter"].rejection[0] == 0.0
    assert curves["drafter"].quality[0] == pytest.approx(q[rows, y].mean().item(), abs=1e-6)
    for name in ("opt", "token_v2"):  # a point of each curve is that rule's exact target at its alpha
        c = curves[name]
        i = len(c.threshold) // 2
        pi = get_rule(name).target(q.float(), p.float(), float(c.threshold[i]))
        assert c.quality[i] == pytest.approx(pi[rows, y].double().mean().item(), abs=1e-4)
        assert c.rejection[i] == pytest.approx(tv_distance(q.float(), pi).double().mean().item(), abs=1e-4)


def test_oracle_is_never_beaten_offline(hand_built):
    folder, _ = hand_built
    data = load_held_out([str(folder)])
    router = LearnedRouter(RouterNet(RouterConfig(arch="mlp")), name="untrained")
    curves = method_curves(data, {"untrained": router})
    for name in ("chow", "diff", "opt", "random", "untrained", "drafter", "lossless"):
        for rej, qual in zip(curves[name].rejection, curves[name].quality):
            assert qual <= oracle_bound(curves["oracle"], rej) + 1e-9, name
    summary = summarise(curves, data, gamma=5, cost_ratio=0.4)
    assert summary["methods"]["oracle"]["area"] == pytest.approx(1.0)
    assert np.isnan(summary["methods"]["lossless"]["area"])  # one point, no trade-off
    assert summary["references"]["verifier"]["relative_latency"] == 1.0


def test_relative_latency_formula():
    # no rejections: gamma + 1 tokens per block for gamma c + 1 verifier-equivalents
    assert relative_latency(np.array([0.0]), 5, 0.4)[0] == pytest.approx(3.0 / 6.0)
    assert relative_latency(np.array([1.0]), 5, 0.4)[0] == pytest.approx(3.0)  # every draft rejected


def test_executor_scores_programs_and_survives_an_infinite_loop():
    assert run_program("assert sum([1, 2]) == 3\n").passed
    wrong = run_program("assert sum([1, 2]) == 4\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.detail
    started = time.monotonic()
    hang = run_program("while True:\n    pass\n", timeout_s=1.5)
    assert hang.status == "timeout" and time.monotonic() - started < 10
    assert run_program("import subprocess\nsubprocess.run(['true'])\n").status == "failed"  # no subprocesses


def test_task_metrics():
    assert gsm8k_metric("She has 3 + 4 = 7 apples.\n#### 7", {"short_answer": "7"})["quality"] == 1.0
    assert gsm8k_metric("The answer is 1,250.", {"short_answer": "1250"})["quality"] == 1.0
    assert gsm8k_metric("It is 8.", {"short_answer": "7"})["quality"] == 0.0
    # the few-shot chain-of-thought form: the stated answer wins over later numbers
    cot = gsm8k_metric(" 5 + 4 = 9. So the answer is 9. Then 12 more", {"short_answer": "9"})
    assert cot == {"quality": 1.0, "answer": "9"}
    assert gsm8k_metric("no number here", {"short_answer": "9"})["answer"] == ""
    qa = qa_metric(" The Eiffel Tower\nbecause", {"aliases": ["Eiffel Tower", "la tour Eiffel"]})
    assert qa["exact_match"] == 1.0 and qa["f1"] == 1.0
    assert qa_metric("Paris, France", {"aliases": ["Paris"]})["f1"] == pytest.approx(2 / 3)
    assert qa_metric("Paris", {"reference": " Paris\n"})["exact_match"] == 1.0  # custom data: the reference
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    assert extract_code(good).startswith("def add")
    assert mbpp_metric(good, {"tests": ["assert add(1, 2) == 3"]})["quality"] == 1.0
    assert mbpp_metric(good.replace("a + b", "a - b"), {"tests": ["assert add(1, 2) == 3"]})["quality"] == 0.0
    loop = mbpp_metric("def add(a, b):\n    while True: pass", {"tests": ["assert add(1, 2) == 3"]}, timeout_s=1)
    assert loop == {"quality": 0.0, "timeout": 1.0, "answer": "timeout"}
    he = {"function_prompt": "def inc(x):\n", "entry_point": "inc", "test": "def check(f):\n    assert f(1) == 2\n"}
    assert humaneval_metric("    return x + 1\n", he)["quality"] == 1.0  # a bare body completes the prompt
    with pytest.raises(KeyError, match="no task metric"):
        get_metric("custom")


@pytest.fixture(scope="module")
def tiny_pipeline(tmp_path_factory):
    """Tiny records (with examples.jsonl) and a tiny router, made by the real commands."""
    root = tmp_path_factory.mktemp("pipe")
    rec, rtr = root / "records", root / "router"
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", f"output={rec}", "max_examples=16"]) == 0
    assert (
        cli.main(
            [
                "train",
                "--config",
                "configs/train/tiny.yaml",
                f"records=[{rec}]",
                f"output={rtr}",
                "max_epochs=2",
                "baselines=false",
            ]
        )
        == 0
    )
    return root, rec, rtr


def _eval_args(root, rec, rtr, *extra):
    return [
        "eval",
        "--config",
        "configs/eval/tiny.yaml",
        f"records=[{rec}]",
        f"routers=[{rtr}]",
        f"output={root / 'eval'}",
        "max_prompts=2",
        "max_new_tokens=6",
        "online_methods=[opt,token_v3,router,token_cascade]",
        *extra,
    ]


def test_online_end_to_end_on_tiny_models_writes_everything_and_resumes(tiny_pipeline, capsys):
    root, rec, rtr = tiny_pipeline
    assert cli.main(_eval_args(root, rec, rtr)) == 0
    out = root / "eval"
    for name in (
        "metrics.json",
        "curves.csv",
        "online_per_prompt.csv",
        "report.md",
        "eval_config.json",
        "offline_quality_vs_rejection.png",
        "offline_quality_vs_latency.png",
        "online_quality_vs_latency.png",
        "online_quality_vs_rejection.png",
    ):
        assert (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    methods = {p["method"] for p in metrics["online"]["points"]}
    assert methods == {"verifier", "drafter", "opt", "token_v3", "router", "token_cascade"}
    verifier = next(p for p in metrics["online"]["points"] if p["method"] == "verifier")
    assert verifier["relative_latency"] == 1.0 and verifier["verifier_calls_per_token"] == 1.0
    assert set(metrics["online"]["tables"]) == methods
    assert "router" in metrics["offline"]["summary"]["methods"]
    report = (out / "report.md").read_text()
    assert "(a) lowest latency" in report and "| router |" in report
    assert "diff to verifier" in capsys.readouterr().out
    assert (
        "Paired with the verifier" in report and "Where the time goes" in report and "Why offline and online" in report
    )
    _check_paired(metrics)
    stamps = {f.name: f.stat().st_mtime for f in (out / "online").iterdir()}
    # a rerun reuses every finished point; paired_with adds the comparison with opt without decoding again
    assert cli.main(_eval_args(root, rec, rtr, "paired_with=[opt]")) == 0
    assert stamps == {f.name: f.stat().st_mtime for f in (out / "online").iterdir()}
    _check_pairwise(json.loads((out / "metrics.json").read_text()), "opt")
    assert "Paired with other methods" in (out / "report.md").read_text()
    assert "paired with other methods" in capsys.readouterr().out
    router = load_router(rtr)  # a retrained router: its points must be decoded again, the others not
    with torch.no_grad():
        router.net.body[-1].bias.add_(1.0)
    save_router(router, rtr)
    old = {f.name: json.loads(f.read_text())["fingerprint"]["routers"] for f in (out / "online").glob("router@*.json")}
    assert old and all(set(r) == {"router"} for r in old.values())  # a point lists its own router only
    assert json.loads((out / "online" / "verifier@0.json").read_text())["fingerprint"]["routers"] == {}
    before = json.loads((out / "online" / "verifier@0.json").read_text())
    assert cli.main(_eval_args(root, rec, rtr, "online_methods=[router]")) == 0
    after = json.loads((out / "online" / "verifier@0.json").read_text())  # kept, its first batch timed again
    assert {k: v for k, v in after.items() if k != "recheck"} == {k: v for k, v in before.items() if k != "recheck"}
    assert after["recheck"]["reused"] and after["recheck"]["first_seconds"] == before["batches"][0]["seconds"]
    new = {
        f.name: json.loads(f.read_text())["fingerprint"]["routers"]
        for f in (out / "online").glob("router@*.json")
        if f.name not in stamps or f.stat().st_mtime != stamps[f.name]
    }
    assert new and all(r["router"] != next(iter(old.values()))["router"] for r in new.values())  # redone
    # points timed on another machine are decoded again (latencies of two machines are not comparable)
    path = next((out / "online").glob("opt@*.json"))
    point = json.loads(path.read_text())
    assert point["fingerprint"]["machine"] == cpu_kind()
    point["fingerprint"]["machine"] = "another CPU"
    path.write_text(json.dumps(point))
    stamp = path.stat().st_mtime
    assert cli.main(_eval_args(root, rec, rtr, "online_methods=[opt]")) == 0
    assert path.stat().st_mtime != stamp and json.loads(path.read_text())["fingerprint"]["machine"] == cpu_kind()
    # batched decoding (left-padded) gives the same greedy verifier outputs as one prompt at a time
    args = _eval_args(root, rec, rtr, f"output={root / 'eval-b2'}", "batch_size=2", "offline=false")
    args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[token_cascade]"
    assert cli.main(args) == 0
    single = json.loads((out / "online" / "verifier@0.json").read_text())["examples"]
    batched = json.loads((root / "eval-b2" / "online" / "verifier@0.json").read_text())["examples"]
    assert [e["text"] for e in batched] == [e["text"] for e in single]


def test_an_online_point_cut_short_resumes_from_its_finished_batches(tiny_pipeline, monkeypatch):
    """A run killed inside a point keeps the batches it finished (journaled): the rerun decodes only
    the others, and the point equals an uninterrupted one (outputs, scores, tokens)."""
    from eval import online

    root, rec, rtr = tiny_pipeline
    args = one_rule_online_eval(rec, "max_prompts=3", "max_new_tokens=6")
    assert cli.main([*args, f"output={root / 'eval-whole'}"]) == 0
    real, calls, killed = online._decode_batch, [], []

    class Killed(RuntimeError):
        pass

    def dies_on_the_second_opt_batch(pair, method, *rest):
        calls.append(method)
        if method == "opt" and calls.count("opt") == 2 and not killed:
            killed.append(True)
            raise Killed  # the run is killed here
        return real(pair, method, *rest)

    monkeypatch.setattr(online, "_decode_batch", dies_on_the_second_opt_batch)
    with pytest.raises(Killed):
        cli.main([*args, f"output={root / 'eval-cut'}"])
    folder = root / "eval-cut" / "online"
    partial = next(folder.glob("opt@*.batches.jsonl"))
    assert len(partial.read_text().splitlines()) == 2  # the fingerprint and one finished batch
    calls.clear()
    assert cli.main([*args, f"output={root / 'eval-cut'}"]) == 0
    # points are decoded interleaved batch by batch (batch 2 in the order drafter, opt, verifier): the rerun
    # decodes only the batches each point lacks, then times the verifier's first batch once more
    assert {m: calls.count(m) for m in set(calls)} == {"opt": 2, "drafter": 1, "verifier": 2 + 1}
    assert not list(folder.glob("*.stale*"))  # the batch journals stay (a rerun with more prompts grows them)
    assert len(partial.read_text().splitlines()) == 1 + 3
    whole = json.loads(next((root / "eval-whole" / "online").glob("opt@*.json")).read_text())
    cut = json.loads(next(folder.glob("opt@*.json")).read_text())
    keep = ("example_id", "text", "tokens", "new_ids", "quality")
    assert [{k: e[k] for k in keep} for e in cut["examples"]] == [{k: e[k] for k in keep} for e in whole["examples"]]
    assert cut["tokens"] == whole["tokens"] and cut["rejection_rate"] == whole["rejection_rate"]
    assert len(cut["batches"]) == 3 and cut["seconds"] == pytest.approx(sum(b["seconds"] for b in cut["batches"]))
    # a damaged point file (cut short) is named and that point made again from its journaled batches (no
    # decoding: only the reused verifier's first batch is timed once more); the others are kept
    point = next(folder.glob("opt@*.json"))
    point.write_text(point.read_text()[:100])
    calls.clear()
    assert cli.main([*args, f"output={root / 'eval-cut'}"]) == 0
    assert calls == ["verifier"]
    assert [e["text"] for e in json.loads(point.read_text())["examples"]] == [e["text"] for e in cut["examples"]]


def _check_paired(metrics):
    """The paired rows: the verifier against itself is exact; every row has its measures."""
    paired = {r["point"]: r for r in metrics["online"]["paired"]}
    assert set(paired) == {f"{p['method']}@{p['alpha']:g}" for p in metrics["online"]["points"]}
    me = paired["verifier@0"]
    assert me["quality_diff"] == 0 and me["quality_diff_ci"] == [0, 0] and me["mcnemar_p"] == 1.0
    assert me["identical_output"] == 1.0 and me["same_answer"] == 1.0 and me["logprob_diff"] == 0
    assert np.isfinite(me["verifier_logprob"]) and me["verifier_logprob"] < 0
    for r in paired.values():
        assert r["prompts"] == metrics["online"]["prompts"]
        assert sum(r["time_split"].values()) == pytest.approx(1.0, abs=0.02)
        assert r["batch_fill"] == 1.0  # batch 1: per-token and longest-row latency are the same measure
        assert r["relative_row_latency"] == pytest.approx(r["relative_latency"])
        lo, hi = r["quality_diff_ci"]
        assert lo <= r["quality_diff"] <= hi
    assert paired["drafter@0"]["time_split"]["verifying"] == 0
    opt = next(r for r in paired.values() if r["method"] == "opt")
    assert 0 <= opt["offline"]["greedy_rejection"] <= 1 and 0 <= opt["offline"]["t1_rejection"] <= 1
    assert np.isfinite(opt["offline"]["predicted_latency"]) and opt["time_split"]["rule"] > 0
    assert paired["verifier@0"]["offline"]["greedy_rejection"] != paired["verifier@0"]["offline"]["greedy_rejection"]


def test_online_prompts_go_beyond_the_recorded_test_split(tiny_pipeline):
    """More prompts than the records' test split: further task examples the split rule holds out."""
    root, rec, rtr = tiny_pipeline
    recorded_test = [e["example_id"] for e in read_examples(rec, split="test")]
    args = _eval_args(
        root,
        rec,
        rtr,
        f"output={root / 'eval-more'}",
        "offline=false",
        f"max_prompts={len(recorded_test) + 3}",
        "max_new_tokens=3",
    )
    args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[lossless]"
    assert cli.main(args) == 0
    metrics = json.loads((root / "eval-more" / "metrics.json").read_text())
    assert metrics["online"]["prompts"] == len(recorded_test) + 3
    assert metrics["online"]["recorded_test_prompts"] == len(recorded_test)
    ids = [
        e["example_id"] for e in json.loads((root / "eval-more" / "online" / "verifier@0.json").read_text())["examples"]
    ]
    all_recorded = {e["example_id"] for e in read_examples(rec)}
    assert ids[: len(recorded_test)] == recorded_test and not set(ids[len(recorded_test) :]) & all_recorded
    config = json.loads((rec / "gen_config.json").read_text())
    assert all(assign_split(i, config["seed"], config["split_fractions"]) == "test" for i in ids)


def test_paired_statistics_by_hand():
    # McNemar: 6 prompts only the method gets right, 1 only the verifier: p = 2 * P(X <= 1), X ~ Bin(7, 1/2)
    a = np.array([1] * 6 + [0] + [1] * 3 + [0] * 2)
    b = np.array([0] * 6 + [1] + [1] * 3 + [0] * 2)
    assert mcnemar_exact(a, b) == pytest.approx(2 * (1 + 7) / 2**7)
    assert mcnemar_exact(a, a) == 1.0 and np.isnan(mcnemar_exact(np.array([0.5]), np.array([1.0])))
    lo, hi = bootstrap_mean(a - b, 2000)
    assert lo < (a - b).mean() < hi and lo > -0.2
    assert bootstrap_mean(np.zeros(5), 100) == [0.0, 0.0]
    ex = [
        {
            "example_id": str(i),
            "quality": float(q),
            "answer": str(q),
            "new_ids": [i, q],
            "verifier_logprob": -1.0 * (i + 1),
            "verifier_logprob_tokens": 2,
        }
        for i, q in enumerate(a)
    ]
    ref = [{**e, "quality": float(q), "answer": str(q), "new_ids": [int(e["example_id"]), q]} for e, q in zip(ex, b)]
    row = compare_point(ex, ref, 500)
    assert row["quality_diff"] == pytest.approx(5 / 12) and row["same_answer"] == pytest.approx(5 / 12)
    assert row["identical_output"] == pytest.approx(5 / 12) and row["logprob_diff"] == 0
    assert row["verifier_logprob"] == pytest.approx(sum(-1.0 * (i + 1) for i in range(12)) / 24)


def _check_pairwise(metrics: dict, method: str) -> None:
    """Every other point is paired with each of the method's points, with the paired statistics."""
    names = [f"{p['method']}@{p['alpha']:g}" for p in metrics["online"]["points"]]
    others = [n for n in names if n.startswith(f"{method}@")]
    rows = metrics["online"]["pairwise"]
    assert {(r["point"], r["against"]) for r in rows} == {(n, o) for o in others for n in names if n != o}
    for r in rows:
        lo, hi = r["quality_diff_ci"]
        assert lo <= r["quality_diff"] <= hi and 0 <= r["mcnemar_p"] <= 1 and r["latency_ratio"] > 0


def test_pairwise_table_by_hand():
    # judge right on prompts 0-3, token_v2 on 2-5: diff +0 overall, 2 discordant each way
    from eval.paired import pairwise_table

    per_prompt = {
        "judge@0.2": [{"example_id": str(i), "quality": float(i < 4)} for i in range(6)],
        "token_v2@0.4": [{"example_id": str(i), "quality": float(i >= 2)} for i in range(6)],
        "verifier@0": [{"example_id": str(i), "quality": 1.0} for i in range(6)],
    }
    points = [
        online_point("judge", 0.2, relative_latency=0.6),
        online_point("token_v2", 0.4, relative_latency=0.8),
        online_point("verifier", 0.0, relative_latency=1.0),
    ]
    rows = {(r["point"], r["against"]): r for r in pairwise_table(per_prompt, points, ["token_v2"], 500)}
    assert set(rows) == {("judge@0.2", "token_v2@0.4"), ("verifier@0", "token_v2@0.4")}
    judge = rows[("judge@0.2", "token_v2@0.4")]
    assert judge["quality_diff"] == 0 and judge["mcnemar_p"] == 1.0 and judge["latency_ratio"] == pytest.approx(0.75)
    assert judge["same_answer"] == pytest.approx(2 / 6) and judge["prompts"] == 6
    verifier = rows[("verifier@0", "token_v2@0.4")]
    assert verifier["quality_diff"] == pytest.approx(2 / 6) and verifier["mcnemar_p"] == pytest.approx(0.5)
    assert pairwise_table(per_prompt, points, [], 500) == []


def test_batch_fill_and_divergences():
    # the demo's opt batch: one 128-token row with three short ones fills a third of the batch
    opt = [{"tokens": t} for t in (128, 13, 19, 10, 9, 16, 9, 84)]
    verifier = [{"tokens": t} for t in (108, 57, 28, 128, 31, 83, 88, 70)]
    assert batch_fill(opt, 4) == pytest.approx(288 / (4 * 128 + 4 * 84))
    assert batch_fill(verifier, 4) == pytest.approx(593 / (4 * 128 + 4 * 88))
    assert batch_fill(opt, 1) == 1.0
    point = online_point("opt", 0.3, batches=[{"seconds": 12.8, "longest": 128}, {"seconds": 8.4, "longest": 84}])
    assert longest_row_latency(point) == pytest.approx(0.1)
    rows = [
        {
            "point": "opt@0.3",
            "offline": {
                "rejection_ratio": 3.0,
                "measured_rejection": 0.3,
                "greedy_rejection": 0.1,
                "latency_ratio": 1.1,
                "measured_latency": 0.9,
                "predicted_latency": 0.82,
            },
        },
        {
            "point": "lossless@0",
            "offline": {
                "rejection_ratio": 1.0,
                "measured_rejection": 0.1,
                "greedy_rejection": 0.1,
                "latency_ratio": float("nan"),
                "measured_latency": 0.5,
                "predicted_latency": float("nan"),
            },
        },
    ]
    assert divergences(rows) == ["opt@0.3: online rejection rate 0.300 is 3.00x the offline prediction 0.100"]


def test_eval_bad_input(tiny_pipeline, tmp_path, capsys):
    root, rec, rtr = tiny_pipeline
    # a router trained on another pair
    other = LearnedRouter(RouterNet(RouterConfig(arch="mlp", pair={"drafter": "x", "verifier": "y", "tokenizer": "z"})))
    save_router(other, tmp_path / "alien")
    args = _eval_args(root, rec, rtr)
    args[4] = f"routers=[{tmp_path / 'alien'}]"
    assert cli.main(args + [f"output={tmp_path / 'e1'}"]) == 2
    assert "trained on the pair" in capsys.readouterr().err
    # an alpha outside a rule's range is refused before any decoding
    assert cli.main(_eval_args(root, rec, rtr, f"output={tmp_path / 'e2'}", "alphas={token_v3: [3.0]}")) == 2
    assert "outside token_v3's range" in capsys.readouterr().err
    assert not (tmp_path / "e2" / "online").exists()
    # a paired_with method that is not decoded online is refused before any decoding
    assert cli.main(_eval_args(root, rec, rtr, f"output={tmp_path / 'e4'}", "paired_with=[token_v2]")) == 2
    assert "paired_with names ['token_v2'], which are not decoded online" in capsys.readouterr().err
    assert not (tmp_path / "e4" / "online").exists()
    # an unknown metric, refused when the config is built
    assert cli.main(_eval_args(root, rec, rtr, f"output={tmp_path / 'e3'}", "metric=bleu")) == 2
    assert "metric must be one of gsm8k" in capsys.readouterr().err


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(ROOT)) for p in [*ROOT.glob("configs/eval/*.yaml"), *ROOT.glob("configs/studies/eval/*.yaml")]
    ),
)
def test_shipped_eval_configs_load(path):
    from eval.config import EvalConfig
    from router.infra.config import load_config

    cfg = load_config(EvalConfig, ROOT / path, [])
    assert cfg.records and cfg.output


def test_eval_logs_to_wandb_offline(tiny_pipeline, tmp_path, monkeypatch):
    root, rec, rtr = tiny_pipeline
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "w"
    assert cli.main(_eval_args(root, rec, rtr, f"output={out}", "online=false", "logger=wandb", "cost_ratio=0.5")) == 0
    runs = list((out / "wandb").glob("offline-run-*"))
    assert runs, "W&B offline run directory missing"
    deadline = time.monotonic() + 60  # wandb-core writes the files from its own process
    while not list(runs[0].glob("files/media/images/*.png")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(runs[0].glob("files/media/images/*.png")) and list(runs[0].glob("files/media/table/*.json"))


def test_gamma_auto_is_calibrated_once_stored_and_used_by_every_point(tiny_pipeline, monkeypatch, capsys):
    from router.machine import calibrate

    root, rec, rtr = tiny_pipeline
    out = root / "eval-gamma"
    args = _eval_args(root, rec, rtr, f"output={out}", "offline=false", "gamma=auto", "draft_stop=0.5")
    args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[lossless,opt]"
    for _ in range(2):  # the tiny pair's passes take milliseconds: a load spike (another job) can make gamma
        # auto refuse its timings as implausible, which is right for a user and no fault of this path
        code = cli.main(args)
        if "could not measure the pair's costs plausibly" not in capsys.readouterr().err:
            break
    assert code == 0
    chosen = json.loads((out / "gamma.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["gamma"]["gamma"] == chosen["gamma"] == metrics["config"]["gamma"]
    assert 0 <= chosen["acceptance"] <= 1 and len(chosen["verify_seconds"]) == calibrate.MAX_GAMMA + 1
    points = [json.loads(p.read_text()) for p in (out / "online").glob("*.json")]
    assert {p["fingerprint"]["gamma"] for p in points} == {chosen["gamma"]}
    assert {p["fingerprint"]["draft_stop"] for p in points} == {0.5}
    assert f"gamma {chosen['gamma']} was chosen on" in (out / "report.md").read_text()
    # a rerun on this machine reuses the choice (no new measurement) and every finished point
    monkeypatch.setattr(calibrate, "measure_costs", lambda *a: pytest.fail("calibrated again"))
    assert cli.main(args) == 0
    assert json.loads((out / "gamma.json").read_text()) == chosen
    with pytest.raises(Exception, match="gamma must be an integer from 1 to 128"):
        load_config(EvalConfig, None, ["gamma=fast"])
    with pytest.raises(Exception, match="draft_stop must be in"):
        load_config(EvalConfig, None, ["draft_stop=2"])


def test_bonus_from_reaches_every_speculative_point_and_its_fingerprint(tiny_pipeline, monkeypatch):
    """eval's bonus_from goes to generate for each speculative point and into its fingerprint: points
    decoded with p at the bonus position (the default) are redone with bonus_from=target (the exact
    bonus), never reused."""
    import eval.online as online

    root, rec, rtr = tiny_pipeline
    out = root / "eval-bonus"
    args = _eval_args(root, rec, rtr, f"output={out}", "offline=false", "cost_ratio=0.5")
    args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[opt]"
    assert cli.main(args) == 0
    made = {p.name: json.loads(p.read_text()) for p in (out / "online").glob("opt@*.json")}
    assert made and {p["fingerprint"]["bonus_from"] for p in made.values()} == {"verifier"}
    seen = []
    real = online.generate
    monkeypatch.setattr(online, "generate", lambda *a, **kw: seen.append(kw["bonus_from"]) or real(*a, **kw))
    fp = next(iter(made.values()))["fingerprint"]
    assert not online.same_fingerprint(fp, {**fp, "bonus_from": "target"})
    assert cli.main(args) == 0 and seen == []  # same settings: every point reused
    assert cli.main(args + ["bonus_from=target"]) == 0 and seen and set(seen) == {"target"}
    redone = [json.loads(p.read_text()) for p in (out / "online").glob("opt@*.json")]
    assert {p["fingerprint"]["bonus_from"] for p in redone} == {"target"}
    with pytest.raises(Exception, match="bonus_from must be one of target, verifier"):
        load_config(EvalConfig, None, ["bonus_from=drafter"])


def test_greedy_online_alphas_are_matched_in_the_greedy_view_on_validation(tiny_pipeline, capsys):
    """Greedy decoding drafts argmaxes and rejects where they differ from the verifier's: the online
    alphas come from each method's greedy-view curve, at fractions of lossless's greedy rejection
    (the temperature-1 curve put a judge at alpha 3040, where it never defers), read on the records'
    validation split (match_split), not on the test examples the results are reported on."""
    from eval.grid import alphas_at_rejection
    from eval.offline import greedy_curves

    root, rec, rtr = tiny_pipeline
    got = {}
    for split in ("validation", "test"):
        out = root / f"eval-greedy-alphas-{split}"
        args = _eval_args(
            root, rec, rtr, f"output={out}", "offline=false", "max_prompts=1", "max_new_tokens=2",
            "online_rejection_targets=[0.5]", *([] if split == "validation" else ["match_split=test"]),
        )  # fmt: skip
        args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[opt,token_v2,router]"
        assert cli.main(args) == 0
        held = load_held_out([str(rec)], split=split)
        curves = greedy_curves(held, {"router": load_router(rtr)})
        target = 0.5 * float(np.mean(held.cols["q_argmax"] != held.cols["p_argmax"]))
        points = json.loads((out / "metrics.json").read_text())["online"]["points"]
        for method in ("opt", "token_v2", "router"):
            rng = get_rule(method).alpha_range if method != "router" else None
            (want,) = alphas_at_rejection(curves[method].threshold, curves[method].rejection, [target], rng)
            got[split, method] = [p["alpha"] for p in points if p["method"] == method]
            assert got[split, method] == [want], (split, method)
    assert any(got["validation", m] != got["test", m] for m in ("opt", "token_v2", "router"))
    with pytest.raises(Exception, match="match_split is the records' split online alphas are matched on"):
        load_config(EvalConfig, None, ["match_split=heldout"])
    import eval.run as eval_run
    from router.records import RecordsError

    real = eval_run.load_held_out

    def no_validation_rows(folders, split="test", mode="gold"):  # records recorded without a validation split
        if split == "validation":
            raise RecordsError("no gold-mode rows in the validation split")
        return real(folders, split, mode)

    out = root / "eval-no-validation"
    args = _eval_args(root, rec, rtr, f"output={out}", "offline=false", "max_prompts=1", "max_new_tokens=2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eval_run, "load_held_out", no_validation_rows)
        args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[lossless,opt]"
        assert cli.main(args) == 2
        assert (
            "opt's online alpha is matched to its offline curve on the records' validation split, which holds no rows"
            in (capsys.readouterr().err)
        )
        assert cli.main([*args, "alphas={opt: [0.5]}"]) == 0  # given by hand (and lossless needs none): fine


def test_methods_are_timed_interleaved_so_a_load_change_lands_on_all(tiny_pipeline, monkeypatch):
    """A machine that is slow for the first half of the run (another job ending): every point gets
    its share of the slow batches, and the verifier's batch timed again at the end disagrees with its
    first timing, which the report names as a timing warning."""
    from eval import online
    from router.infra import clock

    root, rec, _ = tiny_pipeline
    real_decode, real_now, state = online._decode_batch, clock.now, {"calls": 0, "extra": 0.0, "slow": set()}

    def now():
        if state["calls"] <= 6:  # the first 6 decoding calls of 12 (3 points x 4 batches) run slow
            state["extra"] += 0.02
        return real_now() + state["extra"]

    def decode(pair, method, alpha, ids, *rest):
        state["calls"] += 1
        if state["calls"] <= 6:
            state["slow"].add((method, state["calls"]))
        return real_decode(pair, method, alpha, ids, *rest)

    monkeypatch.setattr(clock, "now", now)
    monkeypatch.setattr(online, "_decode_batch", decode)
    out = root / "eval-slow"
    args = one_rule_online_eval(rec, "max_prompts=4", "max_new_tokens=6", f"output={out}")
    assert cli.main(args) == 0
    slow_per_method = {m: sum(1 for x, _ in state["slow"] if x == m) for m in ("verifier", "drafter", "opt")}
    assert slow_per_method == {"verifier": 2, "drafter": 2, "opt": 2}  # one after another: 4, 2, 0
    online_metrics = json.loads((out / "metrics.json").read_text())["online"]
    warnings = online_metrics["timing_warnings"]
    assert any("verifier@0's first batch took" in w and "the machine's speed changed" in w for w in warnings)
    assert "Timing warning" in (out / "report.md").read_text()


def test_timing_checks_by_hand():
    from eval.points import timing_warnings

    drafter = online_point("drafter", 0.0, seconds_per_token=0.010)
    fast = online_point("opt", 0.3, seconds_per_token=0.005)
    fine = online_point("lossless", 0.0, seconds_per_token=0.012)
    verifier = online_point(
        "verifier", 0.0, seconds_per_token=0.03, recheck={"first_seconds": 1.0, "again_seconds": 1.1}
    )
    said = timing_warnings([verifier, drafter, fast, fine])
    assert len(said) == 1 and said[0].startswith("opt@0.3: 5.0 ms per token, faster than the drafter alone (10.0 ms)")
    verifier.recheck["again_seconds"] = 0.5
    assert any(
        "verifier@0's first batch took 1.00 s when first timed and 0.50 s" in w for w in timing_warnings([verifier])
    )
    verifier.recheck = {"first_seconds": 1.0, "again_seconds": 1.1, "reused": True}  # 10%: too much across runs
    (said,) = timing_warnings([verifier])
    assert said.startswith("verifier@0 was reused from an earlier run and its first batch, timed again in this one")
    verifier.recheck["again_seconds"] = 1.02
    assert timing_warnings([verifier]) == []


def test_a_run_that_reuses_the_reference_times_it_again(tiny_pipeline, monkeypatch):
    """A second run adding a method reuses the verifier's point from the first: its first batch is timed
    again in the second run, and a machine slower by then is named in a timing warning."""
    from router.infra import clock

    root, rec, _ = tiny_pipeline
    out = root / "eval-reused"
    args = [
        "eval", "--config", "configs/eval/tiny.yaml", f"records=[{rec}]", "routers=[]", "offline=false",
        "max_prompts=2", "max_new_tokens=4", "online_rejection_targets=[0.5]", f"output={out}",
    ]  # fmt: skip
    assert cli.main([*args, "online_methods=[opt]"]) == 0
    first = json.loads((out / "online" / "verifier@0.json").read_text())
    assert not first["recheck"].get("reused")
    real_now, state = clock.now, {"extra": 0.0}

    def slow_now():  # the machine is slower now: every interval timed comes out 0.5 s longer per clock read
        state["extra"] += 0.5
        return real_now() + state["extra"]

    monkeypatch.setattr(clock, "now", slow_now)
    assert cli.main([*args, "online_methods=[opt,token_v2]"]) == 0
    ref = json.loads((out / "online" / "verifier@0.json").read_text())
    assert ref["recheck"]["reused"] and ref["recheck"]["again_seconds"] > ref["recheck"]["first_seconds"] + 0.4
    warnings = json.loads((out / "metrics.json").read_text())["online"]["timing_warnings"]
    assert any("was reused from an earlier run" in w for w in warnings)


def test_a_window_rule_decodes_online_at_its_own_block_size(tiny_pipeline, monkeypatch):
    """gammas gives fly the longer blocks its window needs, while the other methods keep gamma; its
    points say so in their fingerprint and stats."""
    import eval.online as online

    root, rec, rtr = tiny_pipeline
    out = root / "eval-fly"
    args = _eval_args(root, rec, rtr, f"output={out}", "offline=false", "cost_ratio=0.5", "gammas={fly: 8}")
    args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[opt,fly]"
    seen = {}
    real = online.generate
    monkeypatch.setattr(
        online, "generate", lambda *a, **kw: seen.setdefault(kw["rule"], kw["gamma"]) and real(*a, **kw)
    )
    assert cli.main(args) == 0
    assert seen == {"opt": 4, "fly": 8}
    fly = [json.loads(p.read_text()) for p in (out / "online").glob("fly@*.json")]
    assert len(fly) == 3 and all(p["fingerprint"]["gamma"] == 8 and "gammas" not in p["fingerprint"] for p in fly)
