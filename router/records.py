"""The one record schema every stage reads: one row per (example, position).

A record folder holds Arrow shards (`<split>-NNNNN.arrow`, memory-mapped on load, never copied
into RAM whole) and `manifest.json`, written last: a folder without a manifest is incomplete.
Shards and the manifest are written atomically (temporary file + rename), so a half-written
shard is never taken for a finished one. Read a folder back with `load_records`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from router.infra.files import atomic_write_bytes, file_sha256
from router.infra.stage_folders import stage_of
from router.infra.quiet import import_datasets

SCHEMA_VERSION = 3  # 3: the typed Manifest (every field written); 2: p_at_q_topk_logprobs
MANIFEST = "manifest.json"
TOKEN_CLASSES = "token_classes.npy"  # class bits per token id (router.features.token_class_table)
EXAMPLES = "examples.jsonl"  # the recorded examples (id, split, prompt, reference, metric fields), for eval
HELDOUT = "heldout.jsonl"  # the task's further test-split examples (same form): online prompts beyond the recording
SPLITS = ("train", "validation", "test")
RECORD_MODES = ("gold", "rollout", "consequence")  # how a row's continuation was made (docs/design.md)

# scalar columns and their Arrow types; list columns are built from (N, k) arrays
# column types are Arrow type names: pyarrow is imported where tables are built (routers need none to import)
SCALAR_COLUMNS: dict[str, str] = {
    "example_id": "string",
    "task": "string",
    "split": "string",
    "mode": "string",
    "position": "int32",
    "token": "int32",
    "draft_token": "int32",
    "q_tail": "float32",
    "p_tail": "float32",
    "q_max": "float32",
    "p_max": "float32",
    "q_entropy": "float32",
    "p_entropy": "float32",
    "tv": "float32",
    "kl": "float32",
    "q_token": "float32",
    "p_token": "float32",
    "q_argmax": "int32",
    "p_argmax": "int32",
}
LIST_COLUMNS: dict[str, str] = {
    "q_topk_ids": "int32",
    "q_topk_logprobs": "float32",
    "p_topk_ids": "int32",
    "p_topk_logprobs": "float32",
    "p_at_q_topk_logprobs": "float32",  # log p of each q_topk_ids token: token-form rules and routers
    "features": "float32",
}
# q and p of the recorded sample `draft_token`; consequence mode: its label, the branch's correctness (1/0, -1
# where no branch was decoded), the answer's (per example) and the branch's answer ("" where no branch)
OPTIONAL_SCALAR_COLUMNS: dict[str, str] = {
    "q_draft": "float32",
    "p_draft": "float32",
    "consequence": "int8",
    "branch_correct": "int8",
    "answer_correct": "int8",
    "branch_answer": "string",
    "horizon_score": "float32",  # consequence_horizon > 0: the short-horizon score of a mismatch, else NaN
}


def judge_column(drafted: str, kind: str) -> str:
    """Judge input column (data_gen/judge.py) of drafted "argmax"/"sample", kind "hidden"/"lookahead"."""
    if drafted not in ("argmax", "sample"):
        raise ValueError(f"drafted must be 'argmax' or 'sample', got {drafted!r}")
    return f"{'' if drafted == 'argmax' else 'sample_'}after_{kind}"


OPTIONAL_LIST_COLUMNS: dict[str, str] = {
    "drafter_hidden": "float16",
    "verifier_hidden": "float16",
    # judge inputs (data_gen/judge.py): the verifier after reading the drafter's argmax / its sample
    "after_hidden": "float16",
    "after_lookahead": "float32",
    "sample_after_hidden": "float16",
    "sample_after_lookahead": "float32",
    "window": "float32",  # window inputs (data_gen/window.py): (1 + W) x C floats, NaN without a window
}
REQUIRED_COLUMNS = tuple(SCALAR_COLUMNS) + tuple(LIST_COLUMNS)


class RecordsError(ValueError):
    """A record folder that cannot be used, with what is wrong and how to fix it."""


def _fixed_list(array: np.ndarray, dtype: str):
    """(N, k) array -> Arrow fixed-size list column of that type."""
    import pyarrow as pa

    array = np.ascontiguousarray(array)
    flat = pa.array(array.reshape(-1), type=getattr(pa, dtype)())
    return pa.FixedSizeListArray.from_arrays(flat, array.shape[1])


def rows_to_table(columns: dict[str, np.ndarray | list]):
    """Build an Arrow table in the record schema; missing required columns are an error."""
    import pyarrow as pa

    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise RecordsError(f"record rows lack columns {missing}")
    arrays, names = [], []
    for name, dtype in SCALAR_COLUMNS.items():
        arrays.append(pa.array(columns[name], type=getattr(pa, dtype)()))
        names.append(name)
    for name, dtype in OPTIONAL_SCALAR_COLUMNS.items():
        if name in columns:
            arrays.append(pa.array(columns[name], type=getattr(pa, dtype)()))
            names.append(name)
    for name, dtype in {**LIST_COLUMNS, **OPTIONAL_LIST_COLUMNS}.items():
        if name in columns:
            arrays.append(_fixed_list(np.asarray(columns[name]), dtype))
            names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def write_shard(folder: Path, name: str, table, examples: list[str] | None = None) -> dict:
    """Write one Arrow stream shard atomically, then its receipt `<name>.json` (rows, bytes, sha256,
    and the ids of the examples it was planned with), which the manifest copies and a resume checks;
    return the receipt."""
    import pyarrow as pa

    path = Path(folder) / name

    def write(f):
        with pa.ipc.new_stream(f, table.schema) as writer:
            writer.write_table(table)

    atomic_write_bytes(path, write)
    receipt = {"rows": table.num_rows, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    if examples is not None:
        receipt["examples"] = list(examples)
    data = json.dumps(receipt).encode()
    atomic_write_bytes(Path(folder) / f"{name}.json", lambda f: f.write(data))
    return receipt


@dataclass(frozen=True)
class Manifest:
    """What a record folder holds and how it was made: `manifest.json`, written last by data_gen and
    read by train, eval, the demo and the router pair checks."""

    task: str
    shards: list  # [{file, split, rows, examples, bytes, sha256}] in write order
    feature_names: list  # router.features.FEATURE_NAMES when recorded
    schema_version: int = SCHEMA_VERSION
    modes: list = field(default_factory=list)  # gold / rollout / consequence
    config: dict = field(default_factory=dict)  # the resolved gen config
    models: dict = field(default_factory=dict)  # {drafter|verifier: {spec, name, hash, ...}}
    tokenizer_hash: str | None = None
    vocab: int | None = None
    dtype: dict = field(default_factory=dict)  # router.machine.hardware.DtypeChoice.as_dict()
    top_k: int | None = None
    hidden_states: str = "none"  # none / drafter / verifier / both
    judge: bool = False  # the verifier's view of the drafted tokens was recorded
    window: int = 0  # > 0: the window column's W (data_gen/window.py)
    token_classes: dict | None = None  # {sha256} of token_classes.npy
    splits: dict = field(default_factory=dict)  # {split: {examples, rows}}
    tokens: int = 0
    bytes: int = 0
    bytes_per_token: float = 0.0
    counts: dict = field(default_factory=dict)  # examples recorded / skipped / truncated
    seconds: float = 0.0
    consequence: dict | None = None  # consequence-label counts (modes with consequence)
    drafter_verifier_top1_agreement: float = 0.0
    gold_top1_accuracy: dict = field(default_factory=dict)  # {drafter, verifier}
    files: dict = field(default_factory=dict)  # {examples.jsonl, heldout.jsonl: sha256}, checked when read
    processes: dict = field(default_factory=dict)  # {worlds, by_shard: {shard: {rank, world}}, uncounted_shards}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, where: str = "manifest") -> "Manifest":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise RecordsError(
                f"{where} has fields this specroute does not know ({unknown}): it was written by "
                f"another version; re-record it (`specroute gen ... overwrite=true`)"
            )
        try:
            return cls(**values)
        except TypeError as err:
            raise RecordsError(f"{where} is incomplete ({err}): {REPAIR}") from None

    @property
    def id(self) -> str:
        """A short content id of the record folder, for tracing outputs to their data."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def pair(self) -> dict:
        """The model pair the folder was made with: drafter, verifier and tokenizer hashes."""
        return {
            "drafter": self.models.get("drafter", {}).get("hash"),
            "verifier": self.models.get("verifier", {}).get("hash"),
            "tokenizer": self.tokenizer_hash,
        }

    def spec(self, role: str) -> str:
        """The model spec (hub id, folder, embedded:..., tiny:...) the folder recorded `role` with."""
        return self.models[role]["spec"]


def write_manifest(folder: Path, manifest: Manifest) -> None:
    data = json.dumps(manifest.as_dict(), indent=2, sort_keys=True, default=str).encode()
    atomic_write_bytes(Path(folder) / MANIFEST, lambda f: f.write(data))


def read_manifest(folder: str | Path) -> Manifest:
    """The manifest of a complete record folder, or a RecordsError saying why it is unusable."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordsError(f"record folder {folder} does not exist: run `specroute gen` first")
    path = folder / MANIFEST
    made_by = stage_of(folder)
    if not path.exists() and made_by not in (None, "gen"):
        raise RecordsError(
            f"{folder} is the output of `specroute {made_by}`, not a recording: records= takes a folder "
            f"`specroute gen` wrote (e.g. runs/records/<task>)"
        )
    if not path.exists():
        raise RecordsError(
            f"{folder} has no {MANIFEST}: the recording is incomplete or was interrupted; "
            f"rerun `specroute gen` with the same config to resume it"
        )
    try:
        values = json.loads(path.read_text())
    except ValueError as err:
        raise RecordsError(f"{path} is not valid JSON ({err}): the folder is damaged; {REPAIR}") from None
    version = values.get("schema_version") if isinstance(values, dict) else None
    if version != SCHEMA_VERSION:
        raise RecordsError(
            f"{folder} holds records of schema version {version}, this specroute reads version "
            f"{SCHEMA_VERSION}: re-record them with this version (`specroute gen --overwrite`)"
        )
    manifest = Manifest.from_dict(values, str(path))
    _check_shards_add_up(manifest, path)
    return manifest


def _check_shards_add_up(manifest: Manifest, path: Path) -> None:
    """Refuse a manifest whose shards skip one or miss its own totals (an entry removed by hand trained on fewer rows)."""
    for split, totals in manifest.splits.items():
        listed = [s for s in manifest.shards if s.get("split") == split]
        names = sorted(s.get("file", "") for s in listed)
        held = {k: sum(s.get(k, 0) for s in listed) for k in ("examples", "rows")}
        if names != [f"{split}-{i:05d}.arrow" for i in range(len(listed))] or held != totals:
            raise RecordsError(
                f"{path} does not add up for split {split!r}: it lists shards {names} holding {held}, but counts "
                f"{totals} (a shard's entry is missing or was edited): {REPAIR}"
            )


def require_hidden_states(folder: str | Path, manifest: Manifest, role: str) -> None:
    """Refuse a folder recorded without the hidden states a router reads: the drafter's/verifier's,
    or "after", the verifier's after reading the drafted token (judge inputs)."""
    if role == "after":
        return require_judge(folder, manifest)
    if manifest.hidden_states not in (role, "both"):
        raise RecordsError(
            f"{folder} has no {role} hidden states (recorded with hidden_states="
            f"{manifest.hidden_states}): re-record with hidden_states={role} or both"
        )


def require_judge(folder: str | Path, manifest: Manifest) -> None:
    """Refuse a folder recorded without the judge inputs (the verifier's view of the drafted tokens)."""
    if not manifest.judge:
        raise RecordsError(
            f"{folder} has no judge inputs (the verifier's state after the drafted token): "
            f"re-record it with judge=true (`specroute gen ... judge=true`)"
        )


def read_token_classes(folder: str | Path, manifest: Manifest) -> np.ndarray:
    """The token class table (V,) uint8 a folder was recorded with, checked against the manifest."""
    info, path = manifest.token_classes or {}, Path(folder) / TOKEN_CLASSES
    if not info or not path.exists() or file_sha256(path) != info.get("sha256"):
        raise RecordsError(
            f"{path} is missing or differs from {folder}'s manifest: rerun the same "
            f"`specroute gen` command with overwrite=true to re-record the folder"
        )
    return np.load(path)


def load_records(folder: str | Path, split: str | None = None, mode: str | None = None):
    """A `datasets.Dataset` over a record folder's shards (memory-mapped), optionally one split/mode."""
    datasets = import_datasets()  # inside a command its log lines go to the command's log

    manifest = read_manifest(folder)
    if split is not None and split not in SPLITS:
        raise RecordsError(f"unknown split {split!r}; use one of {SPLITS}")
    shards = [s for s in manifest.shards if split is None or s["split"] == split]
    if not shards:
        raise RecordsError(f"{folder} has no shards for split={split!r}")
    parts = [_checked_shard(Path(folder), s) for s in shards]
    ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    if mode is not None:
        # an index selection, not ds.filter: filter would write cache files into the record folder
        modes = np.asarray(ds.data.column("mode").to_numpy(zero_copy_only=False))
        ds = ds.select(np.nonzero(modes == mode)[0])
    return ds


_VERIFIED: dict = {}  # (path, size, mtime) -> sha256, so a process checks each shard file once


def shard_problem(folder: Path, shard: dict) -> str | None:
    """Why a shard file is not the one the manifest recorded (missing, another size, another
    checksum), or None; each file is hashed once per process while unchanged."""
    path = Path(folder) / shard["file"]
    if not path.exists():
        return "missing"
    stat = path.stat()
    if "bytes" in shard and stat.st_size != shard["bytes"]:
        return f"{stat.st_size} bytes, the manifest says {shard['bytes']}"
    if "sha256" in shard:
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in _VERIFIED:
            _VERIFIED[key] = file_sha256(path)
        if _VERIFIED[key] != shard["sha256"]:
            return "its checksum differs from the manifest's"
    return None


def _checked_shard(folder: Path, shard: dict):
    """A shard as a Dataset, after checking it is the one the manifest recorded (size, checksum, rows)."""
    datasets = import_datasets()  # inside a command its log lines go to the command's log

    path = folder / shard["file"]
    damaged = f"{path} is damaged ({{}}): its records cannot be trusted; {REPAIR}"
    problem = shard_problem(folder, shard)
    if problem:
        raise RecordsError(damaged.format(problem))
    try:
        ds = datasets.Dataset.from_file(str(path))
    except Exception as err:  # pyarrow raises several types for a cut or garbled stream
        raise RecordsError(damaged.format(f"unreadable: {err}")) from None
    if len(ds) != shard["rows"]:
        raise RecordsError(damaged.format(f"{len(ds)} rows, the manifest says {shard['rows']}"))
    return ds


def read_examples(folder: str | Path, split: str | None = None) -> list[dict]:
    """The examples a record folder was made from (`examples.jsonl`), optionally one split."""
    rows = _checked_jsonl(Path(folder), EXAMPLES)
    return [r for r in rows if split is None or r["split"] == split]


def read_heldout(folder: str | Path) -> list[dict]:
    """The task's further examples its split rule puts in test (`heldout.jsonl`, task order): online
    evaluation can run more prompts than were recorded, held out exactly as the recorded test ones."""
    return _checked_jsonl(Path(folder), HELDOUT)


REPAIR = "rerun the same `specroute gen` command: it checks every file of a finished folder and remakes a damaged one"


def side_file_problem(folder: Path, name: str, manifest: Manifest) -> str | None:
    """Why an examples file of a finished folder cannot be trusted (missing, or changed since the
    manifest recorded its checksum), or None."""
    path = folder / name
    if not path.exists():
        return "missing"
    if name in manifest.files and file_sha256(path) != manifest.files[name]:
        return "changed since it was recorded (its checksum differs from the manifest's)"
    return None


def _checked_jsonl(folder: Path, name: str) -> list[dict]:
    """An examples file, checked against the manifest, each line parsed (errors name the file)."""
    problem = side_file_problem(folder, name, read_manifest(folder))
    if problem:
        raise RecordsError(f"{folder / name} is {problem}: {REPAIR}")
    try:
        return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]
    except ValueError as err:
        raise RecordsError(f"{folder / name} holds a line that is not JSON ({err}): {REPAIR}") from None
