"""`specroute train cross_fit=K`: K routers, fold f fitted on every labelled example outside fold f.

The folds are drawn over every example of the records' mode in every split
(`router.offline.folds.fold_plan`), written first as output/folds.json; fold f's router is trained
on the other folds minus an inner validation share (early stopping, and where eval chooses its alpha
and the best plug-in rule) and exported to output/fold-f with the example ids it saw in its config
(`trained_on.example_ids`: eval refuses to score a router on an example it saw). A rerun keeps the
fold routers already finished (a fold folder with config.json and metrics.json) and fits the rest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from router.infra.files import write_json
from router.offline.folds import fold_folder, fold_plan, read_plan, train_share, write_plan
from router.records import load_records


def labelled_examples(records: list[str], mode: str) -> list[str]:
    """Every example id with rows of this mode in the record folders (all splits)."""
    ids = set()
    for folder in records:
        ds = load_records(folder, mode=mode)
        ids.update(np.asarray(ds.select_columns(["example_id"])[:]["example_id"]).astype(str).tolist())
    return sorted(ids)


def _plan(cfg, out: Path) -> list[dict]:
    """The fold plan: the one in folds.json when it matches this config, else a new one."""
    plan = fold_plan(
        labelled_examples(cfg.records, cfg.mode), cfg.cross_fit, cfg.cross_fit_seed, cfg.cross_fit_validation
    )
    if (out / "folds.json").exists():
        old = read_plan(out)
        if old["folds"] != plan:
            raise ValueError(
                f"{out}/folds.json holds other folds than these records and settings give (the records "
                f"grew, or cross_fit / cross_fit_seed changed): write to a new output folder"
            )
    write_plan(out, plan, cfg.cross_fit_seed, cfg.cross_fit_validation, [str(r) for r in cfg.records])
    return plan


def train_folds(cfg, out: Path, fit) -> dict:
    """Fit (or keep) every fold's router; metrics.json summarises them."""
    plan = _plan(cfg, out)
    per_fold = {}
    for f, fold in enumerate(plan):
        where = fold_folder(out, f)
        if (where / "config.json").exists() and (where / "metrics.json").exists():
            print(f"[specroute] cross-fit: fold {f} is finished, kept ({where})")
            per_fold[f] = json.loads((where / "metrics.json").read_text())
            continue
        train = train_share(fold["train"], cfg.cross_fit_train_share, cfg.cross_fit_seed)
        print(
            f"[specroute] cross-fit: fold {f + 1}/{len(plan)}: {len(train)} training, "
            f"{len(fold['validation'])} validation, {len(fold['scored'])} scored examples"
        )
        fold_cfg = dataclasses.replace(
            cfg, cross_fit=0, cross_fit_train_share=1.0, output=str(where)
        )  # the share is in `train`
        per_fold[f] = fit(fold_cfg, where, {"train": train, "validation": fold["validation"]})
    summary = {"k": len(plan), "folds": per_fold, "examples": sum(len(f["scored"]) for f in plan)}
    write_json(out / "metrics.json", summary)
    print(f"  cross-fitted routers written to {out}/fold-0 .. fold-{len(plan) - 1} (plan: {out}/folds.json)")
    return summary
