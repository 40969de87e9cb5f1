"""Seed ensembles packed into one router network: the average of N MLPs is an MLP.

Two judges trained with different seeds on the same examples can differ as much as the effect a study
looks for (docs/results.md, answer-level labels), so `ensemble: N` trains N members (seeds seed..seed+N-1)
and exports their average. N networks of the same shape reading the same standardised inputs average
exactly into one network N times as wide: the first layer stacks the members' rows, every hidden layer is
block-diagonal (member i reads only member i's units), and the last layer is the members' last layers side
by side, divided by N. The exported router is a plain `mlp` (or `linear`) of width N x width: the router
format, golden vectors, ONNX and every decoding front end take it as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from router.model import RouterConfig, RouterNet


def merge_members(members: list[RouterNet]) -> RouterNet:
    """One RouterNet whose output is the mean of the members' outputs (same config, inputs, standardisation)."""
    first = members[0]
    cfg = first.cfg
    if cfg.arch not in ("mlp", "linear"):
        raise ValueError(f"an ensemble packs mlp or linear routers into one, got arch {cfg.arch}: use arch mlp")
    for m in members[1:]:
        if not (torch.equal(m.mean, first.mean) and torch.equal(m.std, first.std)):
            raise ValueError("ensemble members must share their input standardisation (the same training rows)")
    n = len(members)
    wide = RouterConfig(**{**vars(cfg), "width": cfg.width * n}) if cfg.arch == "mlp" else cfg
    merged = RouterNet(wide)
    for name in ("mean", "std", *(["token_classes"] if cfg.head == "judge" else [])):
        getattr(merged, name).copy_(getattr(first, name))
    with torch.no_grad():
        if cfg.arch == "linear":
            merged.body.weight.copy_(torch.stack([m.body.weight for m in members]).mean(0))
            merged.body.bias.copy_(torch.stack([m.body.bias for m in members]).mean(0))
        else:
            _merge_layers([[layer for layer in m.body if isinstance(layer, nn.Linear)] for m in members], merged)
    return merged


def _merge_layers(layers: list[list[nn.Linear]], merged: RouterNet) -> None:
    """Fill the merged MLP's linear layers from the members' (layers[i][k]: member i's k-th linear layer)."""
    n = len(layers)
    targets = [layer for layer in merged.body if isinstance(layer, nn.Linear)]
    for k, target in enumerate(targets):
        weights, biases = [m[k].weight for m in layers], [m[k].bias for m in layers]
        if k == 0:  # every member reads the same inputs: stack the rows
            target.weight.copy_(torch.cat(weights, 0))
            target.bias.copy_(torch.cat(biases))
        elif k < len(targets) - 1:  # hidden layers: member i's units read member i's units only
            target.weight.copy_(torch.block_diag(*weights))
            target.bias.copy_(torch.cat(biases))
        else:  # the output: the members' outputs averaged
            target.weight.copy_(torch.cat(weights, 1) / n)
            target.bias.copy_(torch.stack(biases).mean(0))
