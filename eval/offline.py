"""Offline evaluation on held-out records: every method's full alpha sweep, no model calls.

From the recorded scalars and top-k candidates of the test split (router/tradeoff.py), each method
gives a curve of expected quality (probability of the gold token under pi, and gold top-1 accuracy
of greedy decoding from pi) against the expected rejection rate TV(q, pi), and each point an
analytic latency relative to the verifier alone for block size gamma and drafter/verifier cost
ratio c (Leviathan et al.; i.i.d. acceptance with rate beta = 1 - rejection):
    tokens per block = (1 - beta^(gamma+1)) / (1 - beta),   cost per block = gamma c + 1,
    relative latency = cost per block / tokens per block.
Methods: drafter, verifier (= lossless), chow diff opt (cascade form), token_v1 token_v2 token_v3
(token form), every learned router, the gold-knowing oracles (cascade and token form, offline
only) and a random router at matched deferral rates. lossy needs the full distributions and is
evaluated online only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from router.model import LearnedRouter, RouterError, check_router_pair, recorded_candidate_features, windows
from router.records import RecordsError, load_records, read_manifest, require_hidden_states
from router.tradeoff import (CANDIDATE_COLUMNS, TOKEN_METHODS, Curve, candidates_from_columns, curve,
                             defer_scores, normalised_area, quality_at, random_curve, token_curve, token_scores)

CASCADE_RULES = ("chow", "diff", "opt")
SCALARS = ("q_max", "p_max", "tv", "q_token", "p_token", "q_argmax", "p_argmax", "token")


@dataclass
class HeldOut:
    """The held-out split of one or more record folders, as arrays."""

    cols: dict          # scalar columns (N,)
    cand: object        # router.tradeoff.Candidates
    features: np.ndarray  # (N, F)
    traj: np.ndarray    # (N,) trajectory key (example + mode), rows in position order
    folders: list
    manifests: list
    split: str = "test"
    mode: str = "gold"
    _hidden: dict = field(default_factory=dict)  # role -> (N, H), read once however many routers use it

    @property
    def q_top1(self) -> np.ndarray:
        return (self.cols["q_argmax"] == self.cols["token"]).astype(np.float64)

    @property
    def p_top1(self) -> np.ndarray:
        return (self.cols["p_argmax"] == self.cols["token"]).astype(np.float64)

    def hidden(self, role: str) -> np.ndarray:
        """(N, H) hidden states of one model on these rows, read from the shards."""
        if role not in self._hidden:
            parts = []
            for folder, manifest in zip(self.folders, self.manifests):
                require_hidden_states(folder, manifest, role)
                ds = load_records(folder, split=self.split, mode=self.mode).select_columns([f"{role}_hidden"])
                parts.append(np.asarray(ds.with_format("numpy")[f"{role}_hidden"][:], dtype=np.float32))
            self._hidden[role] = np.concatenate(parts)
        return self._hidden[role]


def load_held_out(folders: list[str], split: str = "test", mode: str = "gold") -> HeldOut:
    """Gold-mode rows of the held-out split (gold tokens define quality) of the record folders."""
    cols, feats, traj, manifests = [], [], [], []
    for folder in folders:
        manifests.append(read_manifest(folder))
        ds = load_records(folder, split=split, mode=mode).with_format("numpy")
        if len(ds) == 0:
            raise RecordsError(f"{folder} has no {mode}-mode rows in its {split} split: record with modes "
                               f"including {mode} and enough examples for a {split} split")
        small = ds.select_columns(sorted({*SCALARS, *CANDIDATE_COLUMNS, "features", "example_id", "mode"}))[:]
        cols.append(small)
        feats.append(np.asarray(small["features"], dtype=np.float32))
        traj.append(np.char.add(np.asarray(small["example_id"]).astype(str), np.asarray(small["mode"]).astype(str)))
    merged = {k: np.concatenate([np.asarray(c[k]) for c in cols]) for k in {*SCALARS, *CANDIDATE_COLUMNS}}
    return HeldOut({k: merged[k] for k in SCALARS}, candidates_from_columns(merged), np.concatenate(feats),
                   np.concatenate(traj), list(folders), manifests, split, mode)


def router_scores(router: LearnedRouter, data: HeldOut, name: str) -> np.ndarray:
    """A router's predicted gaps on held-out rows: (N,) cascade head, (N, K) token head."""
    for manifest in data.manifests:
        check_router_pair(router.cfg, manifest, name)
    parts = [data.features] + [data.hidden(role) for role in router.hidden_inputs]
    x = torch.from_numpy(np.concatenate(parts, -1))  # (N, D)
    with torch.no_grad():
        if router.cfg.head == "token":
            return _token_head_scores(router, data, x)
        if router.cfg.arch == "gru":
            return _gru_scores(router, data, x)
        return router.net(x).double().numpy()


def _token_head_scores(router: LearnedRouter, data: HeldOut, x: torch.Tensor) -> np.ndarray:
    k = data.cand.q.shape[1]
    if router.cfg.token_candidates != k:
        raise RouterError(f"token router scores {router.cfg.token_candidates} candidates, the records hold top-{k}: "
                          f"record with top_k={router.cfg.token_candidates} or retrain on these records")
    c = recorded_candidate_features(data.cand)  # (N, K, 5)
    inputs = torch.cat([x[:, None].expand(-1, k, -1), c], -1)  # (N, K, D + 5)
    return router.net(inputs).double().numpy()


def _gru_scores(router: LearnedRouter, data: HeldOut, x: torch.Tensor) -> np.ndarray:
    """Each row with its predecessors in the same trajectory, as the GRU was trained."""
    out = np.zeros(len(x))
    starts = np.r_[0, np.nonzero(data.traj[1:] != data.traj[:-1])[0] + 1, len(x)]
    for a, b in zip(starts[:-1], starts[1:]):
        w = windows(x[a:b], router.cfg.window)  # (T, window, D)
        out[a:b] = router.net(w).double().numpy()
    return out


def relative_latency(rejection: np.ndarray, gamma: int, cost_ratio: float) -> np.ndarray:
    """Analytic latency relative to the verifier alone (see the module docstring)."""
    beta = np.clip(1.0 - np.asarray(rejection, dtype=np.float64), 0.0, 1.0 - 1e-12)
    tokens = (1.0 - beta ** (gamma + 1)) / (1.0 - beta)
    return (gamma * cost_ratio + 1.0) / tokens


def method_curves(data: HeldOut, routers: dict[str, LearnedRouter]) -> dict[str, Curve]:
    """Every offline method's curve (points sorted by rejection rate)."""
    c = data.cols
    args = (c["tv"], c["q_token"], c["p_token"], data.q_top1, data.p_top1)
    out = {"oracle": curve(defer_scores("oracle", c["q_max"], c["p_max"], c["tv"], c["q_token"], c["p_token"]),
                           *args),
           "oracle_token": token_curve(token_scores("oracle_token", data.cand), data.cand, q_top1=data.q_top1)}
    for name in CASCADE_RULES:
        out[name] = curve(defer_scores(name, c["q_max"], c["p_max"], c["tv"]), *args)
    for name in TOKEN_METHODS:
        out[name] = token_curve(token_scores(name, data.cand), data.cand, q_top1=data.q_top1)
    out["drafter"] = _point_curve(0.0, c["q_token"], data.q_top1, 0.0)
    out["lossless"] = _point_curve(float(np.mean(c["tv"])), c["p_token"], data.p_top1, 1.0)
    rnd = random_curve(c["tv"], c["q_token"], c["p_token"])
    rnd.top1 = data.q_top1.mean() + rnd.deferral * (data.p_top1.mean() - data.q_top1.mean())
    out["random"] = rnd
    for name, router in routers.items():
        s = router_scores(router, data, name)
        out[name] = token_curve(s, data.cand, q_top1=data.q_top1) if s.ndim == 2 else \
            curve(defer_scores("learned", c["q_max"], c["p_max"], c["tv"], learned=s), *args)
    return out


def _point_curve(rejection: float, quality: np.ndarray, top1: np.ndarray, deferral: float) -> Curve:
    """A method without a trade-off (drafter, lossless): one point."""
    return Curve(np.array([rejection]), np.array([float(np.mean(quality))]), np.array([deferral]),
                 np.array([np.nan]), np.array([float(np.mean(top1))]))


def summarise(curves: dict[str, Curve], data: HeldOut, gamma: int, cost_ratio: float) -> dict:
    """Per method: normalised area (0 drafter, 1 oracle), quality at matched rejection rates, and
    the two table forms on the analytic latency; plus the drafter's and verifier's own numbers."""
    c = data.cols
    verifier_rej, verifier_q = float(np.mean(c["tv"])), float(np.mean(c["p_token"]))
    refs = {"drafter": {"quality": float(np.mean(c["q_token"])), "top1": float(data.q_top1.mean()), "rejection": 0.0,
                        "relative_latency": float(relative_latency(np.zeros(1), gamma, cost_ratio)[0])},
            "verifier": {"quality": verifier_q, "top1": float(data.p_top1.mean()), "rejection": verifier_rej,
                         "relative_latency": 1.0}}
    matched = {f"quality_at_{int(f * 100)}pct": f * verifier_rej for f in (0.25, 0.5, 0.75)}
    methods = {}
    for name, cv in curves.items():
        lat = relative_latency(cv.rejection, gamma, cost_ratio)
        area = normalised_area(cv, curves["oracle"]) if len(cv.rejection) > 1 else float("nan")  # no trade-off
        s = {"area": area, "best_quality": float(cv.quality.max()),
             "best_top1": float(np.max(cv.top1)) if cv.top1 is not None else float("nan")}
        s.update({k: quality_at(cv, r) for k, r in matched.items()})
        s["latency_at_verifier_quality"] = _lowest(lat, cv.quality >= verifier_q - 1e-12)
        s["quality_at_verifier_latency"] = float(cv.quality[lat <= 1.0 + 1e-12].max()) \
            if np.any(lat <= 1.0 + 1e-12) else float("nan")
        methods[name] = s
    return {"references": refs, "methods": methods}


def _lowest(values: np.ndarray, mask: np.ndarray) -> float:
    return float(values[mask].min()) if np.any(mask) else float("nan")


def curve_rows(curves: dict[str, Curve], gamma: int, cost_ratio: float, max_points: int = 400) -> list[dict]:
    """Curve points as rows for curves.csv."""
    rows = []
    for name, cv in curves.items():
        lat = relative_latency(cv.rejection, gamma, cost_ratio)
        step = max(1, len(cv.rejection) // max_points)
        for i in list(range(0, len(cv.rejection), step)) + [len(cv.rejection) - 1]:
            rows.append({"stage": "offline", "method": name,
                         "alpha": float(cv.threshold[i]) if cv.threshold is not None else float("nan"),
                         "rejection": float(cv.rejection[i]), "quality": float(cv.quality[i]),
                         "top1": float(cv.top1[i]) if cv.top1 is not None else float("nan"),
                         "relative_latency": float(lat[i])})
    return rows


def load_routers(folders: list[str]) -> dict[str, LearnedRouter]:
    """Routers by name (their folder name), each loaded with torch alone."""
    from router.model import load_router

    routers = {}
    for folder in folders:
        name = Path(folder).name
        if name in routers:
            raise RouterError(f"two routers are named {name!r}: give their folders distinct names")
        routers[name] = load_router(folder)
    return routers
