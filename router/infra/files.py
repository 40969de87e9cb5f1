"""Atomic file writes: every file a command writes appears whole or not at all.

A crash, an interrupt or a full disk leaves the previous file (or none) in place, never half a
file: the data goes to a temporary file next to the target, is fsynced, then renamed over it.
Record shards, manifests, online points, reports, curves and router metrics all go through here.
`output_lock` keeps two commands from writing one output folder at once (router/infra/stage_folders.py:
which folders a command may write at all).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import io
import json
import os
from pathlib import Path

from router.infra.distributed import rank_suffix
from router.infra.stage_folders import LOCK_NAME, STAGE_MARK, STAGES, OutputBusy, claim_output


def atomic_write_bytes(path: Path, write) -> None:
    """Call write(file) on a temporary file next to `path`, fsync, then rename into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)  # a full disk leaves no partial file behind
        if err.filename in (None, str(tmp)):  # name the file being written, not our temporary or nothing
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)  # nor does an interrupt
        raise


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in 16 MB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write bytes atomically, creating the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, lambda f: f.write(data))


def write_json(path: str | Path, obj) -> None:
    """Write JSON atomically."""
    write_bytes(path, json.dumps(obj, indent=2, default=str).encode())


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically."""
    write_bytes(path, text.encode())


def write_csv(path: str | Path, fields: list[str], rows: list[dict]) -> None:
    """Write rows as CSV with these columns (other keys ignored), atomically."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())


def _made_folders(folder: Path) -> list[Path]:
    """The folders `mkdir(parents=True)` would create for `folder`, outermost first."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    return missing[::-1]


def _open_lock(folder: Path, command: str):
    """The folder's lock file, held exclusively; refused at once when another writer holds it. The lock is
    inside the folder and removed when the command ends: a later opener checks it still locks the file at
    that name (one removed under it would be a lock nobody else sees)."""
    path = folder / f"{LOCK_NAME}{rank_suffix()}"  # one per rank: a torchrun job's ranks write one folder together
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "specroute command"
            handle.close()
            raise OutputBusy(
                f"{folder} is being written by another {holder}: wait for it to finish, or choose another output folder"
            ) from None
        if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
            return path, handle
        handle.close()  # the previous holder removed it as we opened it: take the new one


@contextlib.contextmanager
def output_lock(folder: str | Path, command: str):
    """Hold an exclusive lock on an output folder while a command writes it; a second writer (another
    process, or another call in this one) is refused at once with who holds it. The folder is claimed first
    (router/infra/stage_folders.py: refused, creating nothing, when it is not this command's to write) and
    marked with the command; a run that fails in a folder it created, having written no more than its
    config, leaves no folder behind. The kernel drops the lock when the holder exits, even on SIGKILL."""
    folder = Path(folder)
    claim_output(folder, command)
    made = _made_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock_path, handle = _open_lock(folder, command)
    except OSError as err:  # read-only, no permission, a file in the way, a full disk
        _remove_made(made, command)
        raise OutputBusy(
            f"cannot write the output folder {folder} ({err.strerror or err}): choose another output"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"`specroute {command}` (pid {os.getpid()})")
        handle.flush()
        (folder / STAGE_MARK).write_text(command)
        yield folder
    except BaseException:
        _remove_made(made, command)
        raise
    finally:
        lock_path.unlink(missing_ok=True)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _remove_made(made: list[Path], command: str) -> None:
    """Remove the folders a refused run created, when they hold nothing but its mark, lock and config."""
    if not made:
        return
    config = STAGES[command].config if command in STAGES else None
    leftovers = {STAGE_MARK, config}
    folder = made[-1]
    if folder.is_dir() and all(p.name in leftovers or p.name.startswith(LOCK_NAME) for p in folder.iterdir()):
        for p in folder.iterdir():
            p.unlink(missing_ok=True)
        for path in reversed(made):
            try:
                path.rmdir()
            except OSError:
                break  # not empty: something else lives there now


class Journal:
    """An append-only JSON-lines file of finished work units, so a long job resumes where it stopped.

    The first line holds the job's fingerprint (what makes earlier units valid: settings, machine);
    each later line one finished unit, fsynced as it is written. A torn last line (a kill mid-write)
    is ignored; a journal with another fingerprint is moved aside to `<name>.stale.jsonl` (never
    mixed in) and the job starts over.
    """

    def __init__(self, path: str | Path, fingerprint: dict):
        self.path = Path(path)
        self.fingerprint = json.loads(json.dumps(fingerprint))  # as it reads back from JSON
        self.entries: list[dict] = []
        self.stale: Path | None = None
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        head = _json_or_none(lines[0]) if lines else None
        if lines and (head or {}).get("fingerprint") == self.fingerprint:
            self.entries = [e for e in map(_json_or_none, lines[1:]) if e is not None]
            if len(self.entries) < len(lines) - 1:  # drop a torn line, or the next append would extend it
                write_text(self.path, "".join(json.dumps(obj) + "\n" for obj in [head, *self.entries]))
            return
        if lines:
            self.stale = self.path.with_suffix(".stale.jsonl")
            os.replace(self.path, self.stale)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._append({"fingerprint": self.fingerprint})

    def append(self, entry: dict) -> None:
        """Record one finished unit (durable once this returns)."""
        self._append(entry)
        self.entries.append(json.loads(json.dumps(entry)))

    def _append(self, obj: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _json_or_none(line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
