"""`specroute prompts`: a file of held-out prompts for online evaluation, the task's examples that no
given record folder recorded (any split), in task order, examples-file form. A router trained on those
folders and alphas matched on them never saw these examples, so they are held out however many the
task has beyond the recording (a test split alone holds only its share of them)."""

from __future__ import annotations

from pathlib import Path

from data_gen.plan import jsonl_bytes, unrecorded_examples
from router.infra.files import write_bytes
from router.infra.stage_folders import claim_output_file
from router.records import RecordsError, read_examples, read_manifest


def unrecorded_prompts(folders: list[str], max_prompts: int | None = None) -> list[dict]:
    """The first `max_prompts` (all when None) examples of the folders' task that none of them recorded.
    The folders must be recordings of one task (their split rule and task settings are the first's)."""
    if not folders:
        raise ValueError("name at least one record folder: its task's unrecorded examples are the prompts")
    manifests = [read_manifest(f) for f in folders]
    tasks = sorted({m.task for m in manifests})
    if len(tasks) > 1:
        raise RecordsError(
            f"{', '.join(folders)} record different tasks ({', '.join(tasks)}): make one prompts file per task"
        )
    recorded = {e["example_id"] for folder in folders for e in read_examples(folder)}
    rows = unrecorded_examples(manifests[0].config, recorded)
    return rows if max_prompts is None else rows[:max_prompts]


def write_prompts(folders: list[str], output: str | Path, max_prompts: int | None = None) -> list[dict]:
    """Write `unrecorded_prompts` as JSON lines (atomically); returns the rows."""
    claim_output_file(output, "prompts")  # never over a recording's examples file or a user's file
    rows = unrecorded_prompts(folders, max_prompts)
    if not rows:
        raise RecordsError(f"{', '.join(folders)} recorded every example of the task: no prompt is left unrecorded")
    write_bytes(output, jsonl_bytes(rows))
    return rows
