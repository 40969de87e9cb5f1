"""What a recording holds, decided before any model runs: the task's examples, each one's split
(a seeded hash of its id), the shards they are grouped into, the batches the models will see, and
the examples files eval reads back (examples.jsonl, heldout.jsonl).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from data_gen.config import GenConfig
from data_gen.tasks import Example, load_task
from router.infra.files import write_bytes
from router.records import EXAMPLES, HELDOUT, SPLITS, RecordsError

Shard = tuple  # (file name, split, examples)


def assign_split(example_id: str, seed: int, fractions) -> str:
    """Deterministic split of an example by a seeded hash of its id."""
    digest = hashlib.sha256(f"split:{seed}:{example_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "little") / 2**64
    edges = np.cumsum(fractions)
    return SPLITS[min(int(np.searchsorted(edges, u, side="right")), 2)]


def plan_shards(
    examples: list[Example], cfg: GenConfig, recorded: dict[str, list[list[str]]] | None = None
) -> list[tuple[str, str, list[Example]]]:
    """(file name, split, examples) per shard: grouped by split, in task order. recorded (from
    `recorded_shards`): per split, the example ids of the shards a folder already holds, in file order;
    those that still lead their split are planned as they are (a grown recording keeps its short last
    shards: their examples are not labelled again), and the split's other examples follow in new shards."""
    by_split = {s: [] for s in SPLITS}
    for ex in examples:
        by_split[assign_split(ex.example_id, cfg.seed, cfg.split_fractions)].append(ex)
    plan = []
    for split, items in by_split.items():
        index, start = 0, 0
        for ids in (recorded or {}).get(split, []):
            if not ids or [ex.example_id for ex in items[start : start + len(ids)]] != ids:
                break  # a shard the new plan does not begin with: it and those after it are replanned
            plan.append((_shard_name(split, index), split, items[start : start + len(ids)]))
            index, start = index + 1, start + len(ids)
        for i in range(start, len(items), cfg.examples_per_shard):
            plan.append((_shard_name(split, index), split, items[i : i + cfg.examples_per_shard]))
            index += 1
    return plan


def _shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.arrow"


def recorded_shards(out: Path) -> dict[str, list[list[str]]]:
    """Per split, the example ids of a folder's shards from the first on (file order, up to the first
    without a readable receipt), as their receipts name them. Only the receipts are read: whether a shard's
    file is intact is checked where it is recorded (`intact_shard` in run_gen, which records a damaged
    one again with the same examples)."""
    found = {}
    for split in SPLITS:
        found[split] = []
        while (receipt := out / f"{_shard_name(split, len(found[split]))}.json").exists():
            try:
                ids = json.loads(receipt.read_text()).get("examples")
            except ValueError:
                break
            if not ids:
                break
            found[split].append(ids)
    return found


def load_examples(cfg: GenConfig) -> list[Example]:
    user = (
        dict(
            path=cfg.data_path,
            prompt_field=cfg.prompt_field,
            reference_field=cfg.reference_field,
            id_field=cfg.id_field,
        )
        if cfg.task == "custom"
        else {}
    )
    examples, seen = [], set()
    for ex in load_task(cfg.task, **user):
        if cfg.max_examples is not None and len(examples) >= cfg.max_examples:
            break
        if ex.example_id in seen:
            raise RecordsError(
                f"duplicate example id {ex.example_id!r} in task {cfg.task}: ids must be unique "
                f"(set id_field to a unique column)"
            )
        seen.add(ex.example_id)
        examples.append(ex)
    if not examples:
        raise RecordsError(f"task {cfg.task} yielded no examples")
    if not any(ex.prompt.strip() or ex.question.strip() for ex in examples):
        raise RecordsError(
            f"every prompt of task {cfg.task} is blank ({len(examples)} examples"
            f"{f' from {cfg.data_path}' if cfg.data_path else ''}): check prompt_field ({cfg.prompt_field!r})"
        )
    return examples


def planned_batches(cfg: GenConfig, recorder) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """What `run_gen` will feed the models, without running them: (split, mode, [(prompt tokens
    after the shared prefix, continuation tokens) per example]) per batch, in recording order
    (rollout continuations counted at their maximum length). For time estimates; skipped examples
    are left out as run_gen does."""
    out = []
    examples = load_examples(cfg)
    recorder.share_prefix(examples)
    shared = len(recorder.prefix) if recorder.prefix is not None else 0  # prefilled once, not per batch
    for _, split, shard_examples in plan_shards(examples, cfg, recorded_shards(Path(cfg.output))):
        for i in range(0, len(shard_examples), cfg.batch_size):
            for mode in cfg.modes:
                prepared = [recorder.prepare(ex, mode) for ex in shard_examples[i : i + cfg.batch_size]]
                lengths = [
                    (
                        len(p) - shared if shared and p[:shared] == recorder.prefix.ids else len(p),
                        len(c)
                        if c is not None
                        else cfg.rollout_max_new_tokens
                        if mode == "rollout"
                        else cfg.consequence_max_new_tokens,
                    )
                    for p, c in filter(None, prepared)
                ]
                if lengths:
                    out.append((split, mode, lengths))
    return out


def write_examples(out: Path, plan, cfg: GenConfig) -> None:
    """examples.jsonl: every planned example with its split, prompt, reference and metric fields, and
    heldout.jsonl: the task's other examples that the split rule puts in test, so eval can run
    held-out prompts and score them without importing data_gen (stages meet on disk)."""
    rows = [example_row(ex, split) for _, split, shard_examples in plan for ex in shard_examples]
    recorded = {r["example_id"] for r in rows}
    write_bytes(out / EXAMPLES, jsonl_bytes(rows))
    write_bytes(out / HELDOUT, jsonl_bytes(unrecorded_test_examples(vars(cfg), recorded)))


def jsonl_bytes(rows: list[dict]) -> bytes:
    """Rows as JSON lines (what the examples files and `specroute prompts` files hold)."""
    return "".join(json.dumps(r, default=str) + "\n" for r in rows).encode()


def example_row(ex: Example, split: str) -> dict:
    """An example in the examples-file form (what eval reads back)."""
    return {
        "example_id": ex.example_id,
        "split": split,
        "prompt": ex.prompt,
        "question": ex.question,
        "reference": ex.reference,
        "meta": ex.meta,
    }


def unrecorded_test_examples(config: dict, recorded: set) -> list[dict]:
    """The examples of a recording's task beyond the ones it recorded that its split rule (seeded
    hash of the id) puts in the test split: held out exactly as its test examples are. In task
    order, examples-file form."""
    return unrecorded_examples(config, recorded, splits=("test",))


def unrecorded_examples(config: dict, recorded: set, splits=SPLITS) -> list[dict]:
    """The examples of a recording's task it did not record whose split (the seeded hash of the id)
    is one of `splits`, in task order, examples-file form with that split: no router trained on the
    recording and no alpha matched on it has seen them (`specroute prompts`)."""
    user = (
        dict(
            path=config["data_path"],
            prompt_field=config["prompt_field"],
            reference_field=config["reference_field"],
            id_field=config["id_field"],
        )
        if config["task"] == "custom"
        else {}
    )
    rows = []
    for ex in load_task(config["task"], **user):
        split = assign_split(ex.example_id, config["seed"], config["split_fractions"])
        if ex.example_id not in recorded and split in splits:
            rows.append(json.loads(json.dumps(example_row(ex, split), default=str)))
    return rows
