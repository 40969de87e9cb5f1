"""Teacher-forced forward passes over (prompt, continuation) batches: the one setup that recording
(data_gen.scoring) and evaluation (eval's log-probability pass) both use, so both read the same
logits for the same tokens. A shared prompt prefix (router.engine.prefix) is read from its cache.
"""

from __future__ import annotations

import torch

from router.engine.layout import Layout, cache_argument, left_pad, model_device, returned_cache
from router.engine.llamacpp import is_llamacpp
from router.engine.prefix import SharedPrefix, start_layout


def forward_tail(
    model, layout: Layout, keep: int, vocab: int, hidden: bool, cache: bool = False, prefix: SharedPrefix | None = None
):
    """Logits (B, keep, V) of the last `keep` columns, their last hidden states if asked, and the
    KV cache of every column if asked (else None). With a shared prefix, the layout's first
    len(prefix) columns come from its cache and only the rest is fed. A llama.cpp model
    (router.engine.llamacpp) returns its LlamaCppCache as the cache."""
    if is_llamacpp(model):
        return _llamacpp_forward(model, layout, keep, vocab, hidden, cache, prefix)
    start = len(prefix) if prefix is not None else 0
    past = {cache_argument(model): prefix.cache_for(model, layout.tokens.shape[0])} if prefix is not None else {}
    out = model(
        input_ids=layout.tokens[:, start:],
        attention_mask=layout.mask,
        position_ids=layout.pos[:, start:],
        use_cache=cache or prefix is not None,
        logits_to_keep=keep,
        output_hidden_states=hidden,
        **past,
    )
    states = out.hidden_states[-1][:, -keep:] if hidden else None  # (B, keep, H)
    kv = returned_cache(out) if cache else None
    return out.logits[:, -keep:, :vocab], states, kv


def _llamacpp_forward(model, layout: Layout, keep: int, vocab: int, hidden: bool, cache: bool, prefix):
    run = model.kv_cache(vocab)
    run.want_hidden = hidden
    if prefix is not None:
        run.start_from(prefix, layout.tokens.shape[0])
    logits = run.feed(layout, layout.length, keep)  # (B, keep, V)
    states = run.last_hidden if hidden else None
    if not cache:
        run.close()  # the context goes back to the model, its prefix kept for the next batch
    return logits, states, run if cache else None


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
