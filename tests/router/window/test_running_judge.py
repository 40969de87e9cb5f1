"""The running judge (router/window/running.py) and the signed target (train/labels.py): sums over the answer so
far read offline from a record's previous rows and carried across blocks by the decoding loop, the same numbers
in both; a judge trained on signed labels with them, exported and decoded."""

import numpy as np
import pytest
import torch

from router.decoding import generate
from router.features import FEATURE_NAMES, position_stats
from router.window.lag import LagCarry
from router.window.running import RUNNING_COLUMNS, RUNNING_NAMES, block_running, running_features, running_history
from helpers import RunningProbe, ViewStats, count_block_feature_passes, teacher_forced_features
from train.labels import SIGNED_TARGET, labels, weights

F = len(FEATURE_NAMES)
R = len(RUNNING_COLUMNS)


def test_running_history_sums_the_previous_rows_of_the_same_trajectory():
    features = np.arange(6 * F, dtype=np.float32).reshape(6, F)
    traj = np.array(["a", "a", "a", "b", "b", "b"])
    sums, count = running_history(features, traj, np.array([0, 2, 3, 5]))
    assert count.tolist() == [0, 2, 0, 2]
    cols = features[:, RUNNING_COLUMNS]
    assert np.allclose(sums, [np.zeros(R), cols[0] + cols[1], np.zeros(R), cols[3] + cols[4]])
    x = running_features(torch.from_numpy(sums), torch.from_numpy(count))
    assert x.shape == (4, len(RUNNING_NAMES))
    torch.testing.assert_close(x[1, :R], torch.from_numpy((cols[0] + cols[1]) / 2))
    assert x[0].abs().sum() == 0 and x[1, R].item() == pytest.approx(np.log(3))


def test_block_running_adds_the_blocks_earlier_drafts_to_the_carry():
    sums = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    block = torch.arange(3 * F, dtype=torch.float32).reshape(1, 3, F)
    got, count = block_running(sums, torch.tensor([5]), block)
    x = block[0][:, RUNNING_COLUMNS].double()
    torch.testing.assert_close(got[0], torch.stack([sums[0], sums[0] + x[0], sums[0] + x[0] + x[1]]))
    assert count.tolist() == [[5, 6, 7]]


def test_the_carry_sums_every_emitted_position_and_the_bonus_once_resolved():
    g, v = 3, 7
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, g, v, generator=gen).softmax(-1)
    p = torch.randn(2, g + 1, v, generator=gen).softmax(-1)
    x = position_stats(q, p[:, :g])[0][..., RUNNING_COLUMNS].double()  # (2, g, R)
    carry = LagCarry(2, 0, running=True)
    carry.advance(q, p, torch.tensor([0, g]))  # row 0: the correction at 0; row 1: every draft, then the bonus
    assert carry.needs_drafter_logits
    q_logits = torch.randn(2, v, generator=gen)
    carry.resolve(q_logits)
    got = carry.snapshot()
    bonus = position_stats(q_logits.softmax(-1), p[:, g])[0][1, RUNNING_COLUMNS].double()
    torch.testing.assert_close(got.sums[0], x[0, 0])
    torch.testing.assert_close(got.sums[1], x[1].sum(0) + bonus)
    assert got.count.tolist() == [1, g + 1] and got.feats.shape == (2, 0, F)
    carry.keep_rows(torch.tensor([1]))
    assert carry.snapshot().sums.shape == (1, R)


@pytest.mark.parametrize("via_view", [False, True], ids=["carry-computes", "from-the-view"])
def test_the_loops_running_sums_are_the_trajectorys(tiny, monkeypatch, via_view):
    """Decoding losslessly, each draft on the emitted trajectory reads the sums its previous positions have
    when teacher-forced (what a record holds), across blocks and bonus positions; the same where the policy
    computed the block's features already and the carry sums those (no pass of its own)."""
    drafter, verifier, tok = tiny
    prompt = tok.encode("Add 3 and 6.\nA:")
    probe = type("Probe", (ViewStats, RunningProbe), {})() if via_view else RunningProbe()
    passes = count_block_feature_passes(monkeypatch)
    out = generate(drafter, verifier, torch.tensor([prompt]), rule=probe, gamma=3, max_new_tokens=24)
    emitted = out.sequences[0, len(prompt) :].tolist()
    offline = teacher_forced_features(drafter, verifier, prompt + emitted, len(prompt)).numpy()
    sums, count = running_history(offline, np.zeros(len(offline)), np.arange(len(offline)))
    start, checked = 0, 0
    for drafts, before, position in probe.seen:
        online, n_before = block_running(before.sums, before.count, position)
        g = drafts.shape[1]
        n = next((j for j in range(g) if start + j >= len(emitted) or drafts[0, j] != emitted[start + j]), g)
        for j in range(min(n + 1, g, len(emitted) - start)):
            t = start + j
            assert int(n_before[0, j]) == count[t]
            torch.testing.assert_close(online[0, j], torch.from_numpy(sums[t]), atol=1e-4, rtol=1e-4)
            checked += 1
        start += n + 1
    assert checked >= 12
    assert (len(passes) == 0) == via_view and (via_view or len(passes) >= len(probe.seen) - 1)


def test_the_signed_target_is_the_accuracy_lost_by_keeping_the_draft():
    cols = {
        "consequence": np.array([-1, 1, 0, 1, -2, 0], np.int8),  # agree, important, harmless, important, untested
        "answer_correct": np.array([1, 1, 1, 0, 0, 0], np.int8),
        "token": np.zeros(6),
    }
    assert labels(cols, SIGNED_TARGET).tolist() == [0, 1, 0, -1, 0, 0]  # a harm loses 1, a rescue gains 1
    assert weights(cols, SIGNED_TARGET).tolist() == [1, 1, 1, 1, 0, 1]
    with pytest.raises(ValueError, match="answer verdicts"):
        labels({"consequence": cols["consequence"], "token": cols["token"]}, SIGNED_TARGET)


@pytest.fixture(scope="module")
def signed_judge(tmp_path_factory):
    """A running judge trained on the signed labels of a tiny consequence recording."""
    from helpers import consequence_recording
    from router.model import RouterArch, load_router
    from router.pair import tiny_pair
    from train.config import TrainConfig
    from train.run import run_train

    tmp = tmp_path_factory.mktemp("signed-judge")
    pair = tiny_pair(seed=2, noise=0.05)
    cfg = consequence_recording(tmp, pair, 12, modes=["consequence"])
    train = TrainConfig(
        records=[cfg.output], mode="consequence", target=SIGNED_TARGET, max_epochs=2, batch_size=64,
        output=str(tmp / "judge"), baselines=False, router=RouterArch(head="judge", running=True),
    )  # fmt: skip
    metrics_out = run_train(train)
    return load_router(tmp / "judge"), tmp, cfg, pair, metrics_out


def test_offline_running_inputs_are_the_records_answer_so_far(signed_judge):
    from router.offline.inputs import RecordView

    router, _, cfg, _, metrics_out = signed_judge
    assert router.cfg.running and router.needs.running and "lag" in router.needs
    assert np.isfinite(metrics_out["router"]["area"])
    view = RecordView([cfg.output], "train", mode="consequence")
    idx = np.arange(len(view))
    x, plain = view.judge_inputs(idx, running=True), view.judge_inputs(idx)
    assert x.shape[1] == plain.shape[1] + len(RUNNING_NAMES) == router.cfg.position_dim
    sums, count = running_history(view.features, view.traj, idx)
    assert np.allclose(
        x[:, plain.shape[1] :], running_features(torch.from_numpy(sums), torch.from_numpy(count)).numpy()
    )
    first = np.r_[True, view.traj[1:] != view.traj[:-1]]
    assert (count[first] == 0).all() and (count[~first] > 0).all()


def test_the_signed_running_judge_exports_and_decodes_everywhere(signed_judge):
    from router.export.golden import reproduce, torch_runner
    from helpers import assert_generate_routes_agree
    from router.model import RouterArch, RouterError
    from router.view import BlockView

    router, tmp, _, (drafter, verifier, tok), _ = signed_judge
    assert reproduce(tmp / "judge", router.cfg, torch_runner(router))["ok"]  # golden vectors hold the sums
    ids = torch.tensor([tok.encode("Question 3: what is 3 plus 3?\nAnswer:")])
    assert_generate_routes_agree(drafter, verifier, ids, tmp / "judge", router)
    with pytest.raises(ValueError, match="gamma auto's verifier-only steps"):
        generate(drafter, verifier, ids, rule=router, gamma="auto", max_new_tokens=4)
    q = torch.full((1, 2, router.cfg.vocab), 1 / router.cfg.vocab)
    with pytest.raises(RouterError, match="reads the answer so far"):
        router.decide(BlockView(q, q, drafts=torch.zeros(1, 2, dtype=torch.long), next_p_raw=q), 0.0)
    with pytest.raises(RouterError, match="running .* needs head: judge"):
        RouterArch(head="cascade", running=True)
