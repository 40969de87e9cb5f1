"""eval: offline metrics on hand-built records, task metrics and the sandboxed executor, an
end-to-end online run on tiny models (outputs, resume), bad input."""

import json
import time

import numpy as np
import pytest
import torch

from eval.executor import run_program
from eval.task_metrics import extract_code, get_metric, gsm8k_metric, humaneval_metric, mbpp_metric, qa_metric
from eval.offline import load_held_out, method_curves, relative_latency, summarise
from specroute import cli
from router.model import LearnedRouter, RouterConfig, RouterNet, load_router, save_router
from router.rules import get_rule, tv_distance
from router.tradeoff import oracle_bound

from records_helpers import synthetic_token_records


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
    qa = qa_metric(" The Eiffel Tower\nbecause", {"aliases": ["Eiffel Tower", "la tour Eiffel"]})
    assert qa["exact_match"] == 1.0 and qa["f1"] == 1.0
    assert qa_metric("Paris, France", {"aliases": ["Paris"]})["f1"] == pytest.approx(2 / 3)
    assert qa_metric("Paris", {"reference": " Paris\n"})["exact_match"] == 1.0  # custom data: the reference
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    assert extract_code(good).startswith("def add")
    assert mbpp_metric(good, {"tests": ["assert add(1, 2) == 3"]})["quality"] == 1.0
    assert mbpp_metric(good.replace("a + b", "a - b"), {"tests": ["assert add(1, 2) == 3"]})["quality"] == 0.0
    loop = mbpp_metric("def add(a, b):\n    while True: pass", {"tests": ["assert add(1, 2) == 3"]}, timeout_s=1)
    assert loop == {"quality": 0.0, "timeout": 1.0}
    he = {"function_prompt": "def inc(x):\n", "entry_point": "inc",
          "test": "def check(f):\n    assert f(1) == 2\n"}
    assert humaneval_metric("    return x + 1\n", he)["quality"] == 1.0  # a bare body completes the prompt
    with pytest.raises(KeyError, match="no task metric"):
        get_metric("custom")


@pytest.fixture(scope="module")
def tiny_pipeline(tmp_path_factory):
    """Tiny records (with examples.jsonl) and a tiny router, made by the real commands."""
    root = tmp_path_factory.mktemp("pipe")
    rec, rtr = root / "records", root / "router"
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", f"output={rec}", "max_examples=16"]) == 0
    assert cli.main(["train", "--config", "configs/train/tiny.yaml", f"records=[{rec}]", f"output={rtr}",
                     "max_epochs=2", "baselines=false"]) == 0
    return root, rec, rtr


def _eval_args(root, rec, rtr, *extra):
    return ["eval", "--config", "configs/eval/tiny.yaml", f"records=[{rec}]", f"routers=[{rtr}]",
            f"output={root / 'eval'}", "max_prompts=2", "max_new_tokens=6",
            "online_methods=[opt,token_v3,router,token_cascade]", *extra]


def test_online_end_to_end_on_tiny_models_writes_everything_and_resumes(tiny_pipeline, capsys):
    root, rec, rtr = tiny_pipeline
    assert cli.main(_eval_args(root, rec, rtr)) == 0
    out = root / "eval"
    for name in ("metrics.json", "curves.csv", "report.md", "eval_config.json", "offline_quality_vs_rejection.png",
                 "offline_quality_vs_latency.png", "online_quality_vs_latency.png", "online_quality_vs_rejection.png"):
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
    assert "online method" in capsys.readouterr().out
    stamps = {f.name: f.stat().st_mtime for f in (out / "online").iterdir()}
    assert cli.main(_eval_args(root, rec, rtr)) == 0  # a rerun reuses every finished point
    assert stamps == {f.name: f.stat().st_mtime for f in (out / "online").iterdir()}
    router = load_router(rtr)  # a retrained router: its points must be decoded again
    with torch.no_grad():
        router.net.body[-1].bias.add_(1.0)
    save_router(router, rtr)
    old = json.loads((out / "online" / "verifier@0.json").read_text())["fingerprint"]["routers"]["router"]
    assert cli.main(_eval_args(root, rec, rtr, "online_methods=[router]")) == 0
    assert (out / "online" / "verifier@0.json").stat().st_mtime != stamps["verifier@0.json"]  # redone
    assert json.loads((out / "online" / "verifier@0.json").read_text())["fingerprint"]["routers"]["router"] != old
    # batched decoding (left-padded) gives the same greedy verifier outputs as one prompt at a time
    args = _eval_args(root, rec, rtr, f"output={root / 'eval-b2'}", "batch_size=2", "offline=false")
    args[args.index("online_methods=[opt,token_v3,router,token_cascade]")] = "online_methods=[token_cascade]"
    assert cli.main(args) == 0
    single = json.loads((out / "online" / "verifier@0.json").read_text())["examples"]
    batched = json.loads((root / "eval-b2" / "online" / "verifier@0.json").read_text())["examples"]
    assert [e["text"] for e in batched] == [e["text"] for e in single]


def test_eval_bad_input(tiny_pipeline, tmp_path, capsys):
    root, rec, rtr = tiny_pipeline
    # a router trained on another pair
    other = LearnedRouter(RouterNet(RouterConfig(arch="mlp", pair={"drafter": "x", "verifier": "y",
                                                                   "tokenizer": "z"})))
    save_router(other, tmp_path / "alien")
    args = _eval_args(root, rec, rtr)
    args[4] = f"routers=[{tmp_path / 'alien'}]"
    assert cli.main(args + [f"output={tmp_path / 'e1'}"]) == 2
    assert "trained on the pair" in capsys.readouterr().err
    # an alpha outside a rule's range is refused before any decoding
    assert cli.main(_eval_args(root, rec, rtr, f"output={tmp_path / 'e2'}", "alphas={token_v3: [3.0]}")) == 2
    assert "outside token_v3's range" in capsys.readouterr().err
    assert not (tmp_path / "e2" / "online").exists()
    # a task without a metric
    assert cli.main(_eval_args(root, rec, rtr, f"output={tmp_path / 'e3'}", "metric=bleu")) == 2
    assert "no task metric" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny", "gsm8k", "mbpp"])
def test_shipped_eval_configs_load(name):
    from eval.run import EvalConfig
    from router.config import load_config

    cfg = load_config(EvalConfig, f"configs/eval/{name}.yaml", [])
    assert cfg.records and cfg.output


def test_eval_logs_to_wandb_offline(tiny_pipeline, tmp_path, monkeypatch):
    root, rec, rtr = tiny_pipeline
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "w"
    assert cli.main(_eval_args(root, rec, rtr, f"output={out}", "online=false", "logger=wandb",
                               "cost_ratio=0.5")) == 0
    runs = list((out / "wandb").glob("offline-run-*"))
    assert runs, "W&B offline run directory missing"
    deadline = time.monotonic() + 60  # wandb-core writes the files from its own process
    while not list(runs[0].glob("files/media/images/*.png")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(runs[0].glob("files/media/images/*.png")) and list(runs[0].glob("files/media/table/*.json"))
