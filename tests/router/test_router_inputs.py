"""A router input is one declaration (router/inputs.py): a toy input added the way docs/rules.md says ("Adding a
router input": its functions and one register_input call, here in this file, then extra_inputs in the router's
config) trains, is scored offline, decodes in every route and exports (golden vectors, ONNX) with no other edit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from router.features import FEATURE_NAMES
from router.inputs import INPUTS, RouterInput, judge_inputs, register_input, unregister_input

P_MAX, Q_MAX = FEATURE_NAMES.index("p_max"), FEATURE_NAMES.index("q_max")


def _margin_online(view, position, arch, who, error):
    """How much surer the verifier is than the drafter at the scored position: p_max - q_max (..., 1)."""
    return (position[..., P_MAX] - position[..., Q_MAX])[..., None]


def _margin_offline(records, idx, arch, drafted):
    rows = records.features[idx]
    return (rows[:, P_MAX] - rows[:, Q_MAX])[:, None]


MARGIN = RouterInput(
    "verifier_margin", lambda size: ("verifier_margin",) * min(size, 1), _margin_online, _margin_offline
)


@pytest.fixture(scope="module")
def margin_judge(tmp_path_factory):
    """A judge reading the toy input, trained on a tiny consequence recording (signed labels)."""
    from helpers import consequence_recording
    from router.model import RouterArch, load_router
    from router.pair import tiny_pair
    from train.config import TrainConfig
    from train.labels import SIGNED_TARGET
    from train.run import run_train

    register_input(MARGIN)
    tmp = tmp_path_factory.mktemp("margin-judge")
    pair = tiny_pair(seed=2, noise=0.05)
    cfg = consequence_recording(tmp, pair, 12, modes=["consequence"])
    arch = RouterArch(head="judge", extra_inputs={"verifier_margin": 1})
    train = TrainConfig(
        records=[cfg.output], mode="consequence", target=SIGNED_TARGET, max_epochs=2, batch_size=64,
        output=str(tmp / "judge"), baselines=False, router=arch,
    )  # fmt: skip
    run_train(train)
    yield load_router(tmp / "judge"), tmp, cfg, pair
    unregister_input("verifier_margin")


def test_the_toy_input_is_read_offline_and_sized_in_the_config(margin_judge):
    from router.offline.inputs import RecordView

    router, _, cfg, _ = margin_judge
    assert [spec.name for spec in judge_inputs(router.cfg)] == ["verifier_margin"]
    view = RecordView([cfg.output], "train", mode="consequence")
    idx = np.arange(len(view))
    x, plain = view.judge_inputs(idx, arch=router.cfg), view.judge_inputs(idx)
    assert x.shape[1] == plain.shape[1] + 1 == router.cfg.position_dim
    assert np.allclose(x[:, -1], view.features[idx, P_MAX] - view.features[idx, Q_MAX])
    assert router.net.mean.shape == (router.cfg.input_dim,)


def test_the_toy_input_decodes_everywhere_and_exports(margin_judge, tmp_path):
    from helpers import assert_generate_routes_agree
    from router.export.golden import reproduce, torch_runner
    from router.export.onnx import export_onnx

    router, tmp, _, (drafter, verifier, tok) = margin_judge
    assert reproduce(tmp / "judge", router.cfg, torch_runner(router))["ok"]
    ids = torch.tensor([tok.encode("Question 3: what is 3 plus 3?\nAnswer:")])
    assert_generate_routes_agree(drafter, verifier, ids, tmp / "judge", router)
    report = export_onnx(tmp / "judge", tmp_path / "margin.onnx")
    assert report["ok"] and report["decisions_equal"]


def test_an_unregistered_or_misused_input_is_refused_in_one_line():
    from router.model import RouterArch, RouterError

    with pytest.raises(RouterError, match=r"extra_inputs names \['nope'\]: register them first"):
        RouterArch(head="judge", extra_inputs={"nope": 1})
    copy = register_input(dataclasses.replace(MARGIN, name="margin_copy"))
    try:
        with pytest.raises(RouterError, match="are a judge's inputs"):
            RouterArch(head="cascade", extra_inputs={"margin_copy": 1})
        with pytest.raises(RouterError, match="sizes are integers >= 0"):
            RouterArch(head="judge", extra_inputs={"margin_copy": -1})
        with pytest.raises(ValueError, match="registered already"):
            register_input(copy)
    finally:
        unregister_input("margin_copy")
    with pytest.raises(ValueError, match="built-in"):
        unregister_input("lag")
    assert list(INPUTS)[:3] == ["follow", "lag", "running"] and "margin_copy" not in INPUTS
