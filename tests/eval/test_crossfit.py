"""Cross-fitting (router/offline/folds.py, train/crossfit.py, eval/crossfit.py): every labelled example
scored once out of fold, no leakage, and the pairing exact (a router that copies a rule scores as it)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from eval.crossfit import out_of_fold
from eval.crossfit_summary import summarise
from helpers import synthetic_token_records
from router.features import FEATURE_NAMES
from router.infra.config import ConfigError
from router.model import LearnedRouter, RouterConfig, RouterError, RouterNet, save_router
from router.offline.folds import fold_folder, fold_plan, read_plan, train_share, write_plan
from train.crossfit import labelled_examples


def test_training_shares_are_nested_and_seeded():
    ids = [f"ex{i}" for i in range(40)]
    quarter, half, whole = (train_share(ids, share, seed=1) for share in (0.25, 0.5, 1.0))
    assert len(quarter) == 10 and len(half) == 20 and whole == sorted(ids)
    assert set(quarter) < set(half) < set(whole)
    assert train_share(list(reversed(ids)), 0.5, seed=1) == half and train_share(ids, 0.5, seed=2) != half
    assert train_share(ids[:1], 0.1) == ["ex0"]  # at least one example
    with pytest.raises(ValueError, match="share must be in"):
        train_share(ids, 0.0)


def test_folds_score_every_example_once_and_never_train_on_it():
    ids = [f"ex{i}" for i in range(53)]
    plan = fold_plan(ids, 5, seed=3)
    scored = [i for fold in plan for i in fold["scored"]]
    assert sorted(scored) == sorted(ids) and len(set(scored)) == len(ids)
    assert {len(f["scored"]) for f in plan} <= {10, 11}  # balanced
    for fold in plan:
        assert not set(fold["scored"]) & (set(fold["train"]) | set(fold["validation"]))
        assert sorted(fold["train"] + fold["validation"] + fold["scored"]) == sorted(ids)
    assert fold_plan(list(reversed(ids)), 5, seed=3) == plan  # the records' order does not matter
    assert fold_plan(ids, 5, seed=4) != plan
    with pytest.raises(ValueError, match="at least 2 examples per fold"):
        fold_plan(ids[:5], 5)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return synthetic_token_records(tmp_path_factory.mktemp("cf") / "rec", n_examples=60)


@pytest.fixture(scope="module")
def consequence_records(tmp_path_factory):
    return synthetic_token_records(tmp_path_factory.mktemp("cfc") / "rec", n_examples=60, consequence=True)


def _copy_of_opt() -> RouterNet:
    """A linear cascade router whose predicted gap is max p - max q: its defer score (gap / TV) is
    exactly `opt`'s, (max p - max q) / TV."""
    net = RouterNet(RouterConfig(arch="linear"))
    with torch.no_grad():
        net.body.weight.zero_()
        net.body.bias.zero_()
        net.body.weight[0, FEATURE_NAMES.index("p_max_minus_q_max")] = 1.0
    return net


def _hand_cross_fit(folder, records, mode: str = "gold", k: int = 2, make=_copy_of_opt):
    """A cross-fitted folder built by hand: folds.json and one router per fold recording its examples."""
    plan = fold_plan(labelled_examples([str(records)], mode), k)
    folder.mkdir(parents=True, exist_ok=True)
    write_plan(folder, plan, 0, 0.2, [str(records)])
    (folder / "train_config.json").write_text(json.dumps({"mode": mode}))
    for f, fold in enumerate(plan):
        net = make()
        net.cfg.trained_on = {"example_ids": {"train": fold["train"], "validation": fold["validation"]}}
        save_router(LearnedRouter(net, name=folder.name), fold_folder(folder, f))
    return folder


def test_a_router_that_copies_a_rule_scores_as_that_rule_out_of_fold(records, tmp_path):
    folder = _hand_cross_fit(tmp_path / "opt-copy", records)
    result = out_of_fold(folder, [str(records)])
    for t, table in result["sums"].items():
        for key in ("rejections", "quality", "positions"):
            assert np.array_equal(table["opt-copy"][key], table["opt"][key]), (t, key)
    summary = summarise(result, reps=200)
    for block in summary["targets"].values():
        mine, opt = block["methods"]["opt-copy"], block["methods"]["opt"]
        assert mine["quality"] == opt["quality"] and mine["rejection"] == opt["rejection"]
        assert mine["examples"] == 60  # every example, once


def _opposite_of_opt() -> RouterNet:
    """Defers where opt keeps most surely."""
    net = _copy_of_opt()
    with torch.no_grad():
        net.body.weight.neg_()
    return net


def test_the_best_router_is_chosen_per_fold_on_validation_among_cross_fits(records, tmp_path):
    """Several cross-fitted folders on one fold plan: per fold "best_router" is scored as the router it
    chose; folders of other folds are refused."""
    from eval.crossfit import out_of_fold_results

    good = _hand_cross_fit(tmp_path / "opt-copy", records)
    bad = _hand_cross_fit(tmp_path / "opt-opposite", records, make=_opposite_of_opt)
    result = out_of_fold([bad, good], [str(records)])
    assert result["routers"] == ["opt-opposite", "opt-copy"] and result["router"] == "best_router"
    sizes = np.cumsum([0] + [len(f["scored"]) for f in read_plan(good)["folds"]])
    for t, table in result["sums"].items():
        assert result["best_rule_per_fold"][t] == out_of_fold(good, [str(records)])["best_rule_per_fold"][t]
        for f, name in enumerate(result["best_router_per_fold"][t]):
            fold = slice(sizes[f], sizes[f + 1])
            for key in ("rejections", "quality", "positions"):
                assert np.array_equal(table["best_router"][key][fold], table[name][key][fold]), (t, f, key)
    summary = summarise(result, reps=100)["targets"]["0.5"]
    assert summary["best_router_per_fold"] == result["best_router_per_fold"][0.5]
    both = out_of_fold_results([good, bad], [str(records)], reps=50)
    assert {"opt-copy", "opt-opposite", "best router"} <= set(both)
    assert "best_router" in both["best router"]["targets"]["0.5"]["methods"]
    other = _hand_cross_fit(tmp_path / "three", records, k=3)
    with pytest.raises(RouterError, match="other folds"):
        out_of_fold([good, other], [str(records)])
    assert "best router" not in out_of_fold_results([good, other], [str(records)], reps=50)
    from eval.best_router import table
    from specroute import cli

    argv = ["best-router", str(good), str(bad), "--records", str(records), "--reps", "50", "--out", str(tmp_path / "s")]
    assert cli.main(argv) == 0
    saved = json.loads((tmp_path / "s" / "best_router.json").read_text())["summaries"]["all-matched"]
    assert saved["routers"] == ["opt-copy", "opt-opposite"] and "best_router_per_fold" in saved["targets"]["0.5"]
    assert "best_router |" in "\n".join(table(saved))
    assert cli.main(["best-router", str(good), "--records", str(records), "--out", str(tmp_path / "one")]) == 2


def test_the_best_router_and_the_best_rule_are_each_the_best_on_validation():
    """One fold by hand: the validation gain of deferring at each row is known; the router (and the rule)
    ranking by it is chosen over its opposite, and routers never count as the best rule."""
    from eval.crossfit import _score_fold

    rng = np.random.default_rng(0)
    gain = rng.normal(size=200)  # what deferring at a row adds to quality, on validation and scored rows

    def on(defer):
        return {"quality": np.array([float(gain[defer].sum())]), "positions": np.array([len(gain)])}

    scores = {"rule_up": gain, "rule_down": -gain, "router_down": -gain, "router_up": gain + 1}
    sums, chosen = {0.5: {}}, {0.5: {"rule": [], "router": []}}
    _score_fold(sums, chosen, ["router_down", "router_up"], "quality", scores, scores, (on, on), (np.ones(200), None))
    assert chosen[0.5] == {"rule": ["rule_up"], "router": ["router_up"]}
    assert sums[0.5]["best_router"] == sums[0.5]["router_up"] and sums[0.5]["best_rule"] == sums[0.5]["rule_up"]


def test_matched_the_best_rule_is_chosen_at_validations_own_matched_rate():
    """A rule whose scores all tie reaches no target by threshold: it defers at every row of validation.
    Where deferring always helps, it wins there unmatched; matched, every rule defers the same number of
    validation rows, and the one ranking rows by their gain is chosen."""
    from eval.crossfit import _score_fold

    gain = np.abs(np.random.default_rng(1).normal(size=200)) + 0.1  # deferring helps everywhere, unevenly

    def on(defer):
        return {"quality": np.array([float(gain[defer].sum())]), "positions": np.array([len(gain)])}

    scores = {"rule_tied": np.zeros(200), "rule_up": gain, "router": gain}
    cost = np.ones(200)
    for scored_cost, expected in ((None, "rule_tied"), (cost, "rule_up")):
        sums, chosen = {0.5: {}}, {0.5: {"rule": [], "router": []}}
        _score_fold(sums, chosen, ["router"], "quality", scores, scores, (on, on), (cost, scored_cost))
        assert chosen[0.5]["rule"] == [expected]


def test_a_fold_router_scored_on_examples_it_saw_is_refused(records, tmp_path):
    folder = _hand_cross_fit(tmp_path / "swapped", records)
    shutil.move(fold_folder(folder, 0), folder / "tmp")
    shutil.move(fold_folder(folder, 1), fold_folder(folder, 0))
    shutil.move(folder / "tmp", fold_folder(folder, 1))  # each fold now holds the other fold's router
    with pytest.raises(RouterError, match="trained on .* of the examples it would be scored on"):
        out_of_fold(folder, [str(records)])


def test_the_answer_level_measure_counts_tested_mismatches_only(consequence_records, tmp_path):
    """Kept shares are over tested mismatches (untested ones count as rejections only), and the
    out-of-fold run reports them at every target with the best rule paired against itself at 0."""
    from eval.crossfit import _example_sums
    from router.offline.inputs import RecordView
    from router.labels import HARMLESS, IMPORTANT, UNTESTED

    view = RecordView([str(consequence_records)], "all", "consequence")
    label = view.cols["consequence"]
    mismatch = view.cols["q_argmax"] != view.cols["p_argmax"]
    keep_all = _example_sums(view)(np.zeros(len(label), dtype=bool))
    defer_all = _example_sums(view)(np.ones(len(label), dtype=bool))
    assert keep_all["important_kept"].sum() == keep_all["important"].sum() == (label == IMPORTANT).sum()
    assert defer_all["important_kept"].sum() == 0 and defer_all["harmless_kept"].sum() == 0
    assert keep_all["harmless"].sum() == (label == HARMLESS).sum()
    # an untested mismatch is a rejection when deferred, and in neither share
    assert defer_all["rejections"].sum() == mismatch.sum() > (label == IMPORTANT).sum() + (label == HARMLESS).sum()
    assert (label == UNTESTED).sum() > 0
    folder = _hand_cross_fit(tmp_path / "opt-copy", consequence_records, mode="consequence")
    summary = summarise(out_of_fold(folder, [str(consequence_records)]), reps=100)
    for block in summary["targets"].values():
        best = block["methods"]["best_rule"]
        assert 0 <= best["important"] <= 1 and 0 <= best["harmless"] <= 1
        assert best["important_vs_best_rule"] == {"diff": 0.0, "low": 0.0, "high": 0.0}
    half = summary["targets"]["0.5"]["methods"]
    assert half["opt-copy"]["important"] == half["opt"]["important"]
    # over the tested mismatches alone: the rejection rate is a share of them, untested rows count nowhere
    tested = np.isin(label, (IMPORTANT, HARMLESS))
    only = _example_sums(view, tested)(np.ones(int(tested.sum()), dtype=bool))
    assert only["rejections"].sum() == only["positions"].sum() == tested.sum()
    from eval.crossfit import out_of_fold_results

    both = out_of_fold_results([folder], [str(consequence_records)], reps=100)
    assert set(both) == {"opt-copy", "opt-copy (tested only)", "opt-copy (matched)", "opt-copy (tested only, matched)"}
    assert both["opt-copy (tested only)"]["tested_only"] and not both["opt-copy (tested only)"]["matched"]
    half = both["opt-copy (tested only)"]["targets"]["0.5"]["methods"]
    assert half["opt-copy"]["important"] == half["opt"]["important"]
    assert abs(half["opt"]["rejection"] - 0.5) < 0.1  # half of the tested mismatches deferred (the verifier: all)


def test_first_order_change_by_hand():
    """Per problem: an answer flips once however many of its flipping drafts are kept; untested and neutral
    rows never count; a problem with nothing kept is 0."""
    from router.labels import HARM, NEUTRAL, RESCUE, UNTESTED, first_order_change

    signs = np.array([RESCUE, RESCUE, NEUTRAL, HARM, HARM, UNTESTED, RESCUE], dtype=np.int8)
    index = np.array([0, 0, 0, 1, 1, 1, 2])
    kept = np.array([True, True, True, False, True, True, False])
    assert first_order_change(signs, kept, index, 4).tolist() == [1, -1, 0, 0]
    assert first_order_change(signs, np.zeros(7, bool), index, 3).tolist() == [0, 0, 0]


def test_the_signed_measure_is_the_first_order_accuracy_change_and_the_oracle_bounds_it(consequence_records, tmp_path):
    """signed: per problem +1 where a kept draft rescues a wrong answer, -1 where one harms a right one,
    averaged over problems; deferring everywhere is the verifier (0); the signed labels' oracle is reported
    beside every method, never chosen as the best rule, and at matched rates keeps no harm it can defer."""
    from eval.crossfit import ORACLE, _example_sums
    from router.offline.inputs import RecordView
    from router.offline.views import example_index
    from router.labels import HARM, RESCUE, signed_consequence

    view = RecordView([str(consequence_records)], "all", "consequence")
    signs = signed_consequence(view.cols["consequence"], view.cols["answer_correct"])
    assert (signs == HARM).any() or (signs == RESCUE).any()
    sums = _example_sums(view)
    defer_all, keep_all = sums(np.ones(len(signs), dtype=bool)), sums(np.zeros(len(signs), dtype=bool))
    assert (defer_all["signed_kept"] == 0).all() and (defer_all["signed"] == 1).all()
    index, n = example_index(view)
    for e in range(n):  # keeping every draft: +1 for a wrong answer with a rescue, -1 for a right one with a harm
        mine = signs[index == e]
        assert keep_all["signed_kept"][e] == int((mine == RESCUE).any()) - int((mine == HARM).any())
    folder = _hand_cross_fit(tmp_path / "opt-copy", consequence_records, mode="consequence")
    summary = summarise(out_of_fold(folder, [str(consequence_records)], matched=True), reps=100)
    assert "signed" in summary["measures"]
    for block in summary["targets"].values():
        rows = block["methods"]
        assert ORACLE in rows and ORACLE not in block["best_rule_per_fold"] and block["hindsight_rule"] != ORACLE
        assert rows[ORACLE]["signed"] >= rows["best_rule"]["signed"]
    top = summary["targets"]["0.75"]["methods"]  # budget enough to defer every harm: none kept
    assert top[ORACLE]["signed"] >= 0


def test_the_best_rule_can_be_chosen_by_the_signed_measure(consequence_records, tmp_path):
    """choose_by="signed": per fold the rule best by the signed measure on validation (hindsight too), named
    in the summary; an unknown measure is refused with the ones there are."""
    from eval.crossfit import _out_of_fold, populations
    from eval.crossfit_summary import hindsight_rule

    folder = _hand_cross_fit(tmp_path / "opt-copy", consequence_records, mode="consequence")
    records = [str(consequence_records)]
    by_signed = populations(folder, records, reps=50, choose_by="signed")["tested-matched"]
    assert by_signed["chosen_by"] == "signed"
    raw = _out_of_fold([folder], records, (0.5,), ((True, True),), "signed")[(True, True)]
    table = raw["sums"][0.5]
    assert by_signed["targets"]["0.5"]["hindsight_rule"] == hindsight_rule(table, raw["routers"], "signed")
    assert populations(folder, records, reps=50)["tested-matched"]["chosen_by"] == "important"
    with pytest.raises(ValueError, match="not a measure of these records"):
        populations(folder, records, reps=50, choose_by="quality")


def test_matched_operating_points_give_every_method_the_target_rejection_rate(consequence_records, tmp_path):
    """Thresholds from validation examples miss the target on the scored ones by different amounts per
    method; matched, every method defers the same share of the scored rows (up to ties), reading no label."""
    folder = _hand_cross_fit(tmp_path / "opt-copy", consequence_records, mode="consequence")
    for tested in (False, True):
        matched = summarise(out_of_fold(folder, [str(consequence_records)], tested_only=tested, matched=True), reps=50)
        assert matched["matched"] and matched["tested_only"] == tested
        for target, block in matched["targets"].items():
            rates = [row["rejection"] for row in block["methods"].values()]
            assert max(rates) - min(rates) < 0.01, rates  # every method at the same rate, tied scores too
            if tested:  # over the tested mismatches the verifier's rate is 1: the target itself
                assert rates[0] == pytest.approx(float(target), abs=0.01)
        same = summarise(out_of_fold(folder, [str(consequence_records)], tested_only=tested), reps=50)
        copy = [block["methods"]["opt-copy"]["important"] for block in matched["targets"].values()]
        assert copy == [block["methods"]["opt"]["important"] for block in matched["targets"].values()]
        assert same["targets"].keys() == matched["targets"].keys()


def test_cross_fit_training_then_eval_out_of_fold(records, tmp_path, capsys):
    from eval.config import EvalConfig
    from eval.run import run_eval
    from train.config import TrainConfig
    from train.run import run_train

    out = tmp_path / "mlp-cf"
    cfg = TrainConfig(
        records=[str(records)], cross_fit=2, max_epochs=2, batch_size=256, baselines=False, output=str(out)
    )
    run_train(cfg)
    plan = read_plan(out)
    for f, fold in enumerate(plan["folds"]):
        seen = json.loads((fold_folder(out, f) / "config.json").read_text())["trained_on"]["example_ids"]
        assert seen == {"train": fold["train"], "validation": fold["validation"]}
    run_train(cfg)  # a rerun keeps the finished folds
    assert capsys.readouterr().out.count("is finished, kept") == 2
    with pytest.raises(ValueError, match="other folds"):
        run_train(TrainConfig(records=[str(records)], cross_fit=3, max_epochs=1, baselines=False, output=str(out)))
    half = tmp_path / "mlp-cf-half"  # a learning-curve point: half of each fold's training examples
    run_train(dataclasses.replace(cfg, cross_fit_train_share=0.5, output=str(half)))
    assert read_plan(half)["folds"] == plan["folds"]  # the same folds: curve points pair up example by example
    for f, fold in enumerate(plan["folds"]):
        seen = json.loads((fold_folder(half, f) / "config.json").read_text())["trained_on"]["example_ids"]
        assert seen == {"train": train_share(fold["train"], 0.5), "validation": fold["validation"]}
        assert set(seen["train"]) < set(fold["train"]) and len(seen["train"]) == round(len(fold["train"]) / 2)
    with pytest.raises(ConfigError, match="only with cross_fit=K"):
        TrainConfig(records=[str(records)], cross_fit_train_share=0.5)
    metrics = run_eval(
        EvalConfig(
            records=[str(records)],
            routers=[str(out)],
            online=False,
            bootstrap=100,
            cost_ratio=0.3,
            output=str(tmp_path / "ev"),
        )
    )
    block = metrics["offline"]["out_of_fold"]["mlp-cf"]["targets"]["0.5"]
    assert {"mlp-cf", "best_rule", "opt", "token_v2"} <= set(block["methods"])
    assert len(block["best_rule_per_fold"]) == 2
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "### Out of fold: mlp-cf (2-fold cross-fitting" in report


def test_a_recording_in_progress_can_be_snapshotted_for_cross_fitting(tmp_path, capsys):
    """`specroute snapshot`: the finished shards of a folder without a manifest (a recording still running) are
    copied with the manifest a finished run would write, and read like any folder; bad requests are one line."""
    from pathlib import Path

    from data_gen.config import GenConfig
    from data_gen.run import run_gen
    from router.infra.config import load_config
    from data_gen.prompts import unrecorded_prompts
    from router.records import load_records, read_examples, read_manifest
    from specroute import cli

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "running"
    run_gen(load_config(GenConfig, root / "configs/gen/tiny.yaml", [f"output={src}", "max_examples=24"]))
    shards = read_manifest(src).shards
    (src / "manifest.json").unlink()  # as if the run were still going: no manifest, one shard not yet written
    (src / shards[-1]["file"]).unlink()
    assert cli.main(["snapshot", str(src), str(tmp_path / "snap")]) == 0
    assert f"{len(shards) - 1} of {len(shards)} shards" in capsys.readouterr().out
    snap = read_manifest(tmp_path / "snap")
    assert [s["file"] for s in snap.shards] == [s["file"] for s in shards[:-1]]
    assert len(load_records(tmp_path / "snap")) == sum(s["rows"] for s in shards[:-1])
    assert not (src / "manifest.json").exists()  # the source is only read
    assert cli.main(["snapshot", str(src), str(tmp_path / "snap")]) == 2
    assert "exists: name a new folder" in capsys.readouterr().err
    assert cli.main(["snapshot", str(tmp_path), str(tmp_path / "s2")]) == 2  # not a recording
    assert "no gen_config.json" in capsys.readouterr().err and not (tmp_path / "s2").exists()
    # a finished folder with shards left out: they become the held-out prompts of `specroute prompts`
    run_gen(load_config(GenConfig, root / "configs/gen/tiny.yaml", [f"output={src}", "max_examples=24"]))
    last = Path(shards[-1]["file"]).stem  # the last shard of its split: the others still number from 00000
    assert cli.main(["snapshot", str(src), str(tmp_path / "fit"), "--leave-out", last]) == 0
    assert "`specroute prompts" in capsys.readouterr().out
    assert [s["file"] for s in read_manifest(tmp_path / "fit").shards] == [s["file"] for s in shards[:-1]]
    assert len(load_records(tmp_path / "fit")) == sum(s["rows"] for s in shards[:-1])
    recorded = {e["example_id"] for e in read_examples(tmp_path / "fit")}
    left = [r["example_id"] for r in unrecorded_prompts([str(tmp_path / "fit")])]
    held = json.loads((src / (shards[-1]["file"] + ".json")).read_text())["examples"]
    assert set(held) <= set(left) and not recorded & set(left)  # (tiny records 24 of the task: the rest too)
    split = next(x["split"] for x in shards if sum(y["split"] == x["split"] for y in shards) > 1)
    first = f"{split}-00000"  # a gap in a split would make an unreadable folder: refused
    for pattern, refusal in (("x-*", "names no finished shard"), (first, "leaves a gap")):
        assert cli.main(["snapshot", str(src), str(tmp_path / "f2"), "--leave-out", pattern]) == 2
        assert refusal in capsys.readouterr().err and not (tmp_path / "f2").exists()


def test_learning_curve_study_pairs_its_points_out_of_fold(consequence_records, tmp_path):
    """studies/learning_curve.py: one cross-fit per training share over the same folds, each scored out
    of fold, written as curve.json / curve.csv / curve.png with a projection."""
    from helpers import study_module

    config = tmp_path / "cf.yaml"
    config.write_text(
        f"records: [{consequence_records}]\nmode: consequence\nhead: cascade\ntarget: consequence\n"
        "max_epochs: 1\nbatch_size: 256\ncross_fit: 2\n"
    )
    out = tmp_path / "curve"
    study = study_module("learning_curve")
    assert study.main(["--config", str(config), "--shares", "0.5", "1.0", "--out", str(out)]) == 0
    curve = json.loads((out / "curve.json").read_text())
    assert [p["share"] for p in curve["points"]] == [0.5, 1.0]
    small, full = (p["train_examples"] for p in curve["points"])
    assert small < full
    assert read_plan(out / "share-0.5")["folds"] == read_plan(out / "share-1")["folds"]
    rows = (out / "curve.csv").read_text().splitlines()
    header = "share,train_examples,population,target,measure"
    # shares x populations (all / tested, each also matched) x targets x measures
    assert rows[0].startswith(header) and len(rows) == 1 + 2 * 4 * 3 * 2
    assert curve["projection"]["population"] == "tested-matched"
    assert (out / "curve.png").stat().st_size > 0
    assert curve["projection"]["measure"] == "important" and curve["projection"]["target"] == 0.5
    assert curve["projection_hindsight"]["population"] == "tested-matched"  # the same reading vs hindsight
    # trained on one labelling, scored on another of the same examples (folds over the training records)
    other = synthetic_token_records(tmp_path / "other", n_examples=60, seed=5, consequence=True)
    args = ["--config", str(config), "--shares", "1.0", "--eval-records", str(other), "--out", str(tmp_path / "c2")]
    assert study.main(args) == 0
    moved = json.loads((tmp_path / "c2" / "curve.json").read_text())
    assert moved["eval_records"] == [str(other)]
    scored = moved["points"][0]["summaries"]["all"]["targets"]["0.5"]["methods"]["best_rule"]["examples"]
    assert scored == 60 and moved["points"][0]["summaries"]["all"] != curve["points"][1]["summaries"]["all"]


@pytest.fixture(scope="module")
def horizon_only_records(tmp_path_factory):
    return synthetic_token_records(
        tmp_path_factory.mktemp("cfh") / "rec", n_examples=60, consequence=True, answer_labels="horizon"
    )


def test_short_horizon_labels_alone_are_scored_by_the_share_of_their_score_kept(horizon_only_records, tmp_path):
    """Records with short-horizon scores and no tested mismatch (a horizon-only recording) are scored, and
    their best rule chosen, by the share of the summed score a method keeps; no tested population."""
    from eval.crossfit import _example_sums, answer_measures, populations
    from router.offline.inputs import RecordView

    records = [str(horizon_only_records)]
    assert answer_measures(records, "consequence") == ("horizon",)
    view = RecordView(records, "all", "consequence")
    score = np.clip(np.nan_to_num(view.cols["horizon_score"].astype(np.float64)), 0, None)
    n = len(score)
    keep_all, defer_all = (_example_sums(view)(np.full(n, d)) for d in (False, True))
    assert keep_all["horizon_kept"].sum() == pytest.approx(score.sum()) and score.sum() > 0
    assert defer_all["horizon_kept"].sum() == 0 and keep_all["important"].sum() == keep_all["harmless"].sum() == 0
    folder = _hand_cross_fit(tmp_path / "opt-copy", horizon_only_records, mode="consequence")
    summaries = populations(folder, records, reps=100)
    assert set(summaries) == {"all", "all-matched"}
    for summary in summaries.values():
        assert summary["measures"] == ["horizon"]
        for block in summary["targets"].values():
            methods = block["methods"]
            assert methods["opt-copy"]["horizon"] == methods["opt"]["horizon"]  # the copy scores as its rule
            assert 0 <= methods["best_rule"]["horizon"] <= 1 and "important" not in methods["best_rule"]
    # a deferral ordered by the score itself keeps the least of it: far below random-like rules at 0.5
    half = summaries["all-matched"]["targets"]["0.5"]["methods"]
    assert half["best_rule"]["horizon"] < 0.9


def test_full_answer_and_short_horizon_labels_together_report_both(tmp_path):
    from eval.crossfit import answer_measures
    from eval.crossfit_summary import summarise

    both = synthetic_token_records(tmp_path / "both", n_examples=60, consequence=True, answer_labels="full+horizon")
    assert answer_measures([str(both)], "consequence") == ("important", "harmless", "signed", "horizon")
    folder = _hand_cross_fit(tmp_path / "opt-copy", both, mode="consequence")
    summary = summarise(out_of_fold(folder, [str(both)], tested_only=True), reps=50)
    row = summary["targets"]["0.5"]["methods"]["opt-copy"]
    assert {"important", "harmless", "horizon"} <= set(row) and summary["measures"][0] == "important"


def test_consequence_records_without_any_answer_level_label_are_refused(tmp_path):
    from eval.crossfit import answer_measures

    bare = synthetic_token_records(tmp_path / "bare", n_examples=60, consequence=True, answer_labels="untested")
    with pytest.raises(ValueError, match="no answer-level label"):
        answer_measures([str(bare)], "consequence")


def test_learning_curve_on_short_horizon_labels_projects_the_horizon_share(horizon_only_records, tmp_path):
    """A cascade head trained on short-horizon scores, its curve read on the share of the score kept."""
    from helpers import study_module

    config = tmp_path / "cf.yaml"
    config.write_text(
        f"records: [{horizon_only_records}]\nmode: consequence\nhead: cascade\ntarget: horizon_score\n"
        "loss: mse\nmax_epochs: 1\nbatch_size: 256\ncross_fit: 2\n"
    )
    out = tmp_path / "curve"
    assert (
        study_module("learning_curve").main(["--config", str(config), "--shares", "0.5", "1.0", "--out", str(out)]) == 0
    )
    curve = json.loads((out / "curve.json").read_text())
    assert curve["projection"]["measure"] == "horizon" and curve["projection"]["population"] == "all-matched"
    rows = (out / "curve.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 3  # shares x populations (all, all-matched) x targets, one measure


def test_the_best_rule_in_hindsight_is_the_one_rule_best_on_the_scored_examples(consequence_records, tmp_path):
    """Beside the per-fold best rule (chosen on validation), every method is also paired with the one
    fixed rule that is best over all scored examples: a comparison a weak per-fold choice cannot win."""
    folder = _hand_cross_fit(tmp_path / "opt-copy", consequence_records, mode="consequence")
    summary = summarise(out_of_fold(folder, [str(consequence_records)], tested_only=True, matched=True), reps=200)
    for block in summary["targets"].values():
        methods, hindsight = block["methods"], block["hindsight_rule"]
        rules = {m: r for m, r in methods.items() if m not in ("opt-copy", "best_rule", "oracle_signed")}
        assert hindsight in rules and methods[hindsight]["important"] == min(r["important"] for r in rules.values())
        assert methods[hindsight]["important_vs_hindsight_rule"] == {"diff": 0.0, "low": 0.0, "high": 0.0}
        d = methods["opt-copy"]["important_vs_hindsight_rule"]
        assert d["diff"] == pytest.approx(methods["opt"]["important"] - methods[hindsight]["important"])
        assert d["low"] <= d["diff"] <= d["high"]
        # no rule does better in hindsight than the per-fold choice's rules: the chosen rule is never ahead of it
        assert methods["best_rule"]["important_vs_hindsight_rule"]["diff"] >= 0


def test_learning_curve_projection_against_either_best_rule_by_hand():
    """The projection's arithmetic on two hand-made curve points: against the best rule in hindsight the
    router gains 0.04 per fourfold increase in training examples, from +0.02 behind to 0.02 ahead, with a
    half-width of 0.05 at 100 scored examples; solving 0.02 + (0.04 / ln 4) ln(n / 100) = 0.05 sqrt(100 / n)
    by hand puts n between 180 and 185. Against the per-fold rule the router stays 0.01 ahead."""
    from helpers import study_module

    study = study_module("learning_curve")

    def row(train, diff_hindsight):
        return {
            "target": 0.5,
            "measure": "important",
            "population": "tested-matched",
            "train_examples": train,
            "scored_examples": 100,
            "diff": -0.01,
            "low": -0.06,
            "high": 0.04,
            "diff_hindsight": diff_hindsight,
            "low_hindsight": diff_hindsight - 0.05,
            "high_hindsight": diff_hindsight + 0.05,
        }

    rows = [row(100.0, 0.02), row(400.0, -0.02)]
    hindsight = study.projection(rows, 0.5, "important", "tested-matched", against="_hindsight")
    assert hindsight["slope_per_log_example"] == pytest.approx(0.04 / np.log(4))
    assert 180 <= hindsight["examples_needed"] <= 186 and hindsight["half_width_now"] == pytest.approx(0.05)
    per_fold = study.projection(rows, 0.5, "important", "tested-matched")
    # a flat 0.01 ahead: only the narrowing interval helps, 0.01 = 0.05 sqrt(100 / n) at n = 2,500
    assert per_fold["slope_per_log_example"] == pytest.approx(0.0, abs=1e-12)
    assert 2500 <= per_fold["examples_needed"] <= 2550
    missing = [dict(r, diff_hindsight=float("nan")) for r in rows]
    assert (
        "no diff_hindsight"
        in study.projection(missing, 0.5, "important", "tested-matched", against="_hindsight")["note"]
    )


def test_online_vs_first_order_pairs_an_online_run_with_the_labels_prediction(consequence_records, tmp_path, capsys):
    """studies/online_vs_first_order.py: per problem, a rule point's predicted first-order change (from the
    records' labels at the point's alpha) against its online verdict minus the verifier's."""
    from helpers import study_module
    from router.offline.inputs import RecordView
    from router.offline.views import greedy_rule_scores

    study, check = study_module("online_vs_first_order"), study_module("first_order_check")
    view = RecordView([str(consequence_records)], "all", mode="consequence")
    ids, score = check._ids(view), np.asarray(greedy_rule_scores(view)["kl_gate"])
    alpha = float(np.median(score))
    problems = sorted(set(ids.tolist()))[:20]
    predicted = check.predicted_changes(view, ids, score, alpha, problems)
    run = tmp_path / "ev"
    run.mkdir()
    (run / "eval_config.json").write_text(json.dumps({"routers": []}))
    lines = ["point,example_id,quality"]
    for p in problems:  # online: the verifier as recorded, kl_gate moved exactly as predicted, but one problem
        right = predicted[p]["answer_correct"]
        as_predicted = right + predicted[p]["predicted"]
        moved = 1 - as_predicted if p == problems[0] else as_predicted
        lines += [f"verifier@0,{p},{right}", f"kl_gate@{alpha},{p},{moved}", f"lossless@0,{p},{right}"]
    (run / "online_per_prompt.csv").write_text("\n".join(lines) + "\n")
    result = study.main(
        [str(run), "--records", str(consequence_records), "--out", str(tmp_path / "out"), "--reps", "50"]
    )
    assert set(result) == {f"kl_gate@{alpha}"}  # lossless has no score: skipped
    r = result[f"kl_gate@{alpha}"]
    assert r["problems"] == 20 and r["verifier_online_matches_recorded_verdict"] == 1.0
    assert r["predicted_change"] == pytest.approx(np.mean([predicted[p]["predicted"] for p in problems]))
    assert r["same_per_problem"] == pytest.approx(19 / 20)  # the one problem moved against the prediction
    assert (tmp_path / "out" / "online_vs_first_order.csv").read_text().count("\n") == 21
    assert "measured - predicted" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="does not exist"):
        study.main([str(tmp_path), "--records", str(consequence_records), "--out", str(tmp_path / "o2")])
