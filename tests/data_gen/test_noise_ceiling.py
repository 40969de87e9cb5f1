"""The labels' noise ceiling: re-drawn labels (data_gen/noise.py) and the figures made of them
(eval/noise_ceiling.py), by hand, by simulation, and end to end on a tiny consequence recording."""

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from data_gen.noise import (
    Mismatch,
    Redrawn,
    problem_stratum,
    read_redrawn,
    sample_problems,
    labelled_mismatches,
    write_redrawn,
)
from eval import noise_ceiling as nc
from router.labels import HARM, NEUTRAL, RESCUE
from router.records import RecordsError


def test_flip_probability_and_accuracy_change_by_hand():
    d = np.array([[1, 1, 0, 0], [0, 0, 0, 0]])
    v = np.array([[1, 1, 1, 1], [1, 0, 0, 0]])
    f, delta = nc.flip_and_delta(d, v)
    # row 0: a_d 0.5, a_v 1 -> f = 0.5 * 0 + 1 * 0.5; row 1: a_d 0, a_v 0.25 -> f = 0.25
    assert np.allclose(f, [0.5, 0.25]) and np.allclose(delta, [-0.5, -0.25])
    assert np.allclose(nc.sampling_noise(d, v), [0.25 / 3, 0.1875 / 3])


def test_sampling_noise_is_unbiased_for_the_estimates_variance():
    rng = np.random.default_rng(0)
    a_d, a_v, k = 0.3, 0.8, 4
    d = rng.random((20000, k)) < a_d
    v = rng.random((20000, k)) < a_v
    _, delta = nc.flip_and_delta(d, v)
    assert nc.sampling_noise(d, v).mean() == pytest.approx(np.var(delta), rel=0.05)
    f, _ = nc.flip_and_delta(d, v)
    assert f.mean() == pytest.approx(a_d * (1 - a_v) + a_v * (1 - a_d), abs=0.01)  # unbiased flip probability


def test_redraw_agreement_per_greedy_class():
    # a harm re-drawn as harm twice and as neutral twice; a neutral one re-drawn neutral always
    d = np.array([[0, 0, 1, 1], [1, 1, 0, 0]])
    v = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    out = nc.redraw_agreement(d, v, np.array([HARM, NEUTRAL]), np.array([1.0, 3.0]))
    assert out["harm"]["redrawn_important"] == 0.5 and out["harm"]["redrawn_same_sign"] == 0.5
    assert out["neutral"]["redrawn_important"] == 0.0 and out["neutral"]["redrawn_same_sign"] == 1.0
    assert out["agreement"] == pytest.approx((1 * 0.5 + 3 * 1.0) / 4)
    assert out["rescue"]["mismatches"] == 0


def test_weighted_auc_matches_sklearn_and_the_expected_auc_its_limits():
    rng = np.random.default_rng(1)
    score, label, w = rng.random(50), rng.random(50) < 0.4, rng.random(50) + 0.5
    assert nc.weighted_auc(score, label, w) == pytest.approx(roc_auc_score(label, score, sample_weight=w))
    assert nc.expected_auc(np.array([1.0, 1.0, 0.0, 0.0]), np.ones(4)) == 1.0  # labels known: perfect
    assert nc.expected_auc(np.full(6, 0.3), np.ones(6)) == 0.5  # one probability for all: chance
    # labels drawn from f: ranking by f reaches the expected AUC on average
    f = rng.random(400)
    draws = [roc_auc_score(rng.random(400) < f, f) for _ in range(200)]
    assert np.mean(draws) == pytest.approx(nc.expected_auc(f, np.ones(400)), abs=0.01)


def _simulated(between: float, within: float, problems: int = 400, per: int = 5, k: int = 8, seed: int = 0):
    """Per mismatch a_d, a_v around a problem effect on the accuracy change, and K verdicts a side."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, np.sqrt(between), problems)
    problem = np.repeat(np.arange(problems), per)
    delta = np.clip(effect[problem] + rng.normal(0, np.sqrt(within), len(problem)), -0.45, 0.45)
    a_v = np.full(len(problem), 0.5)
    a_d = a_v + delta
    d = rng.random((len(problem), k)) < a_d[:, None]
    v = rng.random((len(problem), k)) < a_v[:, None]
    return d, v, problem, delta


def test_the_problem_share_recovers_a_known_random_effect_after_the_sampling_noise():
    d, v, problem, true_delta = _simulated(between=0.02, within=0.01)
    _, delta = nc.flip_and_delta(d, v)
    got = nc.problem_share(delta, nc.sampling_noise(d, v), problem)
    assert got["share"] == pytest.approx(2 / 3, abs=0.1)
    assert got["between"] == pytest.approx(0.02, rel=0.25) and got["within"] == pytest.approx(0.01, rel=0.4)
    none = nc.problem_share(
        *_none_between(),
    )
    assert none["share"] < 0.15  # no problem effect: (near) zero share


def _none_between():
    d, v, problem, _ = _simulated(between=0.0, within=0.02, seed=3)
    _, delta = nc.flip_and_delta(d, v)
    return delta, nc.sampling_noise(d, v), problem


def test_out_of_fold_r2_finds_a_token_signal_and_not_noise():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(600, 3))
    problem = np.repeat(np.arange(120), 5)
    signal = x[:, 0] + 0.1 * rng.normal(size=600)
    assert nc.out_of_fold_r2(x, signal, problem) > 0.9
    assert nc.out_of_fold_r2(x, rng.normal(size=600), problem) < 0.05
    loo, has = nc.leave_one_out_mean(np.array([1.0, 3.0, 5.0, 7.0]), np.array(["a", "a", "a", "b"]))
    assert np.allclose(loo, [4.0, 3.0, 2.0, 0.0]) and has.tolist() == [True, True, True, False]


def _mismatch(ex, pos, sign, correct):
    return Mismatch(ex, pos, pos, 5, 6, sign, correct)


def test_problems_are_sampled_per_stratum_with_all_their_mismatches_and_grow():
    found = [
        *(_mismatch(f"h{i}", p, HARM if p == 0 else NEUTRAL, 1) for i in range(6) for p in range(3)),
        *(_mismatch(f"r{i}", p, RESCUE if p == 1 else NEUTRAL, 0) for i in range(4) for p in range(2)),
        *(_mismatch(f"n{i}", 0, NEUTRAL, 1) for i in range(5)),
    ]
    small, sizes = sample_problems(found, 2, seed=1)
    assert sizes == {
        "right_harmed": {"problems": 6, "sampled": 2},
        "right_unharmed": {"problems": 5, "sampled": 2},
        "wrong_rescued": {"problems": 4, "sampled": 2},
        "wrong_unrescued": {"problems": 0, "sampled": 0},
    }
    assert len(small) == 2 * 3 + 2 * 1 + 2 * 2  # every mismatch of a sampled problem
    big, _ = sample_problems(found, 3, seed=1)
    assert {m.key for m in small} <= {m.key for m in big}
    assert (
        problem_stratum([NEUTRAL, RESCUE], 0) == "wrong_rescued" and problem_stratum([NEUTRAL], 0) == "wrong_unrescued"
    )


def test_redrawn_files_resume_and_refuse_other_settings(tmp_path):
    path, settings = tmp_path / "redrawn.jsonl", {"k": 4, "temperature": 0.7}
    assert read_redrawn(path, settings) == {}
    done = {"a@1": Redrawn("a@1", HARM, [0, 1, 0, 0], [1, 1, 1, 0])}
    write_redrawn(path, settings, done)
    assert read_redrawn(path, settings) == done
    with pytest.raises(RecordsError, match="same settings to resume"):
        read_redrawn(path, {"k": 8, "temperature": 0.7})


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A tiny consequence recording (tests/data_gen/test_consequence.py's), its pair and config."""
    from helpers import length_metric, consequence_recording
    from router.pair import tiny_pair
    from router.tasks import metrics

    pair = tiny_pair(seed=2, noise=0.05)
    cfg = consequence_recording(tmp_path, pair, 10, modes=["consequence"])
    monkeypatch.setitem(metrics.METRICS, "length3", length_metric)  # the tests judge answers with it too
    return cfg, pair


def test_a_redraw_at_a_vanishing_temperature_gives_back_the_greedy_labels(recorded):
    """Sampling at temperature 1e-6 is greedy decoding: every continuation after d must reach the recorded
    branch's verdict and every one after v the answer's, so each mismatch's re-drawn sign is its greedy one."""
    from data_gen.noise import LabelRedraw
    from data_gen.plan import load_examples
    from data_gen.recorder import Recorder
    from router.offline.inputs import RecordView

    cfg, pair = recorded
    view = RecordView([cfg.output], "all", mode="consequence")
    found, answers = labelled_mismatches(view.ds)
    assert found and {m.sign for m in found} <= {HARM, NEUTRAL, RESCUE}
    recorder = Recorder(cfg, *pair)
    examples = load_examples(cfg)
    recorder.share_prefix(examples)
    prompts = {ex.example_id: recorder.prompt_ids(ex) for ex in examples}
    metas = {ex.example_id: ex.meta for ex in examples}
    redrawn = LabelRedraw(recorder.search, k=2, temperature=1e-6).redraw(found, prompts, answers, metas)
    branch = np.asarray(view.ds["branch_correct"])
    for m, r in zip(found, redrawn):
        assert r.verifier_correct == [m.answer_correct] * 2, m.key
        assert r.draft_correct == [int(branch[m.row])] * 2, m.key
    with pytest.raises(ValueError, match="temperature > 0"):
        LabelRedraw(recorder.search, k=2, temperature=0.0)


def test_the_study_samples_resumes_and_reports(recorded, tmp_path, capsys):
    from helpers import study_module

    from data_gen.recorder import Recorder

    cfg, pair = recorded
    study = study_module("noise_ceiling")
    args = ["--records", cfg.output, "--per-stratum", "3", "--k", "2", "--reps", "20", "--out", str(tmp_path / "nz")]
    study.main(args, recorder=Recorder(cfg, *pair))
    result = json.loads((tmp_path / "nz" / "noise.json").read_text())
    lines = (tmp_path / "nz" / "redrawn.jsonl").read_text().splitlines()
    assert result["mismatches"] == len(lines) - 1 > 0
    assert 0 <= result["agreement"] <= 1 and set(result["intervals"]) >= {"agreement", "ceiling_auc"}
    rows = (tmp_path / "nz" / "noise.csv").read_text().splitlines()
    assert len(rows) == result["mismatches"] + 1 and (tmp_path / "nz" / "noise.png").exists()
    capsys.readouterr()
    study.main(args, recorder=None)  # everything is re-drawn already: no model is loaded, nothing sampled
    assert "re-drawing" not in capsys.readouterr().out


def test_first_order_check_decodes_and_compares_per_problem(recorded, tmp_path):
    """studies/first_order_check.py: the lossless decode gives back the recorded verdicts (the same prompts, stop
    strings and metric as the labels), and kl_gate at half the verifier's rejection rate is compared per problem
    with its first-order prediction."""
    from helpers import study_module

    from data_gen.recorder import Recorder

    cfg, pair = recorded
    study = study_module("first_order_check")
    out = tmp_path / "fo"
    args = [
        "--records",
        cfg.output,
        "--problems",
        "6",
        "--reps",
        "50",
        "--batch",
        "4",
        "--gamma",
        "3",
        "--out",
        str(out),
    ]
    result = study.main(args, recorder=Recorder(cfg, *pair))
    assert result["lossless_matches_recorded_verdict"] == 1.0 and result["problems"] == 6
    saved = json.loads((out / "first_order.json").read_text())
    assert len(saved["rows"]) == 6 and all(
        r["measured"] == r["rule_correct"] - r["lossless_correct"] for r in saved["rows"]
    )
    assert result["interval"][0] <= result["measured_minus_predicted"] <= result["interval"][1]
    lines = (out / "first_order.csv").read_text().splitlines()
    assert len(lines) == 7
    assert study.rule_alpha(np.array([0.0, 1.0, 2.0, 3.0]), np.array([1, 1, 1, 1]), 0.5) == 1.5


def test_first_order_prediction_counts_kept_harms_and_rescues():
    from helpers import study_module

    study = study_module("first_order_check")

    class View:
        cols = {
            "consequence": np.array([1, 0, -2, 1, 0], np.int8),
            "answer_correct": np.array([1, 1, 1, 0, 0], np.int8),
            "q_argmax": np.array([5, 5, 5, 5, 5]),
            "token": np.array([6, 6, 6, 6, 5]),
        }

    ids = np.array(["a", "a", "a", "b", "b"])
    keep_all = study.predicted_changes(View, ids, np.zeros(5), 1.0, ["a", "b"])
    assert keep_all["a"] == {"predicted": -1, "kept_untested": 1, "answer_correct": 1}
    assert keep_all["b"]["predicted"] == 1
    defer_flips = study.predicted_changes(View, ids, np.array([2.0, 0, 0, 2.0, 0]), 1.0, ["a", "b"])
    assert defer_flips["a"]["predicted"] == 0 and defer_flips["b"]["predicted"] == 0
