"""Cross-fitting folds over examples: every labelled example scored once by a router that never saw it.

K folds are drawn over example ids (not positions: the positions of one example move together),
balanced and reproducible: ids are ordered by a seeded hash and dealt round-robin, so a fold holds
the same examples on every machine and in every run, whatever order the records list them in. For
fold f the router trains on the other folds minus an inner validation part (where its alpha, its
variant and the best plug-in rule are chosen) and is scored on fold f. `specroute train
cross_fit=K` writes the plan as folds.json next to the K fold routers; eval reads it back.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

FOLDS_FILE = "folds.json"
FOLDS_FORMAT = 1


def _key(example_id: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{example_id}".encode()).hexdigest()


def fold_plan(example_ids, k: int, seed: int = 0, validation: float = 0.2) -> list[dict]:
    """Per fold: {"scored": ids of the fold, "validation": ids (a `validation` share of the other
    folds' examples), "train": the rest}, each list sorted. Every id is scored in exactly one fold."""
    ids = sorted({str(i) for i in example_ids}, key=lambda i: _key(i, seed))
    if k < 2 or len(ids) < 2 * k:
        raise ValueError(
            f"cross-fitting needs k >= 2 folds and at least 2 examples per fold: k={k} over {len(ids)} examples"
        )
    if not 0 < validation < 1:
        raise ValueError(f"the inner validation share must be in (0, 1), got {validation}")
    folds = [ids[f::k] for f in range(k)]
    plan = []
    for f in range(k):
        rest = [i for g, fold in enumerate(folds) if g != f for i in fold]  # still in hash order
        n_val = max(1, round(validation * len(rest)))
        plan.append({"scored": sorted(folds[f]), "validation": sorted(rest[:n_val]), "train": sorted(rest[n_val:])})
    return plan


def train_share(ids: list[str], share: float, seed: int = 0) -> list[str]:
    """The first `share` of a fold's training ids in seeded hash order (at least one), sorted: nested
    across shares (the examples of share 0.25 are among those of 0.5), for learning curves."""
    if not 0 < share <= 1:
        raise ValueError(f"the training share must be in (0, 1], got {share}")
    order = sorted(ids, key=lambda i: _key(f"share:{i}", seed))
    return sorted(order[: max(1, round(share * len(order)))])


def write_plan(folder: str | Path, plan: list[dict], seed: int, validation: float, records: list[str]) -> Path:
    from router.infra.files import write_json

    path = Path(folder) / FOLDS_FILE
    write_json(
        path,
        {
            "format": FOLDS_FORMAT,
            "k": len(plan),
            "seed": seed,
            "validation": validation,
            "records": records,
            "folds": plan,
        },
    )
    return path


def read_plan(folder: str | Path) -> dict:
    """folds.json of a cross-fitted router folder (FileNotFoundError names what is missing)."""
    path = Path(folder) / FOLDS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: {folder} is not a cross-fitted router folder (specroute train cross_fit=K)"
        )
    plan = json.loads(path.read_text())
    if plan.get("format") != FOLDS_FORMAT:
        raise ValueError(f"{path} has format {plan.get('format')}, this specroute reads {FOLDS_FORMAT}: retrain")
    return plan


def is_cross_fitted(folder: str | Path) -> bool:
    return (Path(folder) / FOLDS_FILE).exists()


def fold_folder(folder: str | Path, f: int) -> Path:
    return Path(folder) / f"fold-{f}"
