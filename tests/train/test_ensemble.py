"""Seed ensembles (train/ensemble.py): N members averaged exactly into one wider network, trained and
exported like any router."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import synthetic_token_records
from router.export.golden import reproduce, torch_runner
from router.model import RouterConfig, RouterNet, load_router
from train.ensemble import merge_members
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train


def _members(cfg: RouterConfig, n: int) -> list[RouterNet]:
    members = []
    for seed in range(n):
        torch.manual_seed(seed)
        net = RouterNet(cfg)
        net.mean.copy_(torch.linspace(-1, 1, cfg.input_dim))  # one standardisation for all
        net.std.copy_(torch.linspace(0.5, 2, cfg.input_dim))
        members.append(net)
    return members


@pytest.mark.parametrize(
    "shape", [dict(arch="mlp", depth=2), dict(arch="mlp", depth=1), dict(arch="linear"), dict(arch="mlp", depth=3)]
)
def test_the_merged_network_is_the_members_mean(shape):
    cfg = RouterConfig(**shape, width=8)
    members = _members(cfg, 3)
    merged = merge_members(members)
    assert merged.cfg.width == (24 if cfg.arch == "mlp" else 8)
    x = torch.randn(50, cfg.input_dim)
    with torch.no_grad():
        want = torch.stack([m(x) for m in members]).mean(0)
        torch.testing.assert_close(merged(x), want, atol=1e-5, rtol=1e-5)


def test_merging_refuses_members_that_read_other_inputs():
    cfg = RouterConfig(width=4)
    members = _members(cfg, 2)
    members[1].mean.add_(1.0)
    with pytest.raises(ValueError, match="share their input standardisation"):
        merge_members(members)
    with pytest.raises(ValueError, match="use arch mlp"):
        merge_members(_members(RouterConfig(arch="gru", width=4), 2))


def test_an_ensemble_trains_exports_and_scores_as_its_members_mean(tmp_path):
    records = synthetic_token_records(tmp_path / "rec", n_examples=60)
    cfg = TrainConfig(records=[str(records)], ensemble=2, max_epochs=2, batch_size=256, output=str(tmp_path / "ens"), baselines=False, router=RouterArch(width=8))  # fmt: skip
    run_train(cfg)
    router = load_router(tmp_path / "ens")
    assert router.cfg.width == 16 and router.cfg.trained_on["ensemble"] == {"members": 2, "seeds": [0, 1]}
    assert reproduce(tmp_path / "ens", router.cfg, torch_runner(router))["ok"]
    nets = []
    for seed in (0, 1):
        (ckpt,) = (tmp_path / "ens" / "members" / f"seed-{seed}" / "checkpoints").glob("*.ckpt")
        state = torch.load(ckpt, weights_only=False)["state_dict"]
        member = RouterNet(RouterConfig(**{**vars(router.cfg), "width": 8}))
        member.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
        nets.append(member)
    x = torch.randn(40, router.cfg.input_dim)
    with torch.no_grad():
        torch.testing.assert_close(router.net(x), (nets[0](x) + nets[1](x)) / 2, atol=1e-5, rtol=1e-5)
    assert json.loads((tmp_path / "ens" / "metrics.json").read_text())["router"]["area"] is not None
    with pytest.raises(Exception, match="use arch mlp"):
        TrainConfig(records=[str(records)], ensemble=2, router=RouterArch(arch="gru"))


def test_an_ensemble_member_is_the_router_a_standalone_run_with_its_seed_trains(tmp_path):
    """Reading the records once for all members changes nothing: member seed-1 of an ensemble is the
    network `seed: 1` trains on its own."""
    records = synthetic_token_records(tmp_path / "rec", n_examples=60)
    common = dict(records=[str(records)], router=RouterArch(width=8), max_epochs=2, batch_size=256, baselines=False)
    run_train(TrainConfig(ensemble=2, output=str(tmp_path / "ens"), **common))
    run_train(TrainConfig(seed=1, output=str(tmp_path / "one"), **common))
    (ckpt,) = (tmp_path / "ens" / "members" / "seed-1" / "checkpoints").glob("*.ckpt")
    member = torch.load(ckpt, weights_only=False)["state_dict"]
    alone = load_router(tmp_path / "one").net.state_dict()
    assert member.keys() == {f"net.{k}" for k in alone}
    for k, v in alone.items():
        torch.testing.assert_close(member[f"net.{k}"], v, atol=0, rtol=0)
