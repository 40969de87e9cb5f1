"""The models an eval decodes with: the records' pair on the configured engine (a backend of specroute's loop, or
a served engine through its bridge: router.backends.ENGINES), checked against the pair the records were made
with, and the dtype note its report prints beside every figure."""

from __future__ import annotations

import warnings

from eval.config import EvalConfig
from router.backends import DEFAULT_ENGINE, backend_of, bridge, get_engine
from router.infra.distributed import ranks as this_rank
from router.machine.hardware import resolve_dtype
from router.records import Manifest


def load_eval_pair(cfg: EvalConfig, manifest: Manifest):
    """The pair the online grid decodes with, on cfg.engine, checked against the records' pair. A served engine
    decodes through its bridge; the torch pair loads too (it checks the pair, tokenizes and scores)."""
    from router.pair import adopt_records_identity, check_pair_is, load_pair

    drafter = cfg.drafter or manifest.spec("drafter")
    verifier = cfg.verifier or manifest.spec("verifier")
    engine = get_engine(cfg.engine)
    on = cfg.engine if engine.loop else DEFAULT_ENGINE  # a served engine's pair loads on torch too
    device = this_rank().device(cfg.device)
    pair = load_pair(drafter, verifier, cfg.dtype, device, cfg.verifier_device_map, engine=on, threads=cfg.threads)
    if adopt_records_identity(pair, (drafter, verifier), manifest):  # routers trained on them decode too
        warnings.warn(
            f"decoding on {engine.label} ({pair[1].threads} threads) the GGUF files the records' "
            f"{manifest.dtype.get('engine', DEFAULT_ENGINE)} models were made from: the same weights, run by another engine"
        )
        return pair
    check_pair_is(pair, manifest.pair, f"the records {cfg.records[0]}")
    if not engine.loop:  # the same folders in the served engine; the torch pair scores and tokenizes
        return bridge(cfg.engine).serve_pair(pair, cfg, drafter, verifier, resolve_dtype(cfg.dtype, cfg.device).dtype)
    return pair


def dtype_note(cfg: EvalConfig, manifests: list[Manifest], pair=None) -> dict:
    """This run's dtype (and why), and whether the records were made in another one. Allowed: the
    pair's identity (its weight fingerprints) does not depend on the dtype, so records made in
    bf16 and an eval in float32 are the same pair; offline curves come from the records' numbers,
    online points from this run's, and the report says so. On llama.cpp: the engine's note (the GGUF
    files' own weight types, the threads and why)."""
    recorded = sorted({m.dtype.get("dtype", "unrecorded") for m in manifests})
    engine = get_engine(cfg.engine)
    own = backend_of(pair.verifier).note(pair.verifier) if engine.loop and pair is not None else None
    if own is not None:  # the engine's own note (its files' weight types, threads) in place of torch's dtype
        return {**own, "records_dtype": recorded}
    choice = resolve_dtype(cfg.dtype, cfg.device)
    note = {**choice.as_dict(), "records_dtype": recorded}
    if not engine.loop:
        note.update(bridge(cfg.engine).note(pair))
    if recorded != [choice.name]:
        note["mixed"] = (
            f"records made in {', '.join(recorded)}, online decoding in {choice.name}: the same pair "
            f"(weight fingerprints do not depend on dtype); offline curves use the records' numbers"
        )
        print(f"[specroute] note: {note['mixed']}")
    return note
