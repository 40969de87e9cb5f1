"""The held-out examples eval decodes online: the records' test split, then the task's further
examples the split rule puts in test (`heldout.jsonl`), or a prompts file (`prompts=FILE`, written by
`specroute prompts`: every example the records did not record, so 300+ held-out GSM8K prompts exist
where the test split holds ~200). A prompts file is refused where any of its examples was in a split a
router or an alpha could have learned from (the records' or a router's train and validation splits)."""

from __future__ import annotations

import json
from pathlib import Path

from router.records import RecordsError, read_examples, read_heldout

EXAMPLE_FIELDS = ("example_id", "prompt", "reference", "meta")
LEARNED_FROM = ("train", "validation")  # the splits routers fit and alphas are matched on


def online_examples(cfg, routers: dict | None = None) -> list[dict]:
    """Held-out examples for online decoding (each with `recorded`: whether the records hold it): a
    prompts file when `cfg.prompts` is set, else the records' test split, then (unrecorded_prompts)
    the task's further examples the recording's split rule puts in test, up to max_prompts."""
    if cfg.prompts:
        return prompts_file_examples(cfg.prompts, seen_examples(cfg.records, routers or {}))
    examples = [{**e, "recorded": True} for e in read_examples(cfg.records[0], split="test")]
    if len(examples) < cfg.max_prompts and cfg.unrecorded_prompts:
        more = read_heldout(cfg.records[0])[: cfg.max_prompts - len(examples)]
        examples += [{**e, "recorded": False} for e in more]
    if not examples:
        raise RecordsError(f"{cfg.records[0]} has no test examples: record more examples")
    return examples


def seen_examples(records: list[str], routers: dict) -> dict[str, str]:
    """example id -> where a router or an alpha could have learned it: the train and validation splits of
    the records eval matches alphas on and of the records every router was trained on (where that folder
    is here), and the ids a cross-fitted router names."""
    folders, seen = [*records], {}
    for name, router in routers.items():
        trained = getattr(router.cfg, "trained_on", None) or {}
        folders += [f for f in trained.get("records", []) if (Path(f) / "examples.jsonl").exists()]
        for split in LEARNED_FROM:
            ids = trained.get("example_ids", {}).get(split)
            for i in ids if isinstance(ids, list) else []:
                seen.setdefault(i, f"router {name}'s {split} examples")
    for folder in dict.fromkeys(folders):
        for e in read_examples(folder):
            if e["split"] in LEARNED_FROM:
                seen.setdefault(e["example_id"], folder)
    return seen


def prompts_file_examples(path: str, seen: dict[str, str]) -> list[dict]:
    """A prompts file's examples (JSON lines, examples-file form), checked: readable, complete, and
    none of them seen in a split that routers or alphas learned from."""
    file = Path(path)
    if not file.exists():
        raise RecordsError(
            f"prompts file {path} does not exist: write one with `specroute prompts RECORD_FOLDER --output {path}`"
        )
    rows = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise RecordsError(f"{path} line {n} is not JSON ({err}): rewrite it with `specroute prompts`") from None
        missing = [k for k in EXAMPLE_FIELDS if not isinstance(row, dict) or k not in row]
        if missing:
            raise RecordsError(
                f"{path} line {n} lacks {', '.join(missing)}: each line needs {', '.join(EXAMPLE_FIELDS)}"
            )
        rows.append({**row, "recorded": False})
    if not rows:
        raise RecordsError(f"prompts file {path} holds no examples: write one with `specroute prompts`")
    leaked = [(r["example_id"], seen[r["example_id"]]) for r in rows if r["example_id"] in seen]
    if leaked:
        shown = ", ".join(f"{i} ({folder})" for i, folder in leaked[:5])
        raise RecordsError(
            f"{len(leaked)} of {path}'s prompts are in a train or validation split a router or an alpha learned "
            f"from: {shown}{' ...' if len(leaked) > 5 else ''}; write the file again with `specroute prompts` "
            f"naming those record folders"
        )
    return rows
