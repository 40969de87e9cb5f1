"""The learned window judge on the tiny pair: window records -> train -> export -> decode in the loop and
through transformers' generate, with the same window numbers offline and online."""

import json

import numpy as np
import pytest
import torch

from helpers import assert_generate_routes_agree, custom_gen_config, verifier_qa
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from router.decoding import generate
from router.export.golden import reproduce, torch_runner
from router.model import RouterError, load_router
from router.offline.inputs import RecordView
from router.policy import Needs
from router.records import load_records
from router.view import BlockView
from router.window.follow import follow_features
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train

WIDTH = 2


@pytest.fixture(scope="module")
def window_judge(tmp_path_factory, tiny):
    tmp = tmp_path_factory.mktemp("window-judge")
    pair = tiny  # the pair eval loads for tiny:drafter / tiny:verifier
    cfg = custom_gen_config(
        verifier_qa(pair, tmp / "qa.jsonl", n=24), tmp / "rec", batch_size=8, examples_per_shard=12, judge=True,
        window=WIDTH, split_fractions=[0.5, 0.25, 0.25],
    )  # fmt: skip
    run_gen(cfg, Recorder(cfg, *pair))
    train = TrainConfig(records=[str(tmp / "rec")], target="greedy_01_gap", loss="cost_sensitive", max_epochs=2, batch_size=128, output=str(tmp / "judge"), baselines=False, router=RouterArch(head="judge", follow=WIDTH))  # fmt: skip
    metrics = run_train(train)
    return load_router(tmp / "judge"), pair, tmp, metrics


class Probe:
    """A lossless window policy that keeps the windows the loop gives it."""

    name, form, needs = "probe", "judge", Needs({"drafts", "lookahead"}, follow=WIDTH)

    def __init__(self):
        self.seen = []

    def check_alpha(self, alpha):
        return float(alpha)

    def decide(self, view, alpha):
        self.seen.append((view.drafts.clone(), view.follow))
        return view.p


def test_offline_and_online_windows_are_the_same_numbers(window_judge):
    """At a recorded mismatch, the loop decoding greedily from the same prefix drafts the drafter's argmax
    and the chain the recording wrote: the window judge's window inputs agree (one function forms both)."""
    router, (drafter, verifier, tok), tmp, _ = window_judge
    view = RecordView([str(tmp / "rec")], "train")
    recorded = np.asarray(load_records(tmp / "rec", split="train").with_format("numpy")["window"])
    rows = np.nonzero(np.isfinite(recorded[:, 0]))[0]
    assert len(rows) >= 3
    examples = {e["id"]: e for e in map(json.loads, (tmp / "qa.jsonl").read_text().splitlines())}
    checked = 0
    for row in rows[:4]:
        ex = examples[str(view.ds[int(row)]["example_id"])]
        t = int(view.ds[int(row)]["position"])
        prefix = tok.encode(ex["question"]) + tok.encode(ex["answer"])[:t]
        probe = Probe()
        generate(drafter, verifier, torch.tensor([prefix]), rule=probe, gamma=WIDTH + 1, max_new_tokens=WIDTH + 2)
        drafts, online = probe.seen[0]
        assert int(drafts[0, 0]) == int(view.cols["q_argmax"][row])  # the recorded mismatch's draft
        offline = view.follow_windows(np.array([row]), WIDTH)
        torch.testing.assert_close(
            follow_features(offline, WIDTH)[0], follow_features(online, WIDTH)[0, 0], atol=1e-4, rtol=0
        )
        checked += 1
    assert checked >= 3


def test_window_judge_trains_exports_and_decodes_everywhere(window_judge):
    router, (drafter, verifier, tok), tmp, metrics = window_judge
    assert router.needs.follow == WIDTH and router.min_gamma == 1 and router.cfg.follow == WIDTH
    assert np.isfinite(metrics["router"]["area"])
    assert reproduce(tmp / "judge", router.cfg, torch_runner(router))["ok"]  # its golden vectors hold windows
    ids = torch.tensor([tok.encode("Add 3 and 6.\nA:")])
    # gamma 1: every window is cut by the block's end, marked invalid
    assert_generate_routes_agree(drafter, verifier, ids, tmp / "judge", router)
    generate(drafter, verifier, ids, rule=router, alpha=0.0, gamma=3, max_new_tokens=6, temperature=1.0)
    with pytest.raises(RouterError, match=r"window judge\) reads 'follow'"):
        q = torch.full((1, 2, 259), 1 / 259)
        router.decide(BlockView(q, q, drafts=torch.zeros(1, 2, dtype=torch.long), next_p_raw=q), 0.0)


def test_window_judge_needs_window_records(window_judge, tmp_path):
    _, pair, tmp, _ = window_judge
    with pytest.raises(Exception, match="follow .* needs head: judge"):
        TrainConfig(records=[str(tmp / "rec")], router=RouterArch(head="cascade", follow=2))
    view = RecordView([str(tmp / "rec")], "train")
    with pytest.raises(Exception, match="a window judge reads 5: record them with window=5"):
        view.follow_windows(np.arange(3), 5)


def test_eval_scores_a_window_judge_in_the_greedy_view_and_decodes_it(window_judge):
    from specroute import cli

    _, _, tmp, _ = window_judge
    out = tmp / "eval"
    args = [
        "eval", "--config", "configs/eval/tiny.yaml", f"records=[{tmp / 'rec'}]", f"routers=[{tmp / 'judge'}]",
        f"output={out}", "max_prompts=2", "max_new_tokens=6", "online_methods=[judge,token_v2]", "alphas={judge: [0.0]}", "metric=exact_match",
    ]  # fmt: skip
    assert cli.main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "judge" in metrics["offline"]["views"]["greedy"]["methods"]
    assert "judge" not in metrics["offline"]["views"].get("t1", {}).get("methods", {})
    assert {p["method"] for p in metrics["online"]["points"]} >= {"judge", "token_v2"}


def test_fly_scores_offline_in_the_greedy_view_where_windows_exist(window_judge):
    from router.offline.views import greedy_sweeps
    from router.rules import get_rule, register_rule, unregister_rule
    from router.window.fly import fly_keep, fly_rule

    _, _, tmp, _ = window_judge
    view = RecordView([str(tmp / "rec")], "train")
    register_rule(fly_rule(WIDTH, "fly_w2"))
    try:
        sweeps = greedy_sweeps(view)
        assert "fly_w2" in sweeps and "fly" not in sweeps  # fly reads 6 drafts, these records hold 2
        window = view.follow_windows(np.arange(len(view)), WIDTH)
        score = get_rule("fly_w2").offline_score(window)
        mismatch = view.cols["q_argmax"] != view.cols["p_argmax"]
        for alpha in (0.0, 0.5, 1.1):  # the sweep defers where score > -alpha: exactly where fly keeps nothing
            kept = fly_keep(window, alpha, WIDTH).numpy()
            assert np.array_equal(mismatch & ~(score > -alpha), kept)
        assert kept.sum() == 0 and fly_keep(window, 0.0, WIDTH).numpy().any()
    finally:
        unregister_rule("fly_w2")


def test_window_rule_alphas_are_matched_on_minus_the_sweeps_threshold():
    from types import SimpleNamespace

    from eval.config import EvalConfig
    from eval.grid import method_alphas

    curve = SimpleNamespace(threshold=np.array([-0.9, -0.3, 0.0]), rejection=np.array([0.5, 0.2, 0.1]))
    assert method_alphas("fly", EvalConfig(gamma=8), {"fly": curve}, [0.2, 0.5]) == [0.3, 0.9]


def test_paired_gap_differences_use_the_same_resamples(window_judge):
    from eval.offline import compare_views

    router, _, tmp, _ = window_judge
    test = RecordView([str(tmp / "rec")], "test")
    pairs = (("judge", "token_v2"), ("judge", "judge"), ("judge", "absent"))
    views = compare_views([str(tmp / "rec")], test, {"judge": router}, 200, pairs)
    greedy = views["greedy"]
    assert set(greedy["paired"]) == {"judge - token_v2", "judge - judge"}  # a method not scored is left out
    got, methods = greedy["paired"]["judge - token_v2"], greedy["methods"]
    assert got["gap_closed"] == pytest.approx(methods["judge"]["gap_closed"] - methods["token_v2"]["gap_closed"])
    assert greedy["paired"]["judge - judge"] == {"gap_closed": 0.0, "gap_closed_ci": [0.0, 0.0]}
    assert "judge - token_v2" not in views["t1"].get("paired", {})  # a window judge has no temperature-1 view


def test_window_crossfit_study_pairs_the_two_judges_out_of_fold(window_judge, tmp_path, monkeypatch, capsys):
    from helpers import study_module

    _, _, tmp, _ = window_judge
    study = study_module("window_crossfit")
    args = ["x", "--records", str(tmp / "rec"), "--k", "2", "--follow", str(WIDTH), "--hidden", "--epochs", "1"]
    monkeypatch.setattr("sys.argv", [*args, "--out", str(tmp_path / "cf")])
    study.main()
    result = json.loads((tmp_path / "cf" / "crossfit.json").read_text())
    assert result["richer"] == "judge-window"
    assert set(result["richer_minus_judge"]) == {"quality"}
    for t, d in result["richer_minus_judge"]["quality"].items():
        window = result["summaries"]["judge-window"]["targets"][t]["methods"]["judge-window"]["quality"]
        plain = result["summaries"]["judge"]["targets"][t]["methods"]["judge"]["quality"]
        assert d["diff"] == pytest.approx(window - plain) and d["low"] <= d["diff"] <= d["high"]
        assert d["examples"] == 24  # every example scored once, by the fold that never saw it
    assert "judge-window - judge" in capsys.readouterr().out


def test_folders_of_mixed_window_widths_skip_window_rules_instead_of_failing(window_judge, tmp_path):
    import shutil

    from router.offline.views import greedy_sweeps
    from router.rules import register_rule, unregister_rule
    from router.window.fly import fly_rule

    _, _, tmp, _ = window_judge
    other = tmp_path / "rec3"
    shutil.copytree(tmp / "rec", other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["window"] = WIDTH + 1
    (other / "manifest.json").write_text(json.dumps(manifest))
    view = RecordView([str(tmp / "rec"), str(other)], "train")
    assert not view.has_windows(WIDTH)
    register_rule(fly_rule(WIDTH, "fly_w2"))
    try:
        assert "fly_w2" not in greedy_sweeps(view)
    finally:
        unregister_rule("fly_w2")
    with pytest.raises(Exception, match="windows of \\[2, 3\\] following drafts"):
        view.follow_windows(np.arange(3), WIDTH)


@pytest.fixture(scope="module")
def cut_judge(window_judge):
    """The window judge trained for blocks of 2 drafts (follow_block=2)."""
    tmp = window_judge[2]
    train = TrainConfig(records=[str(tmp / "rec")], target="greedy_01_gap", max_epochs=1, batch_size=128, output=str(tmp / "judge-cut"), baselines=False, router=RouterArch(head="judge", follow=WIDTH, follow_block=2))  # fmt: skip
    run_train(train)
    return load_router(tmp / "judge-cut")


def test_a_window_judge_trained_for_a_block_size_reads_windows_cut_as_such_blocks_cut_them(window_judge, cut_judge):
    """follow_block: training and offline scoring cut each recorded window as a block of that size would,
    the router remembers it, and decoding at another block size (or an uncut judge in short blocks) warns."""
    uncut, (drafter, verifier, tok), tmp, _ = window_judge
    with pytest.raises(Exception, match="follow_block=3 cuts a window judge's windows: it needs follow > 0"):
        TrainConfig(records=[str(tmp / "rec")], target="greedy_01_gap", router=RouterArch(head="judge", follow_block=3))
    router = cut_judge
    assert router.cfg.follow_block == 2
    view = RecordView([str(tmp / "rec")], "train")
    rows = np.arange(len(view))
    full, cut = view.follow_windows(rows, WIDTH), view.follow_windows(rows, WIDTH, block=2)
    assert full.valid.sum(-1).max() == WIDTH and cut.valid.sum(-1).max() == 1  # a block of 2: at most 1 follows
    assert (cut.valid <= full.valid).all() and cut.valid.any() and (cut.valid != full.valid).any()
    assert torch.equal(view.follow_windows(rows, WIDTH, block=2).valid, cut.valid)  # seeded: the same cuts
    x_cut = view.inputs(rows, "judge", follow=WIDTH, follow_block=2)
    assert not np.array_equal(x_cut, view.inputs(rows, "judge", follow=WIDTH))
    ids = torch.tensor([tok.encode("Add 3 and 6.\nA:")])
    with pytest.warns(UserWarning, match="trained on windows cut as in blocks of 2 drafts and decodes with gamma 3"):
        generate(drafter, verifier, ids, rule=router, alpha=0.0, gamma=3, max_new_tokens=4)
    with pytest.warns(UserWarning, match="trained on uncut windows, but with gamma 1"):
        generate(drafter, verifier, ids, rule=uncut, alpha=0.0, gamma=1, max_new_tokens=4)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at its own block size (and the uncut judge in long blocks): no warning
        generate(drafter, verifier, ids, rule=router, alpha=0.0, gamma=2, max_new_tokens=4)
        generate(drafter, verifier, ids, rule=uncut, alpha=0.0, gamma=WIDTH + 1, max_new_tokens=4)


def test_window_cut_study_reads_the_rate_at_the_matched_alpha_on_uncut_and_cut_windows(
    window_judge, cut_judge, tmp_path
):
    """studies/window_cut.py on the tiny records: the rejection rate at the matched alpha, and at the same
    alpha with the windows cut for a block size; a judge trained for that block size stays where it was
    matched (its matched rate is read on windows cut the same way)."""
    from helpers import study_module

    _, _, tmp, _ = window_judge
    window_cut = study_module("window_cut")
    rows = window_cut.study([str(tmp / "rec")], [str(tmp / "judge"), str(tmp / "judge-cut")], "test", 2, [0.5])
    by = {r["router"]: r for r in rows}
    assert set(by) == {"judge", "judge-cut"} and by["judge-cut"]["trained_follow_block"] == 2
    assert by["judge-cut"]["matched"] == by["judge-cut"]["at_gamma"]
    for r in rows:
        assert 0 <= r["matched"] <= r["verifier_rejection"] and 0 <= r["at_gamma"] <= r["verifier_rejection"]
    assert window_cut.main(
        ["--records", str(tmp / "rec"), "--routers", str(tmp / "judge"), "--gamma", "2", "--splits", "test",
         "--out", str(tmp_path / "cut")]
    ) == 0  # fmt: skip
    assert (tmp_path / "cut" / "window_cut.csv").read_text().startswith("router,")
