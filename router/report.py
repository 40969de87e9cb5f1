"""Small shared helpers for what commands print and write: summary tables and atomic JSON."""

from __future__ import annotations

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


def wandb_offline() -> bool:
    """True (and says so) when W&B must run offline: no WANDB_API_KEY in the environment."""
    offline = not os.environ.get("WANDB_API_KEY")
    if offline:
        print("[specroute] no WANDB_API_KEY: W&B runs offline into wandb/ (upload later with `wandb sync`)")
    return offline
