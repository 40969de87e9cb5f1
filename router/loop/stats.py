"""The speculative loop's counters (`Stats`), and how a block's time is split between the policy and the
drafter's bonus forward. `generate` returns them as the dict `GenerateOutput.stats` (router/loop/common.py
adds the derived rates); docs/usage.md lists the keys.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field

from router.infra import clock


@dataclass
class Stats:
    """What `router.decoding.generate` counts while it decodes, before the derived rates."""

    rule: str
    alpha: float
    gamma: int | str
    bonus_from: str
    draft_stop: float | None
    accepted_hist: list[int]  # [n] = row-blocks that kept n drafts
    method: str = "speculative"
    blocks: int = 0
    block_drafts: int = 0  # drafts per block summed (< gamma x blocks when draft_stop ends blocks early)
    drafts_evaluated: int = 0  # drafts the sampler looked at: the kept ones and the first rejected
    rejections: int = 0
    deferrals: int = 0  # evaluated drafts where pi differs from q (a judge: where it did not keep the draft)
    expected_rejections: float = 0.0  # summed rejection probabilities TV(q, pi) of the evaluated drafts
    rule_seconds: float = 0.0  # forming pi (and a lag policy's carry), without the bonus drafter forward
    bonus_drafter_seconds: float = 0.0  # the drafter's forwards at bonus positions
    verifier_steps: int = 0  # gamma auto: tokens decoded by the verifier alone, where speculation does not pay
    extra: dict = field(default_factory=dict)  # filled at the end: forward counts, gamma auto's choices

    @classmethod
    def start(cls, rule: str, alpha: float, opts, most_drafts: int) -> "Stats":
        return cls(rule, alpha, opts.gamma, opts.bonus_from, opts.draft_stop, [0] * (most_drafts + 1))

    @contextlib.contextmanager
    def policy_time(self, drafter):
        """Time the policy's work; a drafter forward inside it (the bonus position's q) counts apart."""
        started, before = clock.now(), drafter.seconds
        yield
        forward = drafter.seconds - before
        self.bonus_drafter_seconds += forward
        self.rule_seconds += clock.now() - started - forward

    def count_row(self, kept: int, g: int, rejection_probs: list[float], deferred: list[float]) -> None:
        """One row's block: `kept` of its g drafts accepted; the per-draft rejection probabilities and
        deferral flags (g each) of which the first min(kept + 1, g) were evaluated."""
        evaluated = min(kept + 1, g)
        self.accepted_hist[kept] += 1
        self.drafts_evaluated += evaluated
        self.rejections += int(kept < g)
        self.expected_rejections += sum(rejection_probs[:evaluated])
        self.deferrals += int(sum(deferred[:evaluated]))

    def as_dict(self) -> dict:
        counts = asdict(self)
        return {**counts, **counts.pop("extra")}
