"""Answer-level labels kept apart from the records they came from, and replayed into a new recording.

The answer search is the expensive part of a consequence recording (about 60 GSM8K examples an hour
on 2 CPU cores for full-answer labels); the record rows around it (both models' teacher-forced
distributions, judge and window inputs) take a small part of that. A label file
(`specroute labels export`) holds per searched example the answer the search ended on and what it
found at each mismatch along it, a few kilobytes per example, so labels can move between machines,
live under version control, and be reused when a folder is recorded again with other inputs (window
inputs, hidden states) or grown: `gen` with `labels_from: FILE` teacher-forces the stored answers
instead of searching them again, and searches only the examples the file does not have.

A stored label is used only where the new recording's drafter argmax at its position is the token the
search substituted there: the same pair in another dtype, or on another CPU, may round differently,
and a label belongs to one substitution. Elsewhere the position is what the new pass says (agreement,
or an untested mismatch), counted as `replayed_labels_dropped`. Stored short-horizon scores are kept
the same way; a mismatch the file has no score for is scored afresh.
"""

from __future__ import annotations

import warnings

import gzip
import json
from pathlib import Path

import numpy as np

from data_gen.consequence import Searched, consequence_columns
from router.infra.config import ConfigError
from router.infra.files import write_bytes
from router.labels import HARMLESS, IMPORTANT
from router.records import RecordsError, load_records, read_manifest

FORMAT = "specroute-labels/1"
# the settings a search's result depends on: replaying labels under other ones would mix definitions
LABEL_FIELDS = (
    "task",
    "data_path",
    "prompt_field",
    "id_field",
    "chat",
    "max_prompt_tokens",
    "long_prompts",
    "consequence_max_new_tokens",
    "consequence_max_mismatches",
    "consequence_horizon",
    "consequence_rejoin",
    "metric",
    "stop",
)
TESTED = (HARMLESS, IMPORTANT)
_EXPORTED = (  # the record columns a label file is made of
    "example_id",
    "position",
    "token",
    "q_argmax",
    "consequence",
    "branch_correct",
    "branch_answer",
    "answer_correct",
    "horizon_score",
)


def export_labels(folder: str | Path, path: str | Path, add_only: bool = False) -> dict:
    """Write the consequence labels of a finished record folder to `path` (gzip JSON lines: a header,
    then one line per searched example), merged with what a label file already at `path` holds beyond
    the folder; returns the header. `add_only`: the file's entries stay exactly as they are (its order
    too) and only the folder's examples it does not hold are appended, counted in the header's `added`
    (grow a committed file with new problems without re-deriving the old ones from a replay)."""
    manifest = read_manifest(folder)
    if "consequence" not in manifest.modes:
        raise RecordsError(f"{folder} has no consequence rows (modes {manifest.modes}): nothing to export")
    ds = load_records(folder, mode="consequence")
    cols = {name: np.asarray(ds[name]) for name in _EXPORTED if name in ds.column_names}
    entries = [_entry(cols, rows) for rows in _rows_by_example(cols["example_id"])]
    config = {k: manifest.config.get(k) for k in LABEL_FIELDS}
    entries, carried = _merge_with_file(Path(path), entries, config, manifest.pair, add_only)
    header = {
        "format": FORMAT,
        "source": str(folder),
        "manifest": manifest.id,
        "pair": manifest.pair,
        "dtype": manifest.dtype.get("dtype"),
        "config": config,
        "carried": carried,
        **({"added": len(entries) - carried["examples"]} if add_only else {}),
        **label_counts(entries),
    }
    lines = [json.dumps(header)] + [json.dumps(e) for e in entries]
    data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)  # mtime 0: one file per content
    write_bytes(Path(path), data)
    return header


def label_counts(entries) -> dict:
    """What a label file's header counts: its examples, tested mismatches and the important ones among them."""
    entries = list(entries)
    return {
        "examples": len(entries),
        "tested": sum(len(e.get("tested", [])) for e in entries),
        "important": sum(sum(t[1] == IMPORTANT for t in e.get("tested", [])) for e in entries),
    }


def _merge_with_file(
    path: Path, entries: list[dict], config: dict, pair, add_only: bool = False
) -> tuple[list[dict], dict]:
    """The folder's entries plus what an existing label file at `path` knows beyond them, so an export
    never loses labels: its examples the folder does not hold (a folder recorded again with fewer
    examples), and, for an example whose answer is unchanged, its labels the folder dropped (a replay on
    another CPU or dtype whose drafter argmax differs there keeps no label at that position; the label
    still belongs to its substitution, and a replay where the argmax matches again uses it). `add_only`: every
    entry of the file as it is, then the folder's examples the file does not hold."""
    carried = {"examples": 0, "tested": 0, "horizon": 0}
    if not path.exists():
        return entries, carried
    old = LabelStore(path)
    same = json.dumps(old.header.get("config"), sort_keys=True) == json.dumps(config, sort_keys=True)
    if not same or json.dumps(old.header.get("pair"), sort_keys=True) != json.dumps(pair, sort_keys=True):
        raise ConfigError(
            f"{path} holds labels searched with other settings or another pair: export to another file, or "
            f"remove it to replace its labels"
        )
    if add_only:
        new = [e for e in entries if e["example_id"] not in old.entries]
        return list(old.entries.values()) + new, {**carried, "examples": len(old.entries)}
    mine = {e["example_id"] for e in entries}
    for e in entries:
        before = old.entries.get(e["example_id"])
        if before is None or before["tokens"] != e["tokens"]:
            continue  # another answer: its labels belong to other positions
        for key in ("tested", "horizon"):
            if key in before or key in e:
                e[key], n = _union_by_position(e.get(key, []), before.get(key, []))
                carried[key] += n
    extra = [e for example_id, e in old.entries.items() if example_id not in mine]
    carried["examples"] = len(extra)
    return entries + extra, carried


def _union_by_position(new: list[list], old: list[list]) -> tuple[list[list], int]:
    """`new`'s [position, ...] items plus `old`'s at positions `new` lacks, by position; and how many
    came from `old`."""
    have = {item[0] for item in new}
    extra = [item for item in old if item[0] not in have]
    return sorted(new + extra, key=lambda item: item[0]), len(extra)


def _rows_by_example(ids: np.ndarray) -> list[np.ndarray]:
    """Row indices of each example, in first-seen order."""
    order, first = np.unique(ids, return_index=True)
    return [np.nonzero(ids == order[i])[0] for i in np.argsort(first)]


def _entry(cols: dict, rows: np.ndarray) -> dict:
    """One example's line: its answer, and every mismatch as [position, label, the substituted
    token, branch correct, branch answer] (tested) or its short-horizon score (any mismatch)."""
    rows = rows[np.argsort(cols["position"][rows])]
    label = cols["consequence"][rows]
    entry = {
        "example_id": str(cols["example_id"][rows[0]]),
        "tokens": cols["token"][rows].astype(int).tolist(),
        "answer_correct": int(cols["answer_correct"][rows[0]]),
        "tested": [
            [
                int(t),
                int(label[t]),
                int(cols["q_argmax"][rows[t]]),
                int(cols["branch_correct"][rows[t]]),
                str(cols["branch_answer"][rows[t]]),
            ]
            for t in np.nonzero(np.isin(label, TESTED))[0]
        ],  # fmt: skip
    }
    if "horizon_score" in cols:
        score = cols["horizon_score"][rows]
        entry["horizon"] = [
            [int(t), int(cols["q_argmax"][rows[t]]), float(score[t])] for t in np.nonzero(np.isfinite(score))[0]
        ]
    return entry


class LabelStore:
    """A label file read back: its header and its examples by id."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(f"label file {self.path} does not exist: name a file of `specroute labels export`")
        try:  # EOFError: a gzip stream cut short
            lines = gzip.decompress(self.path.read_bytes()).decode().splitlines()
            self.header = json.loads(lines[0])
            self.entries = {e["example_id"]: e for e in map(json.loads, lines[1:])}
        except (OSError, EOFError, ValueError, IndexError, KeyError, TypeError) as err:
            raise ConfigError(
                f"label file {self.path} is not readable ({type(err).__name__}: {err}; cut short or damaged): "
                f"export it again (`specroute labels export FOLDER {self.path}`) or restore it"
            ) from None
        if not isinstance(self.header, dict) or self.header.get("format") != FORMAT:
            found = self.header.get("format") if isinstance(self.header, dict) else None
            raise ConfigError(f"label file {self.path} has format {found!r}, not {FORMAT!r}: export it again")
        self._check_header_counts()

    def _check_header_counts(self) -> None:
        """The header's counts must be what the file holds: a file cut after a line boundary still parses."""
        held = label_counts(self.entries.values())
        wrong = [
            f"{k} {self.header.get(k)} in its header, {v} in the file"
            for k, v in held.items()
            if self.header.get(k) != v
        ]
        if wrong:
            raise ConfigError(
                f"label file {self.path} does not hold what its header says ({'; '.join(wrong)}): it was cut short "
                f"or edited; export it again (`specroute labels export FOLDER {self.path}`) or restore it"
            )

    def check(self, cfg, pair, other_engine_ok: bool = False) -> None:
        """Refuse labels made under other label settings, or with another model pair. `other_engine_ok`: this run
        is llama.cpp on the GGUF files the label file's torch models were converted from (router.pair.same_files),
        whose weights are the same under other fingerprints."""
        from router.pair import check_pair_is

        mine = {k: getattr(cfg, k) for k in LABEL_FIELDS}
        differ = [k for k in LABEL_FIELDS if self.header["config"].get(k) != mine[k]]
        if differ:
            found = ", ".join(f"{k}: {self.header['config'].get(k)!r} there, {mine[k]!r} here" for k in differ)
            raise ConfigError(
                f"labels_from: {self.path} was searched with other label settings ({found}): use the same "
                f"settings, or drop labels_from to search afresh"
            )
        recorded = self.header["pair"]
        if other_engine_ok and self.header.get("dtype") != "gguf":  # searched on torch, replayed on llama.cpp
            warnings.warn(
                f"labels_from {self.path} was searched on torch ({self.header.get('dtype')}) from the GGUF files this "
                f"llama.cpp run loads: the same weights, run by another engine; its answers are replayed as stored"
            )
            recorded = {"tokenizer": recorded.get("tokenizer")}
        try:
            check_pair_is(pair, recorded, f"labels_from {self.path}")
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def searched(self, example_id: str) -> Searched | None:
        """The stored search of one example, as the search would have returned it, or None."""
        e = self.entries.get(example_id)
        if e is None:
            return None
        tested = substitutions(e)
        return Searched(
            tokens=list(e["tokens"]),
            correct=e["answer_correct"],
            answer="",
            labels={t: kind for t, kind, *_ in tested},
            branches={t: (answer, correct) for t, _, _, correct, answer in tested},
            substituted={t: sub for t, _, sub, *_ in tested},
        )

    def columns(self, example_id: str, q_argmax: np.ndarray, counts: dict) -> dict:
        """The consequence columns of a replayed example, keeping each stored label only where this
        recording's drafter argmax is the token that was substituted (counted in `counts`)."""
        e = self.entries[example_id]
        s = self.searched(example_id)
        dropped = {}  # a label belongs to its substitution: consequence_columns keeps it only where this pass drafts it
        cols = consequence_columns(s, q_argmax, dropped)
        kept = len(s.labels) - dropped.get("consequence_labels_dropped", 0)
        counts["replayed_examples"] = counts.get("replayed_examples", 0) + 1
        counts["replayed_labels"] = counts.get("replayed_labels", 0) + kept
        counts["replayed_labels_dropped"] = counts.get("replayed_labels_dropped", 0) + len(e["tested"]) - kept
        return cols

    def horizon(self, example_id: str, q_argmax: np.ndarray) -> dict[int, float]:
        """Stored short-horizon scores by position, where this recording substitutes the same token."""
        found = self.entries[example_id].get("horizon", [])
        return {t: s for t, sub, s in found if t < len(q_argmax) and int(q_argmax[t]) == sub}


def substitutions(entry: dict) -> list[list]:
    """An example's tested mismatches [position, label, substituted token, branch correct, branch answer],
    each with the token its branch really substituted. Label files exported before records checked it
    store the recording's drafter argmax there, which a near-tie may have rounded to another token than
    the search's: at a harmless mismatch the answer goes on with the substituted token (the search keeps
    it), so that token is read from the answer; an important one whose stored token is the answer's own
    (no substitution at all) is left out."""
    tokens, out = entry["tokens"], []
    for t, kind, sub, *rest in entry.get("tested", []):
        if kind == HARMLESS:
            out.append([t, kind, int(tokens[t]), *rest])
        elif sub != tokens[t]:
            out.append([t, kind, sub, *rest])
    return out


def describe(header: dict) -> str:
    """One line about a label file's contents."""
    tested = header["tested"]
    share = header["important"] / tested if tested else float("nan")
    return (
        f"{header['examples']} examples, {tested} tested mismatches ({header['important']} important, "
        f"{share:.3f}), task {header['config'].get('task')}, pair {header['pair']}, dtype {header['dtype']}"
    )
