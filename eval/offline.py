"""Offline evaluation on held-out records: every method's full alpha sweep, no model calls.

From the recorded scalars and top-k candidates of the test split (router/offline/tradeoff.py), each method
gives a curve of expected quality (probability of the gold token under pi, and gold top-1 accuracy
of greedy decoding from pi) against the expected rejection rate TV(q, pi), and each point an
analytic latency relative to the verifier alone for block size gamma and drafter/verifier cost
ratio c (Leviathan et al.; i.i.d. acceptance with rate beta = 1 - rejection):
    tokens per block = (1 - beta^(gamma+1)) / (1 - beta),   cost per block = gamma c + 1,
    relative latency = cost per block / tokens per block.
Methods: drafter, verifier (= lossless), every registered rule with an offline score
(router.rules.offline_rules: chow diff opt in cascade form, token_v1 token_v2 token_v3 in token
form, and any rule added with register_rule), every learned router (scored through
router.offline.inputs, the code training validates with), the gold-knowing oracles (cascade and
token form, offline only) and a random router at matched deferral rates. lossy needs the full
distributions and is evaluated online only.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from router.inputs import greedy_view_only
from router.machine.costs import block_seconds, tokens_per_block
from router.model import LearnedRouter, RouterError
from router.labels import IMPORTANT
from router.records import RecordsError
from router.offline.inputs import RecordView, router_scores
from router.rules import offline_rules, window_offline_rules
from router.offline.views import (
    areas,
    best_of,
    cascade_sweep,
    compare,
    example_index,
    greedy_columns,
    greedy_rule_scores,
    greedy_score,
    method_sweeps,
)
from router.offline.tradeoff import (
    Curve,
    normalised_area,
    oracle_curve,
    quality_at,
    random_curve,
    router_curve,
    rule_curves,
    token_curve,
)

BOUNDS = ("oracle", "oracle_token", "random")  # what no method beats, and what any useful method beats
REFERENCE_METHODS = (*BOUNDS, "drafter", "lossless")  # offline curves that are neither a rule nor a router


def load_held_out(folders: list[str], split: str = "test", mode: str = "gold") -> RecordView:
    """Gold-mode rows of the held-out split (gold tokens define quality) of the record folders."""
    return RecordView(folders, split, mode)


def relative_latency(rejection: np.ndarray, gamma: int, cost_ratio: float) -> np.ndarray:
    """Analytic latency relative to the verifier alone (see the module docstring)."""
    acceptance = 1.0 - np.asarray(rejection, dtype=np.float64)
    return block_seconds(gamma, acceptance, cost_ratio, 1.0, bonus_drafter=False) / tokens_per_block(acceptance, gamma)


def method_curves(data: RecordView, routers: dict[str, LearnedRouter]) -> dict[str, Curve]:
    """Every offline method's curve (points sorted by rejection rate): the oracles, every registered
    rule with an offline score, drafter, lossless, random and every router."""
    c, q_top1, p_top1 = data.cols, data.q_top1, data.p_top1
    out = {
        "oracle": oracle_curve(c, q_top1, p_top1),
        "oracle_token": token_curve(data.cand.labels, data.cand, q_top1=q_top1),
        **rule_curves(c, data.cand, q_top1, p_top1),
    }
    out["drafter"] = _point_curve(0.0, c["q_token"], q_top1, 0.0)
    out["lossless"] = _point_curve(float(np.mean(c["tv"])), c["p_token"], p_top1, 1.0)
    rnd = random_curve(c["tv"], c["q_token"], c["p_token"])
    rnd.top1 = q_top1.mean() + rnd.deferral * (p_top1.mean() - q_top1.mean())
    out["random"] = rnd
    for name, router in routers.items():
        if greedy_view_only(router.cfg):  # e.g. a window judge: windows are recorded for the argmax only
            continue
        if router.cfg.head == "judge":  # its pi depends on the draft: Monte Carlo over the recorded samples
            out[name] = method_sweeps(data, {name: router}, ("t1",))["t1"][name].curve()
        else:
            out[name] = router_curve(router_scores(router, data, name=name), c, data.cand, q_top1, p_top1)
    return out


def compare_views(
    folders: list[str], test: RecordView, routers: dict[str, LearnedRouter], replicates: int = 1000, pairs: tuple = ()
) -> dict:
    """The greedy and temperature-1 views (router.offline.views) on the test split, with the best rule and the
    best router of each view chosen on the validation split: per method the area, the share of the
    gap between the best rule and the oracle it closes, and 95% bootstrap intervals over examples.
    Without a validation split nothing can be chosen honestly: {} (with a warning)."""
    try:
        val = RecordView(folders, "validation", hidden_inputs=())
    except RecordsError as err:
        warnings.warn(f"no gap-closed comparison: {err}")
        return {}
    chosen = {}
    for view, sweeps in method_sweeps(val, routers).items():
        point = areas(sweeps)
        chosen[view] = {
            "best_rule": best_of(point, [r for r in (*offline_rules(), *window_offline_rules()) if r in point]),
            "best_router": best_of(point, scored) if (scored := [r for r in routers if r in point]) else None,
            "validation_areas": point,
        }
    out = {}
    for view, sweeps in method_sweeps(test, routers).items():
        out[view] = {**compare(sweeps, chosen[view]["best_rule"], replicates, pairs=pairs), **chosen[view]}
    return out


def greedy_curves(data: RecordView, routers: dict[str, LearnedRouter]) -> dict[str, Curve]:
    """Greedy-view curves (router.offline.views: the drafter drafts its argmax, a rejection is a deferral
    where it differs from the verifier's argmax) of every rule with an offline score and every
    router, plus lossless and the drafter: what the records predict for greedy online decoding."""
    out = {name: sweep.curve() for name, sweep in method_sweeps(data, routers, views=("greedy",))["greedy"].items()}
    cost = greedy_columns(data)["cost"]
    out["lossless"] = _point_curve(float(np.mean(cost)), data.p_top1, data.p_top1, 1.0)
    out["drafter"] = _point_curve(0.0, data.q_top1, data.q_top1, 0.0)
    return out


def _point_curve(rejection: float, quality: np.ndarray, top1: np.ndarray, deferral: float) -> Curve:
    """A method without a trade-off (drafter, lossless): one point."""
    return Curve(
        np.array([rejection]),
        np.array([float(np.mean(quality))]),
        np.array([deferral]),
        np.array([np.nan]),
        np.array([float(np.mean(top1))]),
    )


def summarise(curves: dict[str, Curve], data: RecordView, gamma: int, cost_ratio: float) -> dict:
    """Per method: normalised area (0 drafter, 1 oracle), quality at matched rejection rates, and
    the two table forms on the analytic latency; plus the drafter's and verifier's own numbers."""
    c = data.cols
    verifier_rej, verifier_q = float(np.mean(c["tv"])), float(np.mean(c["p_token"]))
    refs = {
        "drafter": {
            "quality": float(np.mean(c["q_token"])),
            "top1": float(data.q_top1.mean()),
            "rejection": 0.0,
            "relative_latency": float(relative_latency(np.zeros(1), gamma, cost_ratio)[0]),
        },
        "verifier": {
            "quality": verifier_q,
            "top1": float(data.p_top1.mean()),
            "rejection": verifier_rej,
            "relative_latency": 1.0,
        },
    }
    matched = {f"quality_at_{int(f * 100)}pct": f * verifier_rej for f in (0.25, 0.5, 0.75)}
    methods = {}
    for name, cv in curves.items():
        lat = relative_latency(cv.rejection, gamma, cost_ratio)
        area = normalised_area(cv, curves["oracle"]) if len(cv.rejection) > 1 else float("nan")  # no trade-off
        s = {
            "area": area,
            "best_quality": float(cv.quality.max()),
            "best_top1": float(np.max(cv.top1)) if cv.top1 is not None else float("nan"),
        }
        s.update({k: quality_at(cv, r) for k, r in matched.items()})
        s["latency_at_verifier_quality"] = _lowest(lat, cv.quality >= verifier_q - 1e-12)
        s["quality_at_verifier_latency"] = (
            float(cv.quality[lat <= 1.0 + 1e-12].max()) if np.any(lat <= 1.0 + 1e-12) else float("nan")
        )
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
            rows.append(
                {
                    "stage": "offline",
                    "method": name,
                    "alpha": float(cv.threshold[i]) if cv.threshold is not None else float("nan"),
                    "rejection": float(cv.rejection[i]),
                    "quality": float(cv.quality[i]),
                    "top1": float(cv.top1[i]) if cv.top1 is not None else float("nan"),
                    "relative_latency": float(lat[i]),
                }
            )
    return rows


def load_routers(folders: list[str], taken: tuple = ()) -> dict[str, LearnedRouter]:
    """Routers by name (their folder name), each loaded with torch alone. A name that is already a
    rule, a baseline or a reference method (`taken`) is refused: eval would mix the two up."""
    from router.model import load_router

    routers = {}
    for folder in folders:
        name = Path(folder).name
        if name in routers:
            raise RouterError(f"two routers are named {name!r}: give their folders distinct names")
        if name in taken:
            raise RouterError(
                f"router folder {folder} is named {name!r}, which is already a rule, baseline or "
                f"reference method here: rename the folder (e.g. {name}-router)"
            )
        routers[name] = load_router(folder)
    return routers


def consequence_catch(folders: list[str], routers: dict[str, LearnedRouter]) -> dict | None:
    """On consequence labels (data_gen/consequence.py), the share of IMPORTANT mismatches each method
    defers at (catches) against its greedy-view rejection rate, on the test split's consequence
    rows: per method the sweep and the share caught at 25/50/75% of the verifier's own (lossless)
    rejection rate. None when the records have no consequence rows in the test split."""
    try:
        view = RecordView(folders, "test", mode="consequence")
    except RecordsError:
        return None
    important = (view.cols["consequence"] == IMPORTANT).astype(np.float64)
    if not important.sum():
        return None
    g, (index, n_ex) = greedy_columns(view), example_index(view)
    scores = {"oracle": important, **greedy_rule_scores(view)}  # the oracle defers exactly at important ones
    for name, router in routers.items():
        scores[name] = greedy_score(router_scores(router, view, name=name), router.cfg.head, view.cols["tv"])
    lossless = float(g["cost"].mean())
    out = {
        "positions": len(important),
        "important": int(important.sum()),
        "lossless_rejection": lossless,
        "methods": {},
    }
    for name, score in scores.items():
        curve = cascade_sweep(score, g["cost"], np.zeros_like(important), important, index, n_ex).curve()
        caught = curve.quality * len(important) / important.sum()  # (G,) share of important rows deferred
        out["methods"][name] = {
            "rejection": curve.rejection.tolist(),
            "caught": caught.tolist(),
            **{
                f"caught_at_{int(f * 100)}pct": float(caught[curve.rejection <= f * lossless + 1e-12].max())
                for f in (0.25, 0.5, 0.75)
            },
        }
    return out
