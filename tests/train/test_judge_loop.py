"""Judge routers: what the loop samples with one, and the tiny pipeline record -> train -> decode -> views."""

import json

import numpy as np
import math

import pytest
import torch

from helpers import StubLM, custom_gen_config, verifier_qa
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from router.decoding import generate
from router.model import RouterError, load_router
from router.offline.inputs import RecordView
from router.pair import tiny_pair
from router.offline.views import best_of, areas, compare, method_sweeps
from router.policy import Needs
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train

V = 8
Q = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.05, 0.05, 0.03, 0.02])
P = torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.02, 0.03, 0.05])
KEEP = {0, 4}  # the stub judge keeps these drafted tokens, verifies the others losslessly


class StubJudge:
    """A judge whose decision depends on the drafted token only."""

    name, form, needs = "stub_judge", "judge", Needs({"drafts", "lookahead"})

    def check_alpha(self, alpha):
        return float(alpha)

    def decide(self, view, alpha):
        drafts, q, p = view.drafts, view.q, view.p
        keep = torch.zeros_like(drafts, dtype=torch.bool)
        for v in KEEP:
            keep |= drafts == v
        return torch.where(keep[..., None], torch.nn.functional.one_hot(drafts, q.shape[-1]).to(p.dtype), p)


def judge_distribution(q, p, keep):
    """pi(v) = q(v) [v kept] + min(q(v), p(v)) [v verified] + beta norm(max(0, p - q))(v),
    beta = sum over verified u of max(0, q(u) - p(u)): the distribution docs/method.md states."""
    kept = torch.tensor([v in keep for v in range(len(q))])
    beta = torch.where(kept, 0.0, (q - p).clamp_min(0)).sum()
    residual = (p - q).clamp_min(0) / (p - q).clamp_min(0).sum()
    return torch.where(kept, q, torch.minimum(q, p)) + beta * residual


def test_judge_sampler_draws_the_stated_distribution():
    drafter = StubLM(probs=lambda t: Q, vocab=V)
    verifier = StubLM(probs=lambda t: P, vocab=V)
    n = 20000
    out = generate(
        drafter, verifier, torch.full((n, 1), 3), rule=StubJudge(), gamma=1, temperature=1.0, max_new_tokens=1, seed=3
    )
    first = out.sequences[:, 1]
    freq = torch.bincount(first, minlength=V).double() / n
    expected = judge_distribution(Q.double(), P.double(), KEEP)
    assert torch.allclose(expected.sum(), torch.tensor(1.0, dtype=torch.float64))
    stat = float(((freq - expected) ** 2 / expected).sum() * n)  # chi-square, 7 degrees of freedom
    assert stat < 24.3, (freq, expected)  # p = 0.001
    # its rejection rate: drafts verified and refused, E = sum over verified v of max(0, q(v) - p(v))
    refused = sum(max(0.0, float(Q[v] - P[v])) for v in range(V) if v not in KEEP)
    assert abs(out.stats["rejection_rate"] - refused) < 0.015
    assert abs(out.stats["expected_rejection_rate"] - refused) < 0.015


@pytest.fixture(scope="module")
def judge_router(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("judge")
    pair = tiny_pair(seed=2)
    data = verifier_qa(pair, tmp / "qa.jsonl")
    cfg = custom_gen_config(
        data,
        tmp / "rec",
        batch_size=8,
        examples_per_shard=16,
        hidden_states="verifier",
        judge=True,
        split_fractions=[0.5, 0.25, 0.25],
    )
    run_gen(cfg, Recorder(cfg, *pair))
    train = TrainConfig(
        records=[str(tmp / "rec")],
        target="greedy_01_gap",
        loss="cost_sensitive",
        max_epochs=3,
        batch_size=128,
        output=str(tmp / "judge"),
        router=RouterArch(head="judge", hidden_inputs=["after", "verifier"]),
    )
    metrics = run_train(train)
    return load_router(tmp / "judge"), pair, tmp / "rec", metrics


def test_judge_trains_exports_and_reports_the_greedy_view(judge_router):
    router, _, _, metrics = judge_router
    assert router.form == "judge" and "bonus_q" not in router.needs
    assert router.cfg.hidden_sizes["after"] == router.cfg.hidden_sizes["verifier"] > 0
    assert int(router.net.token_classes.sum()) > 0  # the class table travelled with the export
    area = metrics["router"]["area"]
    assert math.isfinite(area) and area == pytest.approx(router.cfg.metrics["router"]["area"])  # exported as measured
    assert "token_v2" in metrics["plugins"] and math.isfinite(metrics["plugins"]["token_v2"])


@pytest.mark.parametrize("alpha,reference", [(1e9, "drafter"), (-1e9, "verifier")])
def test_judge_in_the_loop_is_exact_at_its_ends(judge_router, alpha, reference):
    """Temperature 0: keeping every draft is the drafter's greedy output; keeping none the verifier's."""
    router, (drafter, verifier, tok), _, _ = judge_router
    prompts = [tok.encode("Add 3 and 6.\nA:"), tok.encode("Add 10 and 13.\nA:")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    out = generate(drafter, verifier, ids, rule=router, alpha=alpha, gamma=3, max_new_tokens=12, attention_mask=mask)
    model = drafter if reference == "drafter" else verifier
    for b, prompt in enumerate(prompts):
        ref = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
        )[0, len(prompt) :].tolist()
        got = out.sequences[b, width:][out.sources[b] >= 0].tolist()
        assert got == ref[: len(got)] and len(got) == min(12, len(ref))
    generate(
        drafter, verifier, ids, rule=router, alpha=0.0, gamma=3, max_new_tokens=6, attention_mask=mask, temperature=1.0
    )  # a well-defined sampler at temperature 1 too


def test_judge_needs_drafts(judge_router):
    router = judge_router[0]
    q = torch.full((2, 259), 1 / 259)
    with pytest.raises(RouterError, match="judge"):
        router.target(q, q, 0.0)


def test_views_give_gap_closed_with_intervals_over_examples(judge_router):
    router, _, rec, _ = judge_router
    val, test = RecordView([str(rec)], "validation"), RecordView([str(rec)], "test")
    routers = {"judge": router}
    chosen = {
        view: best_of(areas(s), [n for n in s if n not in ("oracle", "judge")])
        for view, s in method_sweeps(val, routers).items()
    }
    for view, sweeps in method_sweeps(test, routers).items():
        out = compare(sweeps, chosen[view], replicates=200)
        best = out["methods"][chosen[view]]
        assert best["gap_closed"] == pytest.approx(0.0) and out["methods"]["oracle"]["gap_closed"] == pytest.approx(1.0)
        lo, hi = out["methods"]["judge"]["gap_closed_ci"]
        assert lo <= hi and np.isfinite([lo, hi]).all()
        assert out["examples"] == len(set(test.traj))


def test_eval_runs_a_judge_offline_and_online(judge_router, tmp_path, monkeypatch):
    import router.backends.torch_models as tiny_module  # where load_pair builds the tiny pair
    from eval.run import EvalConfig, run_eval

    monkeypatch.setattr(tiny_module, "tiny_pair", lambda *a, **k: tiny_pair(seed=2))  # the records' pair

    router, _, rec, _ = judge_router
    folder = rec.parent / "judge"
    cfg = EvalConfig(
        records=[str(rec)],
        routers=[str(folder)],
        online_methods=["judge", "token_v2"],
        max_prompts=2,
        max_new_tokens=6,
        metric="exact_match",
        bootstrap=100,
        drafter="tiny:drafter",
        verifier="tiny:verifier",
        dtype="float32",
        output=str(tmp_path / "eval"),
    )
    metrics = run_eval(cfg)
    views = metrics["offline"]["views"]
    assert set(views) == {"greedy", "t1"} and views["greedy"]["best_router"] == "judge"
    assert "judge" in views["t1"]["methods"] and "judge" in metrics["offline"]["summary"]["methods"]
    assert {p["method"] for p in metrics["online"]["points"]} >= {"judge", "token_v2", "verifier"}
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "greedy view" in report and "gap closed" in report


def test_judge_study_script(judge_router, tmp_path, monkeypatch, capsys):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("judge_study", "studies/judge.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    rec = judge_router[2]
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "judge.py",
            "--records",
            str(rec),
            "--out",
            str(tmp_path / "s"),
            "--variants",
            "token,judge-qp,judge-after",
            "--epochs",
            "1",
            "--curve",
            "0.5",
            "--bootstrap",
            "50",
        ],
    )
    study.main()
    result = json.loads((tmp_path / "s" / "study.json").read_text())
    assert set(result["views"]["greedy"]["methods"]) >= {"token", "judge-qp", "judge-after", "token_v2", "oracle"}
    assert set(result["learning_curve"]) == {"0.5", "1"}
    assert "gap closed" in capsys.readouterr().out


def test_temperature1_view_matches_the_exact_offline_curves(judge_router):
    """The views' per-example sweeps give the same normalised areas as router.offline.tradeoff's exact curves
    (the drafter point first for token-form methods; the grid costs at most a little area)."""
    from eval.offline import method_curves
    from router.rules import offline_rules
    from router.offline.tradeoff import normalised_area

    view = RecordView([str(judge_router[2])], "validation")
    exact = method_curves(view, {})
    point = areas(method_sweeps(view, {}, ("t1",))["t1"])
    for name in offline_rules():
        assert point[name] / point["oracle"] == pytest.approx(normalised_area(exact[name], exact["oracle"]), abs=0.02)


def test_study_retrains_when_its_records_change(judge_router, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("judge_study2", "studies/judge.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    rec = str(judge_router[2])
    overrides = study.VARIANTS["judge-qp"]
    _, first = study.train_variant("judge-qp", overrides, [rec], tmp_path, epochs=1)
    _, again = study.train_variant("judge-qp", overrides, [rec], tmp_path, epochs=1)
    assert first == first and again != again  # trained, then reused (NaN seconds)
    router = load_router(tmp_path / "routers" / "judge-qp")
    router.cfg.records_id = "other"
    from router.model import save_router

    save_router(router, tmp_path / "routers" / "judge-qp")
    _, retrained = study.train_variant("judge-qp", overrides, [rec], tmp_path, epochs=1)
    assert retrained == retrained  # records differ from the router's: trained again


def test_eval_without_a_validation_split_skips_the_comparison(tmp_path, tiny):
    """The views choose the best rule on validation: records without that split still evaluate."""
    from eval.run import EvalConfig, run_eval

    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"Q{i}?\nA:", "answer": f" {i} and more."}) + "\n" for i in range(12)
        )
    )
    cfg = custom_gen_config(
        data,
        tmp_path / "rec",
        split_fractions=[0.6, 0.0, 0.4],
    )
    run_gen(cfg, Recorder(cfg, *tiny))
    with pytest.warns(UserWarning, match="no gap-closed comparison"):
        metrics = run_eval(
            EvalConfig(records=[str(tmp_path / "rec")], online=False, cost_ratio=0.3, output=str(tmp_path / "eval"))
        )
    assert metrics["offline"]["views"] == {} and metrics["offline"]["summary"]["methods"]
