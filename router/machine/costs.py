"""What the model pair costs on this machine, measured in a few seconds.

A speculative cascade pays off only where a drafter step and a verifier pass over a few tokens are
cheap relative to a verifier step, and those ratios differ between machines by several times (bf16
on AMX vs float32 on AVX2; compute-bound prefill vs memory-bound decoding). `measure_pair_costs`
times, with the real models and the real decoding code (`router.loop.layout.model_cache`, on either engine): a prefill
(seconds per prompt token, the cost of recording and of reading prompts), one drafter step, and
verifier passes over 1 and over gamma + 1 tokens, at a given batch size. The demo builds its time
estimate from them. `measure_verify_curve` times verifier passes over 1..n tokens, and
`choose_gamma` picks the block size with the lowest expected latency from those costs and an
acceptance rate (or says that speculation does not pay on this machine).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from router.loop.layout import CachedModel, Layout, model_cache, model_device
from router.loop.common import vocab_size

PROBE_CONTEXT = 64  # prompt tokens per row of the probe (the prefill timing and the steps' context)


@dataclass(frozen=True)
class PairCosts:
    """Measured seconds. prefill_*: per token of a batched prompt forward; *_step: one decoding forward
    of the whole batch over 1 token per row; verifier_block: over gamma + 1 tokens per row."""

    batch: int
    gamma: int
    drafter_prefill: float
    verifier_prefill: float
    drafter_step: float
    verifier_step: float
    verifier_block: float
    probe_seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def _sync(model) -> None:
    if model_device(model).type == "cuda":
        torch.cuda.synchronize()


def _timed_feed(cached: CachedModel, layout: Layout, n_new: int) -> float:
    """Seconds of one forward over n_new fresh columns per row, rolled back afterwards."""
    start_len = layout.length
    layout.append(torch.randint(3, cached.vocab, (layout.tokens.shape[0], n_new), device=layout.tokens.device))
    _sync(cached.model)
    started = time.perf_counter()
    cached.feed(layout, layout.length, 1)
    _sync(cached.model)
    seconds = time.perf_counter() - started
    cached.crop_to(start_len)
    layout.crop(n_new)
    return seconds


def _model_costs(model, vocab: int, batch: int, n_values: tuple[int, ...]) -> tuple[float, list[float]]:
    """(prefill seconds per token, [seconds of a decoding forward over n tokens per row for n in n_values])."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, PROBE_CONTEXT), generator=gen).to(model_device(model))
    layout, cached = Layout(ids, torch.ones_like(ids)), model_cache(model, vocab)
    head = Layout(ids[:, :8], torch.ones_like(ids[:, :8]))
    model_cache(model, vocab).feed(head, 8, 1)  # warm-up: touches every weight once (memory-mapped files page in)
    _sync(model)
    started = time.perf_counter()
    cached.feed(layout, layout.length, 1)
    _sync(model)
    prefill = (time.perf_counter() - started) / (batch * PROBE_CONTEXT)
    steps = []
    for n in n_values:
        _timed_feed(cached, layout, n)  # warm-up: the first call at a shape builds its kernels
        steps.append(min(_timed_feed(cached, layout, n) for _ in range(2)))
    return prefill, steps


@torch.inference_mode()
def measure_pair_costs(drafter, verifier, batch: int = 1, gamma: int = 5) -> PairCosts:
    """Time the pair's prefill, drafter step and verifier passes at this batch size (a few seconds;
    about 20 s for the 0.5B/1.5B pair in float32 on 2 AVX2 cores)."""
    vocab = min(vocab_size(m) for m in (drafter, verifier))
    started = time.perf_counter()
    d_prefill, (d_step,) = _model_costs(drafter, vocab, batch, (1,))
    v_prefill, (v_step, v_block) = _model_costs(verifier, vocab, batch, (1, gamma + 1))
    return PairCosts(batch, gamma, d_prefill, v_prefill, d_step, v_step, v_block, time.perf_counter() - started)


@torch.inference_mode()
def measure_verify_curve(verifier, batch: int = 1, max_tokens: int = 9) -> list[float]:
    """Seconds of one verifier decoding forward over n tokens per row, for n = 1..max_tokens (what a
    block of n - 1 drafts costs to verify; far from flat on a CPU, nearly flat on a GPU)."""
    return _model_costs(verifier, vocab_size(verifier), batch, tuple(range(1, max_tokens + 1)))[1]


def tokens_per_block(acceptance, gamma: int):
    """Expected tokens one block of `gamma` drafts emits when each draft is accepted i.i.d. with
    probability `acceptance` (Leviathan et al.): (1 - a^(g+1)) / (1 - a); numbers or numpy arrays."""
    a = np.clip(acceptance, 0.0, 1 - 1e-9)
    return (1 - a ** (gamma + 1)) / (1 - a)


def block_seconds(gamma: int, acceptance, drafter_step: float, verify_block: float, bonus_drafter: bool = True):
    """Expected seconds of one block: `gamma` drafter steps, one verifier pass over gamma + 1 tokens
    (`verify_block`) and, with `bonus_drafter`, one more drafter step when every draft is accepted (a^g)."""
    a = np.clip(acceptance, 0.0, 1 - 1e-9)
    return gamma * drafter_step + verify_block + (a**gamma * drafter_step if bonus_drafter else 0.0)


def block_latency(
    gamma: int, acceptance: float, drafter_step: float, verify_seconds: list[float], bonus_drafter: bool = True
) -> float:
    """Expected seconds per emitted token of blocks of `gamma` drafts, relative to a verifier step
    (verify_seconds[0]), for i.i.d. acceptance with probability `acceptance` (Leviathan et al.):
    tokens per block (1 - a^(g+1)) / (1 - a); cost gamma drafter steps + one verifier pass over
    gamma + 1 tokens + (bonus_drafter) one more drafter step when every draft is accepted (a^g)."""
    cost = block_seconds(gamma, acceptance, drafter_step, verify_seconds[gamma], bonus_drafter)
    return float(cost / tokens_per_block(acceptance, gamma) / verify_seconds[0])


def choose_gamma(
    acceptance: float, drafter_step: float, verify_seconds: list[float], bonus_drafter: bool = True
) -> tuple[int, dict[int, float]]:
    """The block size with the lowest expected relative latency over gamma = 1..len(verify_seconds)-1,
    and that latency for each gamma. A best value >= 1 means speculation does not pay on this
    machine at this acceptance rate (decode with the verifier alone)."""
    if len(verify_seconds) < 2:
        raise ValueError("verify_seconds needs the verifier pass over 1 and at least 2 tokens")
    latency = {
        g: block_latency(g, acceptance, drafter_step, verify_seconds, bonus_drafter)
        for g in range(1, len(verify_seconds))
    }
    return min(latency, key=latency.get), latency
