"""Output folders: which stage wrote one, and what a command may write, overwrite or remove there.

No command deletes or overwrites anything it did not write. Each output folder carries the stage that made
it (`.specroute-stage`) and each stage declares here, once, the names it writes at a folder's top (`STAGES`).
From those two facts:
- `claim_output`: an output folder is refused when it is a file, lies inside another stage's folder, was
  made by another stage, or holds anything specroute did not write (a checkout, a user's files, a parent of
  stage folders), each by name with what it holds, before anything is created;
- `clear_output`: what `--overwrite` (gen) and `--fresh` (demo) remove: only the stage's own entries, and
  only when the folder holds nothing else;
- `claim_output_file`: one file a command writes (generate --output, export-onnx --output): never a folder,
  never over a file a stage wrote, never over a file another command wrote;
- `output_lock` (router/infra/files.py): one writer per folder, its lock inside the folder, and a refused
  command leaves no folder behind.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


class OutputBusy(ValueError):
    """An output a command may not write: another stage's, a user's, or being written by another command."""


STAGE_MARK = ".specroute-stage"  # in each output folder: the command that made it
LOCK_NAME = ".specroute-lock"  # in each output folder while a command writes it (one per torchrun rank)
# specroute's own bookkeeping in any output folder: the mark, locks, atomic writes' temporaries
BOOKKEEPING = (STAGE_MARK, f"{LOCK_NAME}*", ".*.tmp-*", ".*.probe-*")


@dataclass(frozen=True)
class StageFiles:
    """What one stage writes at the top of its output folder."""

    config: str | None  # the file a run writes first (with the mark): a folder holding no more was only refused
    owned: tuple[str, ...]  # name patterns of its files and subfolders (a subfolder it names is wholly its own)
    holds_stages: tuple[str, ...] = ()  # subfolders whose entries are other stages' folders (the demo's)


STAGES = {
    "gen": StageFiles(
        "gen_config.json",
        (
            "gen_config.json",
            "manifest.json",
            "examples.jsonl",
            "heldout.jsonl",
            "token_classes.npy",
            "*.arrow",
            "*.arrow.json",
            "*.counts.json",
        ),
    ),
    "train": StageFiles(
        "train_config.json",
        (
            "train_config.json",
            "config.json",
            "model.safetensors",
            "golden.safetensors",
            "metrics.json",
            "tradeoff.csv",
            "folds.json",
            "README.md",  # the model card
            "custom_generate",
            "logs",
            "wandb",
            "checkpoints",
            "members",
            "fold-*",
            "*.onnx",  # export-onnx's graph and its check, beside the router they export
            "*.onnx.json",
        ),
    ),
    "eval": StageFiles(
        "eval_config.json",
        (
            "eval_config.json",
            "metrics.json",
            "report.md",
            "curves.csv",
            "online_per_prompt.csv",
            "gamma.json",
            "verifier_logprobs.jsonl",
            "*.png",
            "*.csv",
            "online",
            "crossfit",
        ),
    ),
    "demo": StageFiles(
        None, ("demo_summary.json", "*.json", "records", "routers", "eval"), ("records", "routers", "eval")
    ),
}
# a folder made before the mark existed (or with it deleted) is known by the files only its stage writes
LEGACY_FILES = {
    "gen": ("manifest.json", "gen_config.json"),
    "train": ("train_config.json", "model.safetensors"),
    "eval": ("eval_config.json",),
    "demo": ("demo_summary.json",),
}
# files one command writes alone (not into a stage folder), by what they end with
FILE_OUTPUTS = {"generate": (".json",), "export-onnx": (".onnx",), "prompts": (".jsonl",)}


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def stage_of(folder: Path) -> str | None:
    """The stage that made an output folder: its mark, else the files only that stage writes."""
    folder = Path(folder)
    mark = folder / STAGE_MARK
    if mark.is_file():
        return mark.read_text(errors="replace").strip() or None
    known = next((stage for stage, files in LEGACY_FILES.items() if any((folder / f).exists() for f in files)), None)
    return known or ("demo" if _unfinished_demo(folder) else None)


def _unfinished_demo(folder: Path) -> bool:
    """A demo folder made before demos were marked, cut short before its summary: stage folders under
    records/, routers/ and eval/ and nothing else."""
    if not folder.is_dir() or not any((folder / c).is_dir() for c in STAGES["demo"].holds_stages):
        return False
    return not _foreign(folder, "demo")


def _strict_stage(folder: Path) -> str | None:
    """The stage of a folder around an output: only its mark or a stage's config file counts there (a
    `manifest.json` in someone's project folder is not a recording)."""
    mark = folder / STAGE_MARK
    stage = mark.read_text(errors="replace").strip() if mark.is_file() else None
    return stage or next((s for s, f in STAGES.items() if f.config and (folder / f.config).is_file()), None)


def _stage_around(path: Path) -> tuple[Path, str] | None:
    """The nearest folder holding `path` (its parent or above) that a stage wrote; the demo's folder, which
    holds stage folders, does not count."""
    for parent in Path(os.path.normpath(Path(path).absolute())).parents:
        stage = _strict_stage(parent)
        if stage and stage != "demo":
            return parent, stage
    return None


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _foreign(folder: Path, stage: str) -> list[str]:
    """The entries of `folder` that `stage` did not write (its demo subfolders checked stage folder by stage
    folder), as paths relative to `folder`."""
    spec = STAGES[stage]
    foreign = []
    for entry in folder.iterdir():
        if _matches(entry.name, BOOKKEEPING):
            continue
        if not _matches(entry.name, spec.owned):
            foreign.append(entry.name)
        elif entry.name in spec.holds_stages and entry.is_dir():
            for child in entry.iterdir():
                inner = stage_of(child) if child.is_dir() else None
                if inner in STAGES and inner != "demo":
                    foreign += [f"{entry.name}/{child.name}/{n}" for n in _foreign(child, inner)]
                elif not _matches(child.name, BOOKKEEPING):
                    foreign.append(f"{entry.name}/{child.name}")
    return foreign


def claim_output(folder: str | Path, command: str) -> None:
    """Refuse an output folder `command` may not write, before anything is created: a file, a folder inside
    another stage's folder, another stage's folder, or a folder holding anything specroute did not write."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputBusy(f"output {folder} is a file: name a folder for `specroute {command}` to write into")
    inside = _stage_around(folder)
    if inside and inside[1] == command:
        return  # a part of this stage's own folder (a cross-fitting fold's router, an ensemble member)
    if inside:
        raise OutputBusy(
            f"output {folder} lies inside {inside[0]}, the output of `specroute {inside[1]}`: `specroute {command}` "
            f"writes only its own folder, never into another stage's; choose an output outside it"
        )
    if not folder.is_dir():
        return
    made_by = stage_of(folder)
    if made_by and made_by != command:
        raise OutputBusy(
            f"{folder} holds the output of `specroute {made_by}`: `specroute {command}` will not write into "
            f"another stage's folder (it would overwrite its files); choose another output"
        )
    if made_by is None:
        held = [p.name for p in folder.iterdir() if not _matches(p.name, BOOKKEEPING)]
        if held:
            raise OutputBusy(
                f"output {folder} is not a folder specroute wrote and is not empty (it holds {_listing(held)}): "
                f"`specroute {command}` writes only a new or empty folder, or one it made; choose another output"
            )


def clear_output(folder: str | Path, command: str) -> list[Path]:
    """Remove what `command` wrote in `folder` (--overwrite, --fresh), keeping its mark and lock; refused, by
    name with what it holds, when the folder is another stage's or holds anything else. Returns what went."""
    folder = Path(folder)
    if not folder.exists():
        return []
    claim_output(folder, command)
    if stage_of(folder) != command and any(not _matches(p.name, BOOKKEEPING) for p in folder.iterdir()):
        raise OutputBusy(f"{folder} was not written by `specroute {command}`: nothing removed; choose another output")
    foreign = _foreign(folder, command)
    if foreign:
        raise OutputBusy(
            f"{folder} holds what `specroute {command}` did not write ({_listing(foreign)}): nothing removed; "
            f"move those out of it, or choose another output"
        )
    removed = [p for p in folder.iterdir() if not _matches(p.name, BOOKKEEPING)]
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return removed


def claim_output_file(path: str | Path, command: str, flag: str = "--output") -> Path:
    """Refuse a file output `command` may not write: a folder, a file inside a stage's folder other than the
    names `command` writes there, or an existing file it did not write (`written_by` below)."""
    path = Path(path)
    suffixes = FILE_OUTPUTS[command]
    if path.is_dir():
        raise OutputBusy(f"{flag} {path} is a folder: name the file to write, e.g. {path / ('result' + suffixes[0])}")
    if not path.name.endswith(suffixes):
        raise OutputBusy(f"{flag} {path}: `specroute {command}` writes a {' or '.join(suffixes)} file; name one")
    inside = _stage_around(path)
    # export-onnx writes its graph beside the router it exports; nothing writes into a recording or an eval
    beside_router = command == "export-onnx" and inside == (path.parent.absolute(), "train")
    if inside and not beside_router:
        raise OutputBusy(
            f"{flag} {path} lies inside {inside[0]}, the output of `specroute {inside[1]}`: `specroute {command}` "
            f"does not write into another stage's folder; choose a path outside it"
        )
    if path.exists() and not written_by(path, command):
        raise OutputBusy(
            f"{flag} {path} exists and was not written by `specroute {command}`: it is left as it is; "
            f"choose another path (or move that file away)"
        )
    return path


def written_by(path: Path, command: str) -> bool:
    """Whether an existing file is one `command` wrote: generate's JSON says so; an ONNX graph has its check
    (`<name>.json`, written by export-onnx) beside it."""
    if command == "export-onnx":
        return path.with_name(path.name + ".json").is_file()
    if command == "prompts":  # examples-file form, every line
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return False
        return all(isinstance(r, dict) and {"example_id", "prompt"} <= r.keys() for r in rows)
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(written, dict):
        return False
    legacy = {"args", "tokens", "sources", "stats"} <= written.keys()  # generate's files before `written_by`
    return written.get("written_by") == f"specroute {command}" or (command == "generate" and legacy)
