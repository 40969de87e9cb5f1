"""The lag judge (router/window/lag.py): the features of the positions before each draft, read offline
from a record's previous rows and carried across blocks by the decoding loop, the same numbers in both."""

import json

import numpy as np
import pytest
import torch

from data_gen.recorder import Recorder
from data_gen.run import run_gen
from helpers import (
    LagProbe,
    ViewStats,
    count_block_feature_passes,
    custom_gen_config,
    teacher_forced_features,
    verifier_qa,
)
from router.decoding import generate
from router.export.golden import reproduce, torch_runner
from router.features import FEATURE_NAMES, position_stats
from router.hf import cascade_generate
from router.model import RouterError, load_router
from router.offline.inputs import RecordView
from router.view import BlockView
from router.window.lag import LAG_FEATURE_NAMES, LagBefore, LagCarry, block_lags, lag_features, lag_history
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train

LAG = 2  # as helpers.PROBE_LAG, the positions LagProbe reads
F = len(FEATURE_NAMES)


def test_lag_history_reads_the_previous_rows_of_the_same_trajectory():
    features = np.arange(6 * F, dtype=np.float32).reshape(6, F)
    traj = np.array(["a", "a", "a", "b", "b", "b"])
    history, valid = lag_history(features, traj, np.array([0, 2, 3, 5]), LAG)
    assert valid.tolist() == [[False, False], [True, True], [False, False], [True, True]]
    assert np.array_equal(history[1], features[[1, 0]]) and np.array_equal(history[3], features[[4, 3]])
    assert not history[0].any() and not history[2].any()
    x = lag_features(torch.from_numpy(history), torch.from_numpy(valid))
    assert x.shape == (4, LAG * len(LAG_FEATURE_NAMES))
    assert x[1, F].item() == 1.0 and x[0, F].item() == 0.0  # the valid flag after each lag's features


def test_block_lags_take_the_carry_first_then_the_block():
    before = torch.arange(2 * LAG * F, dtype=torch.float32).reshape(2, LAG, F)  # most recent first
    valid = torch.tensor([[True, False], [True, True]])
    block = 100 + torch.arange(2 * 3 * F, dtype=torch.float32).reshape(2, 3, F)
    history, ok = block_lags(before, valid, block)
    assert history.shape == (2, 3, LAG, F)
    assert torch.equal(history[:, 0, 0], before[:, 0]) and torch.equal(history[:, 0, 1], before[:, 1])
    assert torch.equal(history[:, 1, 0], block[:, 0]) and torch.equal(history[:, 1, 1], before[:, 0])
    assert torch.equal(history[:, 2], block[:, [1, 0]])
    assert ok[0].tolist() == [[True, False], [True, True], [True, True]]


def test_carry_moves_on_by_the_emitted_positions_and_waits_for_the_bonus_q():
    g, v = 3, 7
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, g, v, generator=gen).softmax(-1)
    p = torch.randn(2, g + 1, v, generator=gen).softmax(-1)
    feats = position_stats(q, p[:, :g])[0]  # (2, g, F)
    carry = LagCarry(2, LAG)
    carry.advance(q, p, torch.tensor([0, 1]))  # row 0 rejected its first draft, row 1 its second
    got = carry.snapshot()
    torch.testing.assert_close(got.feats[0, 0], feats[0, 0])
    assert got.valid[0].tolist() == [True, False]  # before the block: nothing (the answer's start)
    torch.testing.assert_close(got.feats[1], feats[1, [1, 0]])
    carry.advance(q, p, torch.tensor([g, 0]))  # row 0 kept every draft: its last position is the bonus one
    assert carry.needs_drafter_logits
    with pytest.raises(RuntimeError, match="resolve"):
        carry.snapshot()
    q_logits = torch.randn(2, v, generator=gen)
    carry.resolve(q_logits)
    got = carry.snapshot()
    torch.testing.assert_close(got.feats[0, 0], position_stats(q_logits.softmax(-1), p[:, g])[0][0])
    torch.testing.assert_close(got.feats[0, 1], feats[0, g - 1])
    torch.testing.assert_close(got.feats[1], torch.stack([feats[1, 0], feats[1, 1]]))  # then the older carry
    carry.keep_rows(torch.tensor([1]))
    assert carry.snapshot().feats.shape == (1, LAG, F)


@pytest.mark.parametrize("via_view", [False, True], ids=["carry-computes", "from-the-view"])
def test_the_loops_carried_lags_are_the_trajectorys_features(tiny, monkeypatch, via_view):
    """Decoding losslessly, each draft on the emitted trajectory reads the features the trajectory's previous
    positions have when teacher-forced (what a record holds), across blocks and bonus positions; the same where
    the policy computed the block's features already and the carry reuses them (no pass of its own)."""
    drafter, verifier, tok = tiny
    prompt = tok.encode("Add 3 and 6.\nA:")
    probe = type("Probe", (ViewStats, LagProbe), {})() if via_view else LagProbe()
    passes = count_block_feature_passes(monkeypatch)
    out = generate(drafter, verifier, torch.tensor([prompt]), rule=probe, gamma=3, max_new_tokens=24)
    emitted = out.sequences[0, len(prompt) :].tolist()
    offline = teacher_forced_features(drafter, verifier, prompt + emitted, len(prompt)).numpy()
    history, valid = lag_history(offline, np.zeros(len(offline)), np.arange(len(offline)), LAG)
    start, checked, bonus_lags = 0, 0, 0
    for drafts, before, position in probe.seen:
        online, ok = block_lags(before.feats, before.valid, position)
        g = drafts.shape[1]
        n = next((j for j in range(g) if start + j >= len(emitted) or drafts[0, j] != emitted[start + j]), g)
        for j in range(min(n + 1, g, len(emitted) - start)):  # drafts whose prefix is the emitted trajectory
            t = start + j
            assert ok[0, j].tolist() == valid[t].tolist()
            torch.testing.assert_close(online[0, j], torch.from_numpy(history[t]), atol=1e-4, rtol=1e-4)
            checked += 1
        bonus_lags += int(n == g and start + g < len(emitted))
        start += n + 1
    assert checked >= 12 and bonus_lags >= 1  # some block started after a bonus position
    assert (len(passes) == 0) == via_view and (via_view or len(passes) >= len(probe.seen) - 1)


@pytest.fixture(scope="module")
def lag_judge(tmp_path_factory, tiny):
    tmp = tmp_path_factory.mktemp("lag-judge")
    cfg = custom_gen_config(
        verifier_qa(tiny, tmp / "qa.jsonl", n=24), tmp / "rec", batch_size=8, examples_per_shard=12, judge=True,
        split_fractions=[0.5, 0.25, 0.25],
    )  # fmt: skip
    run_gen(cfg, Recorder(cfg, *tiny))
    train = TrainConfig(records=[str(tmp / "rec")], target="greedy_01_gap", loss="cost_sensitive", max_epochs=2, batch_size=128, output=str(tmp / "judge"), baselines=False, router=RouterArch(head="judge", lag=LAG))  # fmt: skip
    metrics = run_train(train)
    return load_router(tmp / "judge"), tmp, metrics


def test_offline_lag_inputs_are_the_records_previous_rows(lag_judge):
    router, tmp, _ = lag_judge
    view = RecordView([str(tmp / "rec")], "train")
    idx = np.arange(len(view))
    x = view.judge_inputs(idx, lag=LAG)
    plain = view.judge_inputs(idx)
    assert x.shape[1] == plain.shape[1] + LAG * len(LAG_FEATURE_NAMES) == router.cfg.position_dim
    tail = x[:, plain.shape[1] :].reshape(len(idx), LAG, -1)
    assert np.array_equal(tail[1:, 0, :F], np.where(tail[1:, 0, F:] > 0, view.features[:-1], 0))
    first = np.r_[True, view.traj[1:] != view.traj[:-1]]  # every trajectory's first row has no predecessor
    assert not tail[first, 0, F].any() and tail[~first, 0, F].all()


def test_lag_judge_trains_exports_and_decodes_everywhere(lag_judge, tiny):
    router, tmp, metrics = lag_judge
    drafter, verifier, tok = tiny
    assert router.needs.lag == LAG and np.isfinite(metrics["router"]["area"])
    assert reproduce(tmp / "judge", router.cfg, torch_runner(router))["ok"]  # golden vectors hold the lags
    ids = torch.tensor([tok.encode("Add 3 and 6.\nA:"), tok.encode("Add 4 and 1.\nA:")])
    mask = torch.ones_like(ids)
    for gamma in (1, 3):
        out = generate(drafter, verifier, ids, rule=router, alpha=0.0, gamma=gamma, max_new_tokens=10)
        hf = verifier.generate(
            ids, attention_mask=mask, custom_generate=cascade_generate, assistant_model=drafter, rule=str(tmp / "judge"),
            alpha=0.0, gamma=gamma, max_new_tokens=10, do_sample=False,
        )  # fmt: skip
        assert torch.equal(hf, out.sequences)
    generate(drafter, verifier, ids, rule=router, alpha=0.0, gamma=3, max_new_tokens=6, temperature=1.0)
    with pytest.raises(ValueError, match="gamma auto's verifier-only steps"):
        generate(drafter, verifier, ids, rule=router, gamma="auto", max_new_tokens=4)
    with pytest.raises(RouterError, match="is a lag judge"):
        q = torch.full((1, 2, 259), 1 / 259)
        router.decide(BlockView(q, q, drafts=torch.zeros(1, 2, dtype=torch.long), next_p_raw=q), 0.0)
    with pytest.raises(RouterError, match="is a lag judge"):
        bad = LagBefore(torch.zeros(1, LAG + 1, F), torch.zeros(1, LAG + 1, dtype=torch.bool))
        router.decide(BlockView(q, q, drafts=torch.zeros(1, 2, dtype=torch.long), next_p_raw=q, lag=bad), 0.0)


def test_lag_needs_the_judge_head(lag_judge):
    _, tmp, _ = lag_judge
    with pytest.raises(Exception, match="lag .* needs head: judge"):
        TrainConfig(records=[str(tmp / "rec")], router=RouterArch(head="cascade", lag=2))
    assert json.loads((tmp / "judge" / "config.json").read_text())["lag"] == LAG  # the export says what it reads


def test_eval_scores_a_lag_judge_in_both_views_and_decodes_it_at_evals_gamma_auto(lag_judge):
    from specroute import cli

    _, tmp, _ = lag_judge
    out = tmp / "eval"
    args = [
        "eval", "--config", "configs/eval/tiny.yaml", f"records=[{tmp / 'rec'}]", f"routers=[{tmp / 'judge'}]",
        f"output={out}", "max_prompts=2", "max_new_tokens=6", "online_methods=[judge,token_v2]",
        "alphas={judge: [0.0]}", "metric=exact_match",
    ]  # fmt: skip
    assert cli.main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    views = metrics["offline"]["views"]
    assert "judge" in views["greedy"]["methods"] and "judge" in views["t1"]["methods"]  # lags exist in both views
    assert {p["method"] for p in metrics["online"]["points"]} >= {"judge", "token_v2"}
    # eval's gamma auto is chosen once per run (a number), unlike generate's per-block choice, which a lag judge refuses
    assert cli.main([*args, "gamma=auto", f"output={tmp / 'eval-auto'}"]) == 0
