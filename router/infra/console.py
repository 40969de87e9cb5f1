"""What commands print: the summary table at the end of every command, the W&B offline notice."""

from __future__ import annotations

import os


def summary_table(rows: list[tuple[str, str]], title: str = "summary") -> str:
    """A two-column, left-aligned table under a title, for the end of every command."""
    width = max(len(k) for k, _ in rows)
    return f"{title}\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def wandb_offline() -> bool:
    """True (and says so) when W&B must run offline: no WANDB_API_KEY in the environment."""
    offline = not os.environ.get("WANDB_API_KEY")
    if offline:
        print("[specroute] no WANDB_API_KEY: W&B runs offline into wandb/ (upload later with `wandb sync`)")
    return offline
