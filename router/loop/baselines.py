"""Decoding baselines the speculative cascade is measured against.

- `generate_autoregressive`: one model alone (drafter-only or verifier-only), one token per forward;
- `generate_token_cascade`: the sequential token-level cascade with Chow's rule, where the drafter
  writes every position and the verifier is called only where it defers;
- `generate_sequence_cascade`: the drafter writes whole answers and the verifier rewrites those
  whose mean drafter confidence is low.
All take the same sampling arguments as `router.decoding.generate` and return its `GenerateOutput`.
"""

from __future__ import annotations

import torch

from router.infra import clock
from router.loop.layout import model_cache, output_pad_id
from router.loop.options import DecodeOptions
from router.loop.common import (
    FROM_DRAFTER,
    FROM_VERIFIER,
    GenerateOutput,
    Rows,
    check_inputs,
    shared_vocab,
    eos_ids,
    finish,
    forward_stats,
    first_layout,
    one_model_step,
    vocab_size,
)
from router.loop.prefix import SharedPrefix
from router.tasks.prompts import StopStrings
from router.targets import chow_defer
from router.sampling import sample


def generate_autoregressive(
    model,
    input_ids: torch.Tensor,
    temperature: float = DecodeOptions.temperature,
    top_p: float = DecodeOptions.top_p,
    max_new_tokens: int = DecodeOptions.max_new_tokens,
    seed: int = DecodeOptions.seed,
    attention_mask=None,
    role: str = "verifier",
    stop: StopStrings | None = None,
    prefix: SharedPrefix | None = None,
) -> GenerateOutput:
    """One model alone, one token per forward, KV-cached; `role` names it in the stats; stop
    tokens and a shared prefix as in `router.decoding.generate`."""
    opts = DecodeOptions(temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens)
    out, _ = _autoregressive(model, input_ids, check_inputs(input_ids, attention_mask), opts, role, prefix, stop)
    return out


def _autoregressive(
    model,
    input_ids,
    attention_mask,
    opts: DecodeOptions,
    role: str,
    prefix: SharedPrefix | None,
    stop: StopStrings | None,
):
    """Autoregressive loop; also returns each row's mean raw probability of its chosen tokens."""
    eos = eos_ids(model)
    gen = opts.generator(input_ids.device)
    started = clock.now()
    batch = input_ids.shape[0]
    rows = Rows.start(batch, eos, opts.max_new_tokens, stop)
    source = FROM_DRAFTER if role == "drafter" else FROM_VERIFIER
    confidence = [[] for _ in range(batch)]
    m = model_cache(model, vocab_size(model))
    layout = first_layout(input_ids, attention_mask, prefix, output_pad_id(model, eos), m)
    active = list(range(batch))
    with torch.inference_mode():
        while active:
            stepped = one_model_step(m, layout, opts, gen, rows, active, source, logps=role == "verifier")
            for b, (kept, prob) in zip(active, stepped):
                if kept:
                    confidence[b].append(prob)
            active = rows.drop_finished(active, layout, m)
    stats = dict(method=f"{role}_only", blocks=0, **forward_stats(m, role))
    out = finish(input_ids, rows, output_pad_id(model, eos), stats, started)
    mean_conf = [sum(c) / len(c) if c else 0.0 for c in confidence]
    return out, mean_conf


def _check_unit_alpha(alpha: float, what: str) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha} is outside {what}'s range [0, 1]")


def generate_token_cascade(
    drafter,
    verifier,
    input_ids: torch.Tensor,
    alpha: float = 0.3,
    temperature: float = DecodeOptions.temperature,
    top_p: float = DecodeOptions.top_p,
    max_new_tokens: int = DecodeOptions.max_new_tokens,
    seed: int = DecodeOptions.seed,
    attention_mask=None,
    stop: StopStrings | None = None,
    prefix: SharedPrefix | None = None,
) -> GenerateOutput:
    """Sequential token-level cascade with Chow's rule: the drafter writes every position and the
    verifier is called only where max q_raw < 1 - alpha, catching up on the skipped tokens in that
    same forward. Deferred positions take the verifier's token."""
    opts = DecodeOptions(temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens)
    attention_mask = check_inputs(input_ids, attention_mask)
    _check_unit_alpha(alpha, "chow")
    vocab = shared_vocab(drafter, verifier)
    eos = eos_ids(verifier)
    gen = opts.generator(input_ids.device)
    started = clock.now()
    rows = Rows.start(input_ids.shape[0], eos, max_new_tokens, stop)
    d, v = model_cache(drafter, vocab), model_cache(verifier, vocab)
    layout = first_layout(input_ids, attention_mask, prefix, output_pad_id(verifier, eos), d, v)
    active, deferrals = list(range(input_ids.shape[0])), 0
    with torch.inference_mode():
        while active:
            q_raw, q = opts.probs(d.feed(layout, layout.length, keep=1)[:, -1])  # (B, V) each
            defer = chow_defer(q_raw, alpha)  # (B,)
            dist = q
            if defer.any():
                _, p = opts.probs(v.feed(layout, layout.length, keep=1)[:, -1])
                dist = torch.where(defer[:, None], p, q)
            x = sample(dist, gen)
            for i, b in enumerate(active):  # the verifier's distribution exists only where it deferred
                deferrals += rows.emit(b, [int(x[i])], [int(defer[i])], None) * int(defer[i])
            layout.append(x[:, None])
            active = rows.drop_finished(active, layout, d, v)
    stats = dict(
        method="token_cascade",
        rule="chow",
        alpha=alpha,
        deferrals=deferrals,
        **forward_stats(d, "drafter"),
        **forward_stats(v, "verifier"),
    )
    return finish(input_ids, rows, output_pad_id(verifier, eos), stats, started)


def generate_sequence_cascade(
    drafter,
    verifier,
    input_ids: torch.Tensor,
    alpha: float = 0.3,
    temperature: float = DecodeOptions.temperature,
    top_p: float = DecodeOptions.top_p,
    max_new_tokens: int = DecodeOptions.max_new_tokens,
    seed: int = DecodeOptions.seed,
    attention_mask=None,
    stop: StopStrings | None = None,
    prefix: SharedPrefix | None = None,
) -> GenerateOutput:
    """Sequence-level cascade: the drafter writes each whole answer; rows whose mean token
    confidence (raw drafter probability of its chosen tokens) is below 1 - alpha are rewritten
    by the verifier from scratch. alpha 0 -> (almost) always the verifier, 1 -> the drafter."""
    opts = DecodeOptions(temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens)
    attention_mask = check_inputs(input_ids, attention_mask)
    _check_unit_alpha(alpha, "the sequence cascade")
    shared_vocab(drafter, verifier)
    started = clock.now()
    draft, confidence = _autoregressive(drafter, input_ids, attention_mask, opts, "drafter", prefix, stop)
    redo = [b for b, c in enumerate(confidence) if c < 1 - alpha]
    stats = dict(
        method="sequence_cascade",
        alpha=alpha,
        deferrals=len(redo),
        deferred_rows=redo,
        **{k: draft.stats[k] for k in ("drafter_forwards", "drafter_row_forwards", "drafter_seconds")},
        verifier_forwards=0,
        verifier_row_forwards=0,
        verifier_seconds=0.0,
    )
    rows = Rows.start(input_ids.shape[0], eos_ids(verifier), max_new_tokens, stop)
    for b, toks in enumerate(draft.new_tokens()):
        rows.tokens[b], rows.sources[b] = toks, [FROM_DRAFTER] * len(toks)
    rows.logps = None  # drafter answers: the verifier never scored them
    if redo:
        idx = torch.tensor(redo, device=input_ids.device)
        redone = generate_autoregressive(
            verifier,
            input_ids[idx],
            temperature,
            top_p,
            max_new_tokens,
            seed,
            attention_mask[idx],
            stop=stop,
            prefix=prefix,
        )
        for k in ("verifier_forwards", "verifier_row_forwards", "verifier_seconds"):
            stats[k] = redone.stats[k]
        for b, toks in zip(redo, redone.new_tokens()):
            rows.tokens[b], rows.sources[b] = toks, [FROM_VERIFIER] * len(toks)
    return finish(input_ids, rows, output_pad_id(verifier, eos_ids(verifier)), stats, started)
