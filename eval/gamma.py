"""gamma: auto for `specroute eval`: the draft length chosen once per run from the pair's measured
costs on this machine and the records' acceptance rate, saved in gamma.json so a rerun resumes with
the same gamma (router/machine/calibrate.py holds the cost model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from router.infra.files import write_json
from router.machine.calibrate import GammaChoice, calibrate_gamma, machine_of
from router.records import RecordsError


def records_acceptance(records: list, temperature: float) -> float:
    """How often the verifier keeps the drafter's token, on the records' validation split (train
    when there is none): argmax agreement for greedy decoding, else sum min(p, q) = 1 - TV, the
    acceptance probability of exact speculative sampling."""
    from router.records import load_records

    rows = []
    for folder in records:
        for split in ("validation", "train"):
            ds = load_records(folder, split=split)
            if len(ds):
                rows.append(ds.select_columns(["q_argmax", "p_argmax", "tv"]).with_format("numpy")[:])
                break
    if not rows:
        raise RecordsError(f"{records} have no validation or train rows to measure the acceptance rate on")
    if temperature <= 0:
        return float(np.mean(np.concatenate([r["q_argmax"] == r["p_argmax"] for r in rows])))
    return float(1 - np.mean(np.concatenate([r["tv"] for r in rows])))


def _earlier_choice(path: Path) -> GammaChoice | None:
    """The choice an earlier run saved, or None (none saved, or the file is damaged: said, then redone)."""
    if not path.exists():
        return None
    try:
        return GammaChoice.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        print(f"[specroute] {path} is damaged ({type(err).__name__}: {err}): calibrating gamma again")
        return None


def resolve_gamma(out: Path, pair, records: list, batch: int, temperature: float) -> GammaChoice:
    """gamma: auto. The choice in out/gamma.json when it was made on this machine, in this dtype, at
    this batch size (a rerun resumes with the same gamma); else a fresh calibration, saved there."""
    path = out / "gamma.json"
    done = _earlier_choice(path)
    if done is not None and (done.machine, done.dtype, done.batch) == (*machine_of(pair.verifier), batch):
        print(f"[specroute] {done.summary()} (from {path})")
        return done
    print("[specroute] gamma: auto: measuring the pair's costs on this machine ...", flush=True)
    choice = calibrate_gamma(pair.drafter, pair.verifier, batch, records_acceptance(records, temperature))
    write_json(path, choice.as_dict())
    print(f"[specroute] {choice.summary()}")
    return choice
