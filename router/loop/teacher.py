"""Teacher-forced forward passes over (prompt, continuation) batches: the one setup that recording
(data_gen.scoring) and evaluation (eval's log-probability pass) both use, so both read the same
logits for the same tokens. A shared prompt prefix (router.loop.prefix) is read from its cache.
"""

from __future__ import annotations

import torch

from router.loop.layout import Layout, left_pad, model_device
from router.backends import backend_of
from router.loop.prefix import SharedPrefix, start_layout


def forward_tail(
    model, layout: Layout, keep: int, vocab: int, hidden: bool, cache: bool = False, prefix: SharedPrefix | None = None
):
    """Logits (B, keep, V) of the last `keep` columns, their last hidden states if asked, and the
    KV cache of every column if asked (else None). With a shared prefix, the layout's first
    len(prefix) columns come from its cache and only the rest is fed. The model's backend does it
    (router/backends/): an engine's own cache object is the returned cache there."""
    return backend_of(model).forward_tail(model, layout, keep, vocab, hidden, cache, prefix)


def tail_layout(
    prompts: list[list[int]], continuations: list[list[int]], pad_id: int, device, prefix: SharedPrefix | None = None
) -> tuple[Layout, SharedPrefix | None, int]:
    """The left-padded [prompt + continuation] layout of a batch, the shared prefix it starts from
    (when every prompt has it and a token of its own after it, else None) and `keep`, the number of
    last columns whose logits predict the continuations (the logit before the first one too)."""
    ids, mask = left_pad([p + c for p, c in zip(prompts, continuations)], pad_id)
    if prefix is not None and not prefix.covers(prompts):
        prefix = None
    layout, prefix = start_layout(ids.to(device), mask.to(device), prefix, pad_id)
    return layout, prefix, max(len(c) for c in continuations) + 1


def continuation_logprobs(
    model,
    prompts: list[list[int]],
    continuations: list[list[int]],
    vocab: int,
    pad_id: int,
    prefix: SharedPrefix | None = None,
) -> list[float]:
    """The model's summed log-probability of each (non-empty) continuation after its prompt, one
    teacher-forced forward over the batch."""
    layout, prefix, keep = tail_layout(prompts, continuations, pad_id, model_device(model), prefix)
    with torch.inference_mode():
        logits, _, _ = forward_tail(model, layout, keep, vocab, hidden=False, prefix=prefix)
    logp = torch.log_softmax(logits.float(), -1)  # (B, keep, V)
    return [
        float(logp[b, keep - len(c) - 1 : keep - 1].gather(-1, torch.tensor(c, device=logp.device)[:, None]).sum())
        for b, c in enumerate(continuations)
    ]
