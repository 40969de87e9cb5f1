"""A judge router's inputs beyond its own per-token features, each kind declared once (docs/rules.md, "Adding a
router input").

A `RouterInput` says everything the stages need of one kind of input: the architecture setting that switches it
on and sizes it, its column names (so its width), what it needs the decoding loop to put in the view
(router.policy.Needs), how it is built online from a `BlockView`, offline from a records view, what an engine
port feeds it (the decision module's inputs and seeded golden values). The router's architecture (input width,
needs), the network's inputs online, the record view's training and scoring inputs, the decision module and its
golden vectors all read `judge_inputs(arch)`, in `INPUTS` order (the order the columns are concatenated in).

The built-in ones read what the loop already provides: the follow window of a block's drafts, the lag history
carried across blocks and the answer so far (router/window/). An input that reads only what the view holds
(q, p, the drafts, the lookahead, the position features) is one module plus one `register_input` call; it is
switched on per router with `extra_inputs: {name: size}` (or a RouterArch field of its name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from router.features import FEATURE_NAMES, position_stats
from router.records import RecordsError
from router.window.follow import FOLLOW_FEATURE_NAMES, FollowWindow, follow_features
from router.window.lag import LAG_FEATURE_NAMES, LagBefore, LagHistory, block_lags, lag_features, lag_history
from router.window.running import RUNNING_COLUMNS, RUNNING_NAMES, block_running, running_features, running_history


def _no_export(arch) -> list[str]:
    return []


@dataclass(frozen=True)
class RouterInput:
    """One kind of judge input. `size(arch)` is its setting (0 / False: off). Columns: `feature_names(size)`.

    online(view, position, arch, who, error) -> (..., W): from a BlockView and the scored positions' features
    (..., F); `who` names the router and `error` is the exception it raises for a view without its input.
    offline(records, idx, arch, drafted) -> (n, W): from a records view (router.offline.inputs.RecordView) rows.
    needs(arch) -> dict: keyword arguments of router.policy.Needs the loop must satisfy ({} : the view suffices).
    export_names(arch) / export_view(tensors, arch, inputs): the decision module's extra inputs and how they
    become view inputs; golden(arch, generator, positions, vocab) -> seeded values for them.
    describe(arch) -> str: one phrase for training summaries. argmax_only: records hold it for the drafter's argmax
    only, so a router reading it is scored in the greedy view alone."""

    name: str
    feature_names: Callable[[int], tuple]
    online: Callable
    offline: Callable
    needs: Callable = field(default=lambda arch: {})
    export_names: Callable = field(default=_no_export)
    export_view: Callable | None = None
    golden: Callable = field(default=lambda arch, g, positions, vocab: {})
    describe: Callable = field(default=lambda arch: "")
    argmax_only: bool = False

    def size(self, arch) -> int:
        """Its setting in `arch`: a field of its name, else its entry in `extra_inputs` (0: off)."""
        if hasattr(arch, self.name):
            return int(getattr(arch, self.name))
        return int((getattr(arch, "extra_inputs", None) or {}).get(self.name, 0))

    def width(self, arch) -> int:
        return len(self.feature_names(self.size(arch)))


# --- the follow window: the verifier's scores of the next drafts of the block (router/window/follow.py) ---


def _follow_online(view, position: torch.Tensor, arch, who: str, error: type) -> torch.Tensor:
    follow = view.read("follow", f"{who} (a window judge)", error)
    return follow_features(follow, arch.follow).to(position.dtype)


def _follow_offline(records, idx: np.ndarray, arch, drafted: str) -> np.ndarray:
    if drafted != "argmax":
        raise RecordsError(
            "windows are recorded for the drafter's argmax only (data_gen/window.py): a window judge is scored "
            "in the greedy view"
        )
    window = records.follow_windows(idx, arch.follow, getattr(arch, "follow_block", 0))
    return follow_features(window, arch.follow).numpy()


def _follow_view(tensors: list, arch, inputs: dict) -> None:
    values, valid = tensors  # (N, W, C), (N, W) as 1/0
    inputs["follow"] = FollowWindow(values.new_zeros(values.shape[0], values.shape[-1]), values.float(), valid > 0.5)


def _follow_golden(arch, g: torch.Generator, positions: int, vocab: int) -> dict:
    """Plausible DRAFT_SCALARS of W followers, the last ones of some positions cut."""
    width = arch.follow
    p_max = 0.2 + 0.8 * torch.rand(positions, width, generator=g)
    agree = (torch.rand(positions, width, generator=g) < 0.7).float()
    p_draft = torch.where(agree > 0, p_max, p_max * torch.rand(positions, width, generator=g))
    entropy = 1.1 * torch.rand(positions, width, generator=g) * (1 - p_max)
    kept = torch.randint(0, width + 1, (positions, 1), generator=g)  # followers inside the block
    valid = (torch.arange(width)[None] < kept).float()  # (N, W)
    values = torch.stack([p_draft, agree, entropy, p_max], -1) * valid[..., None]  # (N, W, C)
    return {"follow_values": values, "follow_valid": valid}


def _follow_describe(arch) -> str:
    cut = f" (cut as in blocks of {arch.follow_block})" if getattr(arch, "follow_block", 0) else ""
    return f"{arch.follow} following drafts{cut}"


FOLLOW = RouterInput(
    "follow",
    lambda size: tuple(f"follow{i}_{n}" for i in range(size) for n in FOLLOW_FEATURE_NAMES),
    _follow_online,
    _follow_offline,
    needs=lambda arch: {"follow": arch.follow, "follow_block": getattr(arch, "follow_block", 0)},
    export_names=lambda arch: ["follow_values", "follow_valid"],
    export_view=_follow_view,
    golden=_follow_golden,
    describe=_follow_describe,
    argmax_only=True,
)


# --- the lag history: the features of the positions before the drafted one (router/window/lag.py) ---


def _lag_online(view, position: torch.Tensor, arch, who: str, error: type) -> torch.Tensor:
    lag = view.get("lag")
    if isinstance(lag, LagHistory) and lag.values.shape[-2] == arch.lag:
        return lag_features(lag.values, lag.valid).to(position.dtype)
    if isinstance(lag, LagBefore) and position.dim() == 3 and lag.feats.shape[1] == arch.lag:
        return lag_features(*block_lags(lag.feats, lag.valid, position)).to(position.dtype)
    raise error(
        f"{who} is a lag judge reading {arch.lag} positions back: pass lag=LagBefore (feats (B, {arch.lag}, F), "
        f"valid) for a block (B, g, V) or a LagHistory per position (router.window.lag; router.decoding.generate does)"
    )


def _lag_offline(records, idx: np.ndarray, arch, drafted: str) -> np.ndarray:
    history, valid = lag_history(records.features, records.traj, idx, arch.lag)
    return lag_features(torch.from_numpy(history), torch.from_numpy(valid)).numpy()


def _lag_view(tensors: list, arch, inputs: dict) -> None:
    values, valid = tensors  # (N, L, F), (N, L) as 1/0
    inputs["lag"] = LagHistory(values.float(), valid > 0.5)


def _lag_golden(arch, g: torch.Generator, positions: int, vocab: int) -> dict:
    """The position features of L earlier positions from seeded logits, the oldest of some positions missing."""
    lag = arch.lag
    base = torch.randn(positions, lag, vocab, generator=g)
    q_logits, p_logits = (
        2 * base + torch.randn(base.shape, generator=g),
        2 * base + 0.3 * torch.randn(base.shape, generator=g),
    )
    values = position_stats(q_logits.softmax(-1), p_logits.softmax(-1))[0]  # (N, L, F)
    kept = torch.randint(0, lag + 1, (positions, 1), generator=g)
    valid = (torch.arange(lag)[None] < kept).float()  # (N, L)
    return {"lag_values": values * valid[..., None], "lag_valid": valid}


LAG = RouterInput(
    "lag",
    lambda size: tuple(f"lag{i}_{n}" for i in range(size) for n in LAG_FEATURE_NAMES),
    _lag_online,
    _lag_offline,
    needs=lambda arch: {"lag": arch.lag},
    export_names=lambda arch: ["lag_values", "lag_valid"],
    export_view=_lag_view,
    golden=_lag_golden,
    describe=lambda arch: f"{arch.lag} lagged positions",
)


# --- the answer so far: sums over every earlier position (router/window/running.py) ---


def _running_online(view, position: torch.Tensor, arch, who: str, error: type) -> torch.Tensor:
    lag = view.get("lag")
    if isinstance(lag, LagHistory) and lag.sums is not None:
        return running_features(lag.sums, lag.count).to(position.dtype)
    if isinstance(lag, LagBefore) and lag.sums is not None and position.dim() == 3:
        return running_features(*block_running(lag.sums, lag.count, position)).to(position.dtype)
    raise error(
        f"{who} reads the answer so far: pass lag=LagBefore(..., sums (B, {len(RUNNING_COLUMNS)}), count (B,)) "
        f"for a block (B, g, V), or a LagHistory with sums and count per position (router.window.running; "
        f"router.decoding.generate does)"
    )


def _running_offline(records, idx: np.ndarray, arch, drafted: str) -> np.ndarray:
    sums, count = running_history(records.features, records.traj, idx)
    return running_features(torch.from_numpy(sums), torch.from_numpy(count)).numpy()


def _running_view(tensors: list, arch, inputs: dict) -> None:
    sums, count = tensors  # (N, R), (N,)
    lag = inputs.get("lag") or LagHistory(
        sums.new_zeros(len(sums), 0, len(FEATURE_NAMES)), sums.new_zeros(len(sums), 0)
    )
    inputs["lag"] = LagHistory(lag.values, lag.valid, sums.float(), count.float())


def _running_golden(arch, g: torch.Generator, positions: int, vocab: int) -> dict:
    """Sums of RUNNING_SOURCES over 0..200 earlier positions with plausible means (the first has none)."""
    count = torch.randint(0, 201, (positions,), generator=g).float()
    count[0] = 0
    means = torch.stack(
        [
            0.3 + 0.7 * torch.rand(positions, generator=g),  # p_max
            torch.rand(positions, generator=g),  # argmax agreement
            0.5 * torch.rand(positions, generator=g),  # tv
            2.0 * torch.rand(positions, generator=g),  # p_entropy
        ],
        -1,
    )  # (N, R)
    return {"running_sums": means * count[:, None], "running_count": count}


RUNNING = RouterInput(
    "running",
    lambda size: tuple(RUNNING_NAMES) * size,
    _running_online,
    _running_offline,
    needs=lambda arch: {"running": True},
    export_names=lambda arch: ["running_sums", "running_count"],
    export_view=_running_view,
    golden=_running_golden,
    describe=lambda arch: "the answer so far",
)


INPUTS: dict[str, RouterInput] = {i.name: i for i in (FOLLOW, LAG, RUNNING)}  # concatenated in this order


def register_input(spec: RouterInput) -> RouterInput:
    """Add an input kind (after the built-in ones); its name must be new."""
    if spec.name in INPUTS:
        raise ValueError(f"a router input named {spec.name!r} is registered already: pick another name")
    INPUTS[spec.name] = spec
    return spec


def unregister_input(name: str) -> None:
    """Remove an input kind added with register_input (tests, notebooks); the built-in ones stay."""
    if name in (FOLLOW.name, LAG.name, RUNNING.name):
        raise ValueError(f"{name} is a built-in router input")
    INPUTS.pop(name, None)


def unknown_inputs(arch) -> list[str]:
    """Names in `arch.extra_inputs` that no registered input has (router.arch refuses them)."""
    return sorted(set(getattr(arch, "extra_inputs", None) or {}) - set(INPUTS))


def judge_inputs(arch) -> list[RouterInput]:
    """The input kinds `arch` (a RouterArch or RouterConfig, or any object with those settings) switches on."""
    return [spec for spec in INPUTS.values() if spec.size(arch)]


def greedy_view_only(arch) -> bool:
    """True when an input it reads exists for the drafter's argmax only (no sampled-view scores offline)."""
    return any(spec.argmax_only for spec in judge_inputs(arch))


def judge_input_width(arch) -> int:
    """Columns the switched-on inputs add after the judge's own features."""
    return sum(spec.width(arch) for spec in judge_inputs(arch))


def judge_input_needs(arch) -> dict:
    """What the switched-on inputs need the loop to provide, as router.policy.Needs keyword arguments."""
    out: dict = {}
    for spec in judge_inputs(arch):
        out.update(spec.needs(arch))
    return out
