"""The demo's expected time, priced on this machine before the work starts.

No figure here was measured on another machine: recording and decoding are priced with the pair's
costs measured here (`router.machine.costs.measure_pair_costs`: prefill per token, drafter step, verifier
passes at the demo's batch size, in the dtype the stages will use) times the exact token counts of
the examples the demo will record and the prompts it will decode. Training and offline scoring do
not run the language models and get small fixed allowances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.machine.costs import PairCosts, block_seconds, tokens_per_block

TRAIN_START_SECONDS = 5.0  # per router: Lightning set-up, loading records, final metrics, export
# per training row and epoch (features MLP/GRU, per-epoch validation areas); measured: 3 routers on
# 15,698 + 3,990 rows for 15-20 epochs took 21.6 s on 2 AMD EPYC cores
TRAIN_ROW_EPOCH_SECONDS = 3e-5
OFFLINE_SECONDS = 5.0  # per task: every method's offline curve on the held-out records
RECORD_OVERHEAD = 1.1  # statistics, features and writes on top of the two forwards (benchmarks/gen.py)
# judge inputs: substituted tokens per continuation token in the extra verifier pass (the argmax and
# the sample where each differs from the gold token; counts["judge_tree_tokens"] / tokens of a recording)
JUDGE_TREE_SHARE = 0.57  # measured: benchmarks/gen.py --judge, 8 GSM8K examples of the embedded pair
ACCEPTANCE = 0.83  # greedy: the 0.5B/1.5B pair keeps about 4 tokens per block of 5 drafts


@dataclass
class Estimate:
    """Expected seconds per stage (only the work not finished yet), and what they were priced with."""

    stages: dict
    costs: PairCosts
    machine: str
    dtype: str
    load_seconds: float
    alternatives: dict = field(default_factory=dict)  # engine -> its stages' seconds, where several were priced

    @property
    def total(self) -> float:
        return sum(self.stages.values())

    def as_dict(self) -> dict:
        return {
            "stages": self.stages,
            "total": self.total,
            "costs": self.costs.as_dict(),
            "machine": self.machine,
            "dtype": self.dtype,
            "load_seconds": self.load_seconds,
            "alternatives": self.alternatives,
        }

    def line(self) -> str:
        parts = ", ".join(f"{name} {seconds / 60:.0f}" for name, seconds in self.stages.items())
        others = "".join(
            f"; on {engine} alone {sum(stages.values()) / 60:.0f} min" for engine, stages in self.alternatives.items()
        )
        return (
            f"about {self.total / 60:.0f} min ({parts} min), priced on this machine ({self.machine}; models in "
            f"{self.dtype}; measured in {self.costs.probe_seconds + self.load_seconds:.0f} s{others})"
        )


def train_seconds(rows: int, epochs: int) -> float:
    """One router fitted on `rows` train + validation rows for at most `epochs` epochs."""
    return TRAIN_START_SECONDS + rows * epochs * TRAIN_ROW_EPOCH_SECONDS


def record_seconds(
    batches: list[tuple[str, str, list[tuple[int, int]]]], costs: PairCosts, rollout_tokens: int, judge: bool = False
) -> float:
    """One teacher-forced forward of each model per left-padded batch (+ the drafter's sampling
    steps in rollout mode, + the judge inputs' verifier pass), as `specroute gen` runs them."""
    seconds = 0.0
    for _, mode, lengths in batches:
        padded = len(lengths) * max(p + c for p, c in lengths)
        seconds += padded * (costs.drafter_prefill + costs.verifier_prefill) * RECORD_OVERHEAD
        if judge:
            seconds += sum(c for _, c in lengths) * JUDGE_TREE_SHARE * costs.verifier_prefill
        if mode == "rollout":
            seconds += rollout_tokens * costs.drafter_step
    return seconds


def speculative_seconds_per_step(costs: PairCosts) -> float:
    """Seconds per emitted token (per batch) of a speculative method: gamma drafter steps, one
    verifier pass over gamma + 1 tokens and sometimes the bonus drafter step, per block."""
    block = block_seconds(costs.gamma, ACCEPTANCE, costs.drafter_step, costs.verifier_block)
    return float(block / tokens_per_block(ACCEPTANCE, costs.gamma))


def online_seconds(
    prompt_lengths: list[int],
    batch: int,
    new_tokens: int,
    costs: PairCosts,
    speculative_methods: int,
    output_lengths: list[int] | None = None,
) -> float:
    """Verifier-only, drafter-only and the speculative methods on the same prompts, `batch` per
    call, plus the verifier's log-probability pass over the drafter's outputs. A batch runs as long as its
    longest row: `output_lengths` (expected tokens per prompt, e.g. its gold answer's length when
    stop strings end the rows there), else every row runs to `new_tokens` (an upper bound)."""
    per_step = costs.verifier_step + costs.drafter_step + speculative_methods * speculative_seconds_per_step(costs)
    prefill_per_token = (1 + speculative_methods) * (costs.verifier_prefill + costs.drafter_prefill)
    outputs = [min(n, new_tokens) for n in output_lengths] if output_lengths else [new_tokens] * len(prompt_lengths)
    seconds = 0.0
    for i in range(0, len(prompt_lengths), batch):
        rows, steps = prompt_lengths[i : i + batch], max(outputs[i : i + batch])
        seconds += len(rows) * max(rows) * prefill_per_token + steps * per_step
        # the log-probability pass over the drafter-only outputs (the other loops keep the verifier's own)
        seconds += sum(r + o for r, o in zip(rows, outputs[i : i + batch])) * costs.verifier_prefill
    return seconds


def served_online_seconds(
    prompt_lengths: list[int],
    batch: int,
    new_tokens: int,
    served: dict,
    speculative_methods: int,
    output_lengths: list[int],
    verifier_prefill: float,
) -> float:
    """online_seconds for an evaluation in vLLM: `served` holds seconds per decoding step of a batch, measured in
    vLLM (router.vllm.served.measure_served_costs: the verifier and the drafter alone, speculative decoding
    through the plugin, prefill included); the log-probability pass runs on torch (`verifier_prefill`)."""
    per_step = served["verifier"] + served["drafter"] + speculative_methods * served["speculative"]
    outputs = [min(n, new_tokens) for n in output_lengths]
    seconds = 0.0
    for i in range(0, len(prompt_lengths), batch):
        rows = prompt_lengths[i : i + batch]
        seconds += max(outputs[i : i + batch]) * per_step
        seconds += sum(r + o for r, o in zip(rows, outputs[i : i + batch])) * verifier_prefill
    return seconds
