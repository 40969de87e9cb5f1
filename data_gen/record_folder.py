"""A record folder's state on disk: whether a run starts, resumes, grows or is refused (its
gen_config.json against this config), shards written atomically (a full disk explained), and the
manifest written last from the finished shards (router/records.py: the schema).
"""

from __future__ import annotations

import errno
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np

from data_gen.config import GenConfig
from data_gen.consequence import label_counts
from router.loop.layout import model_device
from router.features import FEATURE_NAMES, TOKEN_CLASS_NAMES, token_class_table
from router.infra.config import ConfigError, config_to_dict
from router.infra.files import file_sha256, write_bytes, write_json
from router.infra.stage_folders import clear_output
from router.pair import cached_fingerprint, tokenizer_fingerprint
from router.infra.quiet import import_datasets
from router.records import (
    EXAMPLES,
    HELDOUT,
    MANIFEST,
    SPLITS,
    TOKEN_CLASSES,
    Manifest,
    RecordsError,
    read_manifest,
    rows_to_table,
    shard_problem,
    side_file_problem,
    write_manifest,
    write_shard,
)


def intact_shard(folder: Path, name: str, examples: list[str] | None = None) -> dict | None:
    """The receipt of a finished shard whose file still matches it, else None (missing, cut short,
    changed, written before its receipt, or planned with other examples: a resume redoes it)."""
    path, receipt_path = Path(folder) / name, Path(folder) / f"{name}.json"
    if not (path.exists() and receipt_path.exists()):
        return None
    try:
        receipt = json.loads(receipt_path.read_text())
    except ValueError:
        return None
    if examples is not None and "examples" in receipt and receipt["examples"] != list(examples):
        return None  # a grown recording's last shard of a split: it now holds more examples
    if path.stat().st_size != receipt.get("bytes") or file_sha256(path) != receipt.get("sha256"):
        return None
    return {k: v for k, v in receipt.items() if k != "examples"}


def prepare_folder(out: Path, cfg: GenConfig) -> bool:
    """Create or check the output folder; True when it is already complete (nothing to do)."""
    resolved = recording_identity(cfg)
    config_path = out / "gen_config.json"
    if cfg.overwrite:  # only what gen wrote, and only in a folder holding nothing else (refused by name)
        clear_output(out, "gen")
    earlier = _earlier_config(config_path, out)
    if earlier is not None and _grows(earlier, resolved):
        _check_receipts_name_examples(out)
        # more (or fewer) examples of the same recording: finished shards whose examples are unchanged
        # are kept; the manifest is rewritten when the new plan is done
        print(
            f"{out}: max_examples {earlier.get('max_examples')} -> {cfg.max_examples}: recording the "
            f"difference, keeping the finished shards"
        )
        (out / MANIFEST).unlink(missing_ok=True)
        write_json(config_path, resolved)
        return False
    changed = config_changes(earlier, resolved) if earlier is not None else []
    if changed:
        state = "a finished" if (out / MANIFEST).exists() else "an unfinished"
        raise ConfigError(
            f"{out} holds {state} recording made with a different config (differs in {changed}): "
            f"rerun with the same config{' to resume' if state == 'an unfinished' else ''}, record "
            f"into another output, or pass overwrite=true"
        )
    if (out / MANIFEST).exists():
        damaged = folder_problems(out)
        if not damaged:
            return True
        print(f"{out} is finished but {'; '.join(damaged)}: repairing it (the intact shards are kept)")
        (out / MANIFEST).unlink()
        return False
    out.mkdir(parents=True, exist_ok=True)
    return False  # a new folder's config is written by `commit_config`, once the models have loaded


# how a folder is made, not what it holds: a resume may add or drop them, and a folder may be moved or copied
NOT_IDENTITY = ("overwrite", "labels_from", "output", "threads")  # threads: the same numbers, another speed


def recording_identity(cfg: GenConfig) -> dict:
    """The config fields that make a recording what it is (what gen_config.json holds and a rerun must match)."""
    return {k: v for k, v in config_to_dict(cfg).items() if k not in NOT_IDENTITY}


def commit_config(out: Path, cfg: GenConfig) -> None:
    """Write a new folder's gen_config.json, after everything that can refuse the run (the data, its metric
    fields, the models) has passed: a refused command leaves nothing a corrected rerun would trust."""
    config_path = out / "gen_config.json"
    if not config_path.exists():
        write_json(config_path, recording_identity(cfg))


def folder_problems(out: Path) -> list[str]:
    """What is wrong with a finished folder's files: each shard the manifest lists that is missing or
    differs from it, and each examples file that is missing or changed ([] when it is intact)."""
    try:
        manifest = read_manifest(out)
    except RecordsError as err:
        return [f"its manifest is unusable ({err})"]
    problems = []
    for shard in manifest.shards:
        problem = shard_problem(out, shard)
        if problem == "missing":
            problems.append(f"{shard['file']} is missing")
        elif problem:
            problems.append(f"{shard['file']} differs from the manifest ({problem})")
    for name in (EXAMPLES, HELDOUT):
        problem = side_file_problem(out, name, manifest)
        if problem:
            problems.append(f"{name} is {problem}")
    return problems


def config_changes(earlier: dict, resolved: dict) -> list[str]:
    """Config keys whose values differ between an earlier recording and this one. A field the
    earlier version did not have counts as its default (a newer version adding an option does not
    make older recordings stale)."""
    now = json.loads(json.dumps(resolved))
    defaults = json.loads(json.dumps(config_to_dict(GenConfig())))
    keys = (set(earlier) | set(now)) - set(NOT_IDENTITY)  # older folders stored `output` too: not compared
    return sorted(k for k in keys if earlier.get(k, defaults.get(k)) != now.get(k, defaults.get(k)))


def _earlier_config(config_path: Path, out: Path) -> dict | None:
    """The config an earlier run in this folder was made with (None for a new folder)."""
    if not config_path.exists():
        return None
    try:
        return json.loads(config_path.read_text())
    except ValueError:
        raise ConfigError(
            f"{config_path} is not valid JSON: the recording in {out} cannot be checked "
            f"against this config; pass overwrite=true to start it again"
        ) from None


def _check_receipts_name_examples(out: Path) -> None:
    """Growing keeps a shard only when its receipt names its examples (written by this version)."""
    for receipt in out.glob("*.arrow.json"):
        if "examples" not in json.loads(receipt.read_text() or "{}"):
            raise ConfigError(
                f"{out} was recorded before recordings could grow ({receipt.name} does not name its "
                f"examples): record into a new folder, or pass overwrite=true"
            )


def _grows(earlier: dict, resolved: dict) -> bool:
    """True when the configs differ in max_examples only (a recording made larger or smaller); a field the
    earlier version did not have counts as its default, as in `config_changes`."""
    return config_changes(earlier, resolved) == ["max_examples"]


def _concat(rows: list[dict]) -> dict:
    return {
        k: (sum((r[k] for r in rows), []) if isinstance(rows[0][k], list) else np.concatenate([r[k] for r in rows]))
        for k in rows[0]
    }


def write_token_classes(out: Path, tokenizer, vocab: int) -> dict:
    """token_classes.npy: the class bits of every token id (router.features.TOKEN_CLASS_NAMES), which
    judge routers read for the drafted token and carry into their export (decoding has no tokenizer)."""
    import io

    buf = io.BytesIO()
    np.save(buf, token_class_table(tokenizer, vocab))
    write_bytes(out / TOKEN_CLASSES, buf.getvalue())
    return {
        "file": TOKEN_CLASSES,
        "names": list(TOKEN_CLASS_NAMES),
        "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
    }


def write_shard_or_explain(out: Path, name: str, rows: list[dict], ids: list[str]) -> None:
    try:
        write_shard(out, name, rows_to_table(_concat(rows)), ids)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise RecordsError(
                f"the disk is full while writing {out / name}: free some space and rerun the same "
                f"command; finished shards are kept and the run resumes after them"
            ) from None
        raise


def _shard_statistics(out: Path, plan) -> dict:
    """Rows, examples and agreement counts over the finished shards, with each shard's receipt."""
    datasets = import_datasets()  # inside a command its log lines go to the command's log

    stats = dict(shards=[], tokens=0, agree=0.0, q_top1=0.0, p_top1=0.0, gold_tokens=0, consequence={})
    stats["split_examples"], stats["split_rows"] = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0)
    for name, split, shard_examples in plan:
        receipt = intact_shard(out, name, [ex.example_id for ex in shard_examples])
        if receipt is None:
            continue  # every example of this shard was skipped (the run redid any damaged one)
        ds = datasets.Dataset.from_file(str(out / name))
        feats = np.asarray(ds["features"])
        gold = np.asarray(ds["mode"]) == "gold"
        token, q_arg, p_arg = (np.asarray(ds[c]) for c in ("token", "q_argmax", "p_argmax"))
        stats["tokens"] += len(ds)
        stats["agree"] += float(feats[:, FEATURE_NAMES.index("argmax_agree")].sum())
        stats["gold_tokens"] += int(gold.sum())
        stats["q_top1"] += float((q_arg == token)[gold].sum())
        stats["p_top1"] += float((p_arg == token)[gold].sum())
        n_ex = len(set(ds["example_id"]))
        stats["shards"].append(
            dict(file=name, split=split, rows=len(ds), examples=n_ex, bytes=receipt["bytes"], sha256=receipt["sha256"])
        )
        stats["split_examples"][split] += n_ex
        stats["split_rows"][split] += len(ds)
        for key, value in label_counts(ds).items():
            stats["consequence"][key] = stats["consequence"].get(key, 0) + value
    return stats


def _models(cfg: GenConfig, recorder) -> dict:
    """The manifest's models: spec, name and weight fingerprint of each (the pair's identity)."""
    entry = {
        role: {
            "spec": getattr(cfg, role),
            "name": getattr(model, "name_or_path", ""),
            "hash": cached_fingerprint(model),
        }
        for role, model in (("drafter", recorder.drafter), ("verifier", recorder.verifier))
    }
    entry["verifier"].update(device_map=cfg.verifier_device_map, placement=_placement(recorder.verifier))
    return entry


def write_shard_counts(out: Path, name: str, now: dict, before: dict, ranks, dtype: dict | None = None) -> None:
    """`<shard>.counts.json`: what recording one shard counted (prompts truncated, examples skipped,
    ...), which process made it and in which dtype, so the manifest's counts cover the whole folder
    after a resume, and its dtype is the one the rows were computed in (a resume on another machine,
    or a snapshot loading the pair under load, may resolve `auto` differently)."""
    counts = {k: v - before.get(k, 0) for k, v in now.items()}
    done = {"counts": counts, "rank": ranks.rank, "world": ranks.world}
    write_json(out / f"{name}.counts.json", {**done, "dtype": dtype} if dtype else done)


def _folder_counts(out: Path, plan) -> tuple[dict, dict]:
    """The counts of every planned shard summed, and who made the folder: the world size of each run
    that wrote a shard, the rank that wrote each shard, and the shards no counts file describes."""
    counts, by_shard, uncounted = {}, {}, []
    for name, _, _ in plan:
        path = out / f"{name}.counts.json"
        if not path.exists():
            uncounted.append(name)
            continue
        done = json.loads(path.read_text())
        for k, v in done["counts"].items():
            counts[k] = counts.get(k, 0) + v
        by_shard[name] = {"rank": done["rank"], "world": done["world"]}
        if done.get("dtype"):
            by_shard[name]["dtype"] = done["dtype"]
    worlds = sorted({s["world"] for s in by_shard.values()})
    return counts, {"worlds": worlds, "by_shard": by_shard, "uncounted_shards": uncounted}


def folder_dtype(processes: dict, here: dict) -> dict:
    """The manifest's dtype: the one every shard says it was recorded in; `here` (this process's) for
    shards that do not say (older folders); where shards differ, their names joined and the count of
    shards of each (with a warning: the rows of one folder come from two numerics)."""
    recorded = [s.get("dtype", here) for s in processes["by_shard"].values()] or [here]
    names = sorted({d["dtype"] for d in recorded})
    if len(names) == 1:
        return recorded[0]
    shards = {n: sum(d["dtype"] == n for d in recorded) for n in names}
    warnings.warn(f"the shards were recorded in different dtypes ({shards}): `dtype: auto` resolved differently "
                  f"between runs; set dtype explicitly to keep one folder in one dtype")  # fmt: skip
    return {
        "dtype": "+".join(names),
        "shards": shards,
        "reason": "shards recorded in different runs",
        "cpu": here["cpu"],
    }


def finish_manifest(out: Path, cfg: GenConfig, plan, recorder, seconds: float) -> Manifest:
    """Gather shard statistics, write manifest.json last, return it."""
    stats = _shard_statistics(out, plan)
    counts, processes = _folder_counts(out, plan)
    if not stats["shards"]:  # never a "finished" folder with nothing in it
        c = {**dict.fromkeys(("skipped_empty", "skipped_long"), 0), **counts}
        raise RecordsError(
            f"no example of {out} could be recorded ({c['skipped_empty']} with an empty prompt or reference, "
            f"{c['skipped_long']} too long): check prompt_field/reference_field, or long_prompts=truncate"
        )
    total_bytes = sum(s["bytes"] for s in stats["shards"])
    tokens, gold_tokens = max(stats["tokens"], 1), max(stats["gold_tokens"], 1)
    manifest = Manifest(
        task=cfg.task,
        modes=list(cfg.modes),
        config=config_to_dict(cfg),
        models=_models(cfg, recorder),
        tokenizer_hash=tokenizer_fingerprint(recorder.tok)[:16],
        vocab=recorder.vocab,
        dtype=folder_dtype(processes, recorder.dtype.as_dict()),
        feature_names=list(FEATURE_NAMES),
        top_k=cfg.top_k,
        hidden_states=cfg.hidden_states,
        judge=cfg.judge,
        window=cfg.window,
        token_classes=write_token_classes(out, recorder.tok, recorder.vocab),
        splits={s: {"examples": stats["split_examples"][s], "rows": stats["split_rows"][s]} for s in SPLITS},
        shards=stats["shards"],
        tokens=stats["tokens"],
        bytes=total_bytes,
        bytes_per_token=total_bytes / tokens,
        counts=counts,
        processes=processes,
        files={name: file_sha256(out / name) for name in (EXAMPLES, HELDOUT)},
        seconds=seconds,
        consequence=stats["consequence"] or None,
        drafter_verifier_top1_agreement=stats["agree"] / tokens,
        gold_top1_accuracy={"drafter": stats["q_top1"] / gold_tokens, "verifier": stats["p_top1"] / gold_tokens},
    )
    write_manifest(out, manifest)
    return manifest


def _placement(model) -> dict | str:
    """Where a model's layers live: its accelerate device map, or its one device."""
    placed = getattr(model, "hf_device_map", None)
    return {k: str(v) for k, v in placed.items()} if placed else str(model_device(model))
