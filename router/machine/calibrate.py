"""Choosing gamma (drafts per block) from what the pair costs on this machine and how often drafts
are accepted.

The best block size differs between machines by several tokens: on a GPU a verifier pass over 9
tokens costs about as much as over 1, on a CPU in float32 it can cost 2.4x, and there a long block
of rejected drafts is pure loss. `calibrate_gamma` measures a drafter step and verifier passes over
1..max_gamma+1 tokens at a batch size (`router.machine.costs`) and, with an acceptance rate (eval and the
demo take it from the records: how often the verifier keeps the drafter's token), picks the gamma
with the lowest expected latency, or says that speculation does not pay on this machine. Eval and
the demo store the choice with their results (`gamma.json`).

`generate(..., gamma="auto")` uses `AdaptiveGamma`: the same costs (measured once per process, pair
and batch size) and the acceptance rate of the blocks decoded so far, re-choosing gamma each block;
where no gamma is expected to beat the verifier alone, it chooses 0: the loop then decodes with the
verifier alone (no drafts, so the acceptance estimate stops moving and it stays so for the call).
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass

from router.infra import clock
from router.machine.costs import _model_costs, choose_gamma, measure_verify_curve
from router.backends import backend_of
from router.loop.common import shared_vocab

MAX_GAMMA = 8
# AdaptiveGamma's prior on the acceptance rate before any block is decoded: 8 of 10 drafts accepted
# (a same-family pair agrees on ~0.75-0.9 of greedy tokens); the measured rate outweighs it within
# a few blocks.
PRIOR_ACCEPTED, PRIOR_DRAFTS = 8.0, 10.0


@dataclass
class GammaChoice:
    """A chosen gamma and what it was chosen from (seconds measured on `machine` in `dtype`)."""

    gamma: int
    acceptance: float
    drafter_step: float  # seconds of one drafter forward over 1 token per row
    verify_seconds: list  # seconds of a verifier forward over n tokens per row, n = 1..
    latency: dict  # gamma -> expected seconds per token / verifier step
    batch: int
    machine: str
    dtype: str
    seconds: float = 0.0  # what the calibration took

    @property
    def pays(self) -> bool:
        """Whether speculation is expected to beat the verifier alone here."""
        return self.latency[self.gamma] < 1.0

    def as_dict(self) -> dict:
        return {**asdict(self), "pays": self.pays}

    @classmethod
    def from_dict(cls, d: dict) -> "GammaChoice":
        d = {k: v for k, v in d.items() if k != "pays"}
        return cls(**{**d, "latency": {int(k): v for k, v in d["latency"].items()}})

    def summary(self) -> str:
        verdict = "speculation pays" if self.pays else "speculation does NOT pay here: decode with the verifier alone"
        return (
            f"gamma {self.gamma} (expected {self.latency[self.gamma]:.3f}x the verifier's time per token at "
            f"acceptance {self.acceptance:.3f}; drafter step {self.drafter_step * 1e3:.0f} ms, verifier pass "
            f"over 1 / {self.gamma + 1} tokens {self.verify_seconds[0] * 1e3:.0f} / "
            f"{self.verify_seconds[self.gamma] * 1e3:.0f} ms, batch {self.batch}, {self.machine}, "
            f"{self.dtype}): {verdict}"
        )


NOISE = 0.25  # a verifier pass over more tokens may be timed this much faster than one over fewer,
ABSOLUTE_NOISE = 0.002  # and 2 ms more (tiny models' passes take about as long as the timer's jitter)
ATTEMPTS = 3  # measurements of the costs before implausible ones are refused


def implausible_costs(drafter_step: float, verify: list[float]) -> str | None:
    """Why measured costs cannot be right, or None: a verifier pass over n tokens timed faster (beyond
    noise) than one over fewer (it does at least their work), or a time that is not positive."""
    if not drafter_step > 0 or not all(t > 0 for t in verify):
        return f"a time that is not positive (drafter step {drafter_step}, verifier passes {verify})"
    for n in range(1, len(verify)):
        slowest_before = max(verify[:n])
        if verify[n] < (1 - NOISE) * slowest_before - ABSOLUTE_NOISE:
            return (
                f"the verifier's pass over {n + 1} tokens took {verify[n] * 1e3:.1f} ms, less than "
                f"{1 - NOISE:.2f}x its pass over fewer tokens ({slowest_before * 1e3:.1f} ms)"
            )
    return None


def measure_costs(drafter, verifier, batch: int, max_gamma: int = MAX_GAMMA) -> tuple[float, list[float]]:
    """(drafter step seconds, [verifier pass seconds over n tokens per row, n = 1..max_gamma+1]),
    measured again when implausible (another job loading the machine), refused after ATTEMPTS."""
    import torch

    for attempt in range(ATTEMPTS):
        with torch.inference_mode():
            _, (drafter_step,) = _model_costs(drafter, shared_vocab(drafter, verifier), batch, (1,))
        verify = measure_verify_curve(verifier, batch, max_gamma + 1)
        problem = implausible_costs(drafter_step, verify)
        if problem is None:
            return drafter_step, verify
        print(f"[specroute] gamma calibration, attempt {attempt + 1}: implausible timings ({problem}); measuring again")
    raise ValueError(
        f"gamma: auto could not measure the pair's costs plausibly in {ATTEMPTS} attempts ({problem}): the machine "
        f"is probably loaded by another job; rerun when it is quiet, or give gamma as a number"
    )


def calibrate_gamma(
    drafter,
    verifier,
    batch: int,
    acceptance: float,
    max_gamma: int = MAX_GAMMA,
    bonus_drafter: bool = True,
    costs: tuple[float, list[float]] | None = None,
) -> GammaChoice:
    """Measure the pair's costs at this batch size (unless `costs` are given) and choose gamma for
    this acceptance rate (i.i.d. per draft). About 30 s for the 0.5B/1.5B pair on 2 CPU cores."""
    if not 0 <= acceptance <= 1:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    started = clock.now()
    drafter_step, verify = costs if costs is not None else _costs_once(drafter, verifier, batch, max_gamma)
    gamma, latency = choose_gamma(acceptance, drafter_step, verify, bonus_drafter)
    return GammaChoice(
        gamma, acceptance, drafter_step, list(verify), latency, batch, *machine_of(verifier), clock.now() - started
    )


def machine_of(model) -> tuple[str, str]:
    """(machine, dtype) a model runs on: the CPU kind or the GPU's name, and its parameters' dtype (a llama.cpp
    model: "gguf, N threads", since its speed depends on them)."""
    return backend_of(model).machine(model)


_COSTS: dict = {}  # (drafter id, verifier id, batch, max_gamma) -> (weakrefs to both, measured costs)


def _costs_once(drafter, verifier, batch: int, max_gamma: int) -> tuple[float, list[float]]:
    """The pair's costs at this batch size, measured the first time this process asks."""
    key = (id(drafter), id(verifier), batch, max_gamma)
    hit = _COSTS.get(key)
    if hit is None or hit[0]() is not drafter or hit[1]() is not verifier:  # ids are reused after collection
        remember_costs(drafter, verifier, batch, measure_costs(drafter, verifier, batch, max_gamma), max_gamma)
    return _COSTS[key][2]


def remember_costs(drafter, verifier, batch: int, costs: tuple[float, list[float]], max_gamma: int = MAX_GAMMA) -> None:
    """Use these measured costs (drafter step, verifier pass seconds) for this pair and batch size
    from now on in this process, e.g. a resumed run's, so that gamma="auto" decides as it did."""
    _COSTS[(id(drafter), id(verifier), batch, max_gamma)] = (
        weakref.ref(drafter),
        weakref.ref(verifier),
        (costs[0], list(costs[1])),
    )


class AdaptiveGamma:
    """gamma="auto" in generate: costs measured once per process, pair and batch size; acceptance
    estimated from the drafts the loop has evaluated so far (with a weak prior); gamma re-chosen
    before every block."""

    def __init__(self, drafter, verifier, batch: int, bonus_drafter: bool, max_gamma: int = MAX_GAMMA):
        self.drafter_step, self.verify = _costs_once(drafter, verifier, batch, max_gamma)
        self.bonus_drafter = bonus_drafter
        self.accepted, self.drafts = PRIOR_ACCEPTED, PRIOR_DRAFTS
        self.chosen: list[int] = []

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafts

    def next(self) -> int:
        """Drafts for the next block; 0 where speculation is not expected to pay (the verifier alone)."""
        gamma, latency = choose_gamma(self.acceptance, self.drafter_step, self.verify, self.bonus_drafter)
        if latency[gamma] >= 1.0:
            gamma = 0
        self.chosen.append(gamma)
        return gamma

    def chosen_counts(self) -> dict[int, int]:
        """Blocks decoded per gamma so far (0: tokens the verifier decoded alone)."""
        return {g: self.chosen.count(g) for g in sorted(set(self.chosen))}

    def update(self, accepted: int, evaluated: int) -> None:
        """After a block: drafts accepted and drafts the sampler evaluated, summed over rows."""
        self.accepted += accepted
        self.drafts += evaluated
