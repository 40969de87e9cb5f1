"""Small shared helpers for what commands print and write: summary tables, atomic JSON/CSV/text."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from router.records import atomic_write_bytes


def summary_table(rows: list[tuple[str, str]], title: str = "summary") -> str:
    """A two-column, left-aligned table under a title, for the end of every command."""
    width = max(len(k) for k, _ in rows)
    return f"{title}\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def write_json(path: str | Path, obj) -> None:
    """Write JSON atomically (temporary file + rename): a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj, indent=2, default=str).encode()
    atomic_write_bytes(path, lambda f: f.write(data))


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (temporary file + rename)."""
    data = text.encode()
    atomic_write_bytes(Path(path), lambda f: f.write(data))


def write_csv(path: str | Path, fields: list[str], rows: list[dict]) -> None:
    """Write rows as CSV with these columns (other keys ignored), atomically."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())


def wandb_offline() -> bool:
    """True (and says so) when W&B must run offline: no WANDB_API_KEY in the environment."""
    offline = not os.environ.get("WANDB_API_KEY")
    if offline:
        print("[specroute] no WANDB_API_KEY: W&B runs offline into wandb/ (upload later with `wandb sync`)")
    return offline
