"""Accepted, rejected and deferred drafts per request and in total, as the plugin decided them.

vLLM's own spec-decode metrics (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens`; `LLM.get_metrics()` or the server's /metrics) count drafts and acceptances;
these add what only the policy knows (deferrals) and break them down per request. The engine keeps the
counts in memory and rewrites SPECROUTE_STATS (atomically) at most every `every_s` seconds and at exit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from router.infra.files import write_json

FIELDS = ("steps", "drafts", "accepted", "rejected", "deferred", "evaluated")


@dataclass
class Counts:
    """Running totals, per request id and over all requests."""

    path: Path | None = None
    every_s: float = 1.0
    policy: str = ""
    alpha: float = 0.0
    total: dict = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    requests: dict = field(default_factory=dict)
    _written: float = 0.0

    def add(
        self,
        request_ids: list[str],
        n_drafts: list[int],
        accepted: list[int],
        deferred: list[int],
        evaluated: list[int],
    ):
        """One verification step's counts; request_ids[i] made n_drafts[i] drafts and kept accepted[i]."""
        for rid, made, kept, deferred_i, evaluated_i in zip(request_ids, n_drafts, accepted, deferred, evaluated):
            if made == 0:
                continue
            row = self.requests.setdefault(rid, dict.fromkeys(FIELDS, 0))
            for counts in (row, self.total):
                counts["steps"] += 1
                counts["drafts"] += made
                counts["accepted"] += kept
                counts["rejected"] += int(kept < made)
                counts["deferred"] += deferred_i
                counts["evaluated"] += evaluated_i
        if self.path is not None and time.monotonic() - self._written >= self.every_s:
            self.write()

    def as_dict(self) -> dict:
        t = self.total
        rates = {
            "acceptance_rate": t["accepted"] / t["drafts"] if t["drafts"] else None,
            "deferral_rate": t["deferred"] / t["evaluated"] if t["evaluated"] else None,
        }
        return {"policy": self.policy, "alpha": self.alpha, "total": {**t, **rates}, "requests": self.requests}

    def write(self) -> None:
        """Rewrite the counts file whole (a reader never sees half of it)."""
        if self.path is not None:
            write_json(self.path, self.as_dict())
            self._written = time.monotonic()


def read_counts(path: str | Path) -> dict:
    """The counts a plugin run wrote (SPECROUTE_STATS)."""
    return json.loads(Path(path).read_text())
