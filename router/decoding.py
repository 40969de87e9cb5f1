"""The speculative cascade decoding loop and its baselines.

`generate` drafts `gamma` tokens with the drafter, scores them with one verifier forward,
forms `pi = rule.target(q, p, alpha, q_raw, p_raw)` and runs the speculative sampler, with a KV
cache per model that is rolled back on rejection (never recomputing the accepted prefix) and
batches whose rows accept different numbers of tokens (see `router/layout.py`).
Baselines in the same module: autoregressive decoding with one model, the sequential
token-level cascade with Chow's rule and the sequence-level cascade.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from router.layout import CachedModel, Layout, drop_trailing_holes, keep_rows
from router.rules import chow_defer, resolve_rule, trusted_inputs, tv_distance
from router.sampling import accept_drafts, next_after, process_logits, sample

FROM_DRAFTER, FROM_VERIFIER, PADDING = 0, 1, -1  # values of GenerateOutput.sources
PI_EQUALS_Q_TOL = 1e-6  # a position "defers" when TV(q, pi) exceeds this


@dataclass
class GenerateOutput:
    """sequences (B, prompt + new); sources (B, new): 0 drafter token kept, 1 from the verifier
    step (resampled or bonus token, or a deferred token), -1 padding after the end."""

    sequences: torch.Tensor
    stats: dict
    sources: torch.Tensor


@dataclass
class _Rows:
    """Per-row bookkeeping of what was generated, in the caller's row order."""

    eos: set
    max_new: int
    tokens: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    done: list = field(default_factory=list)

    @classmethod
    def start(cls, batch: int, eos: set, max_new: int) -> "_Rows":
        return cls(eos, max_new, [[] for _ in range(batch)], [[] for _ in range(batch)], [False] * batch)

    def emit(self, row: int, tokens: list[int], sources: list[int]) -> int:
        """Append tokens to a row up to EOS / the length limit; return how many were kept."""
        room = self.max_new - len(self.tokens[row])
        kept = 0
        for tok, src in zip(tokens[:room], sources[:room]):
            self.tokens[row].append(tok)
            self.sources[row].append(src)
            kept += 1
            if tok in self.eos:
                break
        if len(self.tokens[row]) >= self.max_new or (kept and self.tokens[row][-1] in self.eos):
            self.done[row] = True
        return kept

    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


# ---- input checks ------------------------------------------------------------------------------

def eos_ids(model) -> set:
    """The model's end-of-sequence token ids (generation config first, then model config)."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    if ids is None:
        ids = model.config.eos_token_id
    return set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])


def _pad_id(model, eos: set) -> int:
    pad = getattr(model.generation_config, "pad_token_id", None)
    return pad if pad is not None else (min(eos) if eos else 0)


def _vocab(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def check_pair(drafter, verifier) -> int:
    """Vocabulary size the two models share; a clear error when they cannot form a cascade."""
    v_d, v_v = _vocab(drafter), _vocab(verifier)
    e_d, e_v = eos_ids(drafter), eos_ids(verifier)
    if e_d and e_v and not e_d & e_v:
        raise ValueError(f"drafter and verifier disagree on the end-of-sequence token ({sorted(e_d)} vs "
                         f"{sorted(e_v)}): they do not share one tokenizer; use a pair from one family")
    shared = min(v_d, v_v)
    if abs(v_d - v_v) > 1024:  # padded embedding matrices differ by a few hundred rows at most
        raise ValueError(f"drafter vocabulary ({v_d}) and verifier vocabulary ({v_v}) differ by more than "
                         f"padding: they do not share one tokenizer; use a pair from one family")
    return shared


def _check_inputs(input_ids, attention_mask, max_new_tokens, gamma, temperature, top_p):
    if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        shape = tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a LongTensor of shape (B, T), got {shape}; "
                         f"for one prompt use ids[None] or tokenizer(..., return_tensors='pt')")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: every prompt needs at least one token")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids "
                         f"{tuple(input_ids.shape)}")
    if (attention_mask[:, -1] == 0).any():
        raise ValueError("prompts must be left-padded (the last column is padding in some row): "
                         "set tokenizer.padding_side = 'left'")
    if (attention_mask.sum(-1) == 0).any():
        raise ValueError("a prompt is empty (its attention_mask is all zero): every prompt needs a token")
    if max_new_tokens < 1 or gamma < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) and gamma ({gamma}) must be >= 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature must be >= 0 (got {temperature}) and top_p in (0, 1] (got {top_p})")
    return attention_mask


def _finish(input_ids, rows: _Rows, pad_id: int, stats: dict, started: float) -> GenerateOutput:
    width = max((len(t) for t in rows.tokens), default=0)
    new = torch.full((len(rows.tokens), width), pad_id, dtype=torch.long)
    src = torch.full((len(rows.tokens), width), PADDING, dtype=torch.long)
    for b, (toks, srcs) in enumerate(zip(rows.tokens, rows.sources)):
        new[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        src[b, : len(srcs)] = torch.tensor(srcs, dtype=torch.long)
    wall = time.perf_counter() - started
    n_new = rows.new_tokens()
    stats.update(new_tokens=n_new, wall_seconds=wall, tokens_per_second=n_new / wall if wall > 0 else 0.0)
    return GenerateOutput(torch.cat([input_ids.cpu(), new], 1), stats, src)


def _drop_finished(rows: _Rows, active: list[int], layout: Layout, *models: CachedModel) -> list[int]:
    """Remove finished rows from the batch; return the still-active row ids."""
    still = [i for i, b in enumerate(active) if not rows.done[b]]
    if len(still) < len(active) and still:
        keep_rows(torch.tensor(still, device=layout.tokens.device), layout, *models)
    return [active[i] for i in still]


# ---- speculative cascade -------------------------------------------------------------------------

def _draft(drafter: CachedModel, layout: Layout, gamma: int, temperature: float, top_p: float, gen):
    """gamma drafts (B, gamma) with their drafter distributions q_raw, q (B, gamma, V).

    Takes gamma drafter forwards; the last draft is left pending (not yet fed), because its
    forward only pays off when some row accepts every draft (see `_block_end`).
    """
    raws, scaled, tokens, hidden = [], [], [], []
    for j in range(gamma):
        logits = drafter.feed(layout, layout.length, keep=1)  # (B, 1, V)
        raw, q = process_logits(logits[:, -1], temperature, top_p)  # (B, V) each
        x = sample(q, gen)  # (B,)
        raws.append(raw)
        scaled.append(q)
        tokens.append(x)
        if drafter.want_hidden:
            hidden.append(drafter.last_hidden[:, -1])  # (B, H) where q was computed
        layout.append(x[:, None])
    drafter_hidden = torch.stack(hidden, 1) if hidden else None  # (B, gamma, H)
    return torch.stack(tokens, 1), torch.stack(raws, 1), torch.stack(scaled, 1), drafter_hidden


def _wanted_hidden(rule) -> tuple:
    """Which models' hidden states a rule reads (learned routers may; plug-in rules never do)."""
    return tuple(getattr(rule, "hidden_inputs", ()) or ())


def _hidden_kwargs(rule, drafter_hidden, verifier_hidden) -> dict:
    """Extra target() arguments for routers that read hidden states (plug-in rules get none)."""
    if not _wanted_hidden(rule):
        return {}
    return {"hidden": {"drafter": drafter_hidden, "verifier": verifier_hidden}}


def _block_end(rule, alpha, drafter: CachedModel, layout: Layout, q, pi, p_raw, p, n_acc, temperature, top_p,
               bonus_from: str, verifier_hidden=None):
    """(q, pi) (B, V) where each row's block ends: its first rejected draft, or the bonus position.

    The bonus position needs q there (one more drafter forward) only when some row accepted every
    draft; `lossless` ignores the drafter there, and bonus_from="verifier" sets pi = p at that one
    position, so both skip the forward (the last draft is then fed with the next token, at no extra
    cost). q at a bonus position only matters for rejected rows, so p stands in for it there.
    """
    g = q.shape[1]
    rows = torch.arange(q.shape[0], device=q.device)
    stop = n_acc.clamp_max(g - 1)
    q_n, pi_n = q[rows, stop], pi[rows, stop]  # (B, V)
    full = n_acc == g
    if not bool(full.any()):
        return q_n, pi_n
    if getattr(rule, "name", None) == "lossless" or bonus_from == "verifier":
        bonus_q, bonus_pi = p[:, g], p[:, g]
    else:
        bq_raw, bq = process_logits(drafter.feed(layout, layout.length, keep=1), temperature, top_p)  # (B, 1, V)
        bonus_q = bq[:, 0]
        hidden = _hidden_kwargs(rule, drafter.last_hidden, None if verifier_hidden is None else verifier_hidden[:, g:])
        bonus_pi = rule.target(bq, p[:, g:], alpha, q_raw=bq_raw, p_raw=p_raw[:, g:], **hidden)[:, 0]
    return torch.where(full[:, None], bonus_q, q_n), torch.where(full[:, None], bonus_pi, pi_n)


def generate(drafter, verifier, input_ids: torch.Tensor, rule="opt", alpha: float = 0.3, gamma: int = 4,
             temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
             attention_mask: torch.Tensor | None = None, bonus_from: str = "target") -> GenerateOutput:
    """Speculative cascade decoding of a batch of left-padded prompts (see module docstring).

    `rule` is a rule name from `router.rules.RULES` or any object with the same `target` method
    (e.g. a learned router from `router.model.load_router`). When every draft of a block passes,
    the bonus token comes from pi (bonus_from="target", exact, as in the paper: costs one more
    drafter forward to get q there) or from the verifier's p (bonus_from="verifier": that one
    position defers, and the drafter forward is saved).
    """
    attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, gamma, temperature, top_p)
    if bonus_from not in ("target", "verifier"):
        raise ValueError(f"bonus_from must be 'target' or 'verifier', got {bonus_from!r}")
    rule = resolve_rule(rule)
    vocab = check_pair(drafter, verifier)
    eos = eos_ids(verifier)
    gen = torch.Generator(device=input_ids.device).manual_seed(seed)
    started = time.perf_counter()
    rows = _Rows.start(input_ids.shape[0], eos, max_new_tokens)
    stats = dict(method="speculative", rule=getattr(rule, "name", type(rule).__name__), alpha=alpha,
                 gamma=gamma, bonus_from=bonus_from, blocks=0, accepted_hist=[0] * (gamma + 1),
                 drafts_evaluated=0, rejections=0, deferrals=0, expected_rejections=0.0)
    layout = Layout(input_ids, attention_mask)
    d, v = CachedModel(drafter, vocab), CachedModel(verifier, vocab)
    wanted = _wanted_hidden(rule)
    d.want_hidden, v.want_hidden = "drafter" in wanted, "verifier" in wanted
    active = list(range(input_ids.shape[0]))
    with torch.inference_mode(), trusted_inputs():  # q, p come from softmax here: skip re-checking them
        while active:
            remaining = max(max_new_tokens - len(rows.tokens[b]) for b in active)
            g = max(1, min(gamma, remaining - 1))  # no drafts past the length limit
            start = layout.length
            drafts, q_raw, q, d_hidden = _draft(d, layout, g, temperature, top_p, gen)  # (B, g), (B, g, V) x2
            p_raw, p = process_logits(v.feed(layout, layout.length, keep=g + 1), temperature, top_p)
            v_hidden = v.last_hidden if v.want_hidden else None  # (B, g+1, H)
            hidden = _hidden_kwargs(rule, d_hidden, None if v_hidden is None else v_hidden[:, :g])
            pi = rule.target(q, p[:, :g], alpha, q_raw=q_raw, p_raw=p_raw[:, :g], **hidden)  # (B, g, V)
            n_acc = accept_drafts(drafts, q, pi, gen)  # (B,)
            q_n, pi_n = _block_end(rule, alpha, d, layout, q, pi, p_raw, p, n_acc, temperature, top_p, bonus_from,
                                   v_hidden)
            nxt = next_after(q_n, pi_n, n_acc < g, gen)
            _record_block(stats, rows, active, drafts, n_acc, nxt, tv_distance(q, pi), g)
            layout.keep_first(start, n_acc)
            drop_trailing_holes(layout, d, v)
            layout.append(nxt[:, None])
            active = _drop_finished(rows, active, layout, d, v)
    stats.update(_forward_stats(d, "drafter"), **_forward_stats(v, "verifier"))
    out = _finish(input_ids, rows, _pad_id(verifier, eos), stats, started)
    _summarise(out.stats)
    return out


def _forward_stats(model: CachedModel, role: str) -> dict:
    return {f"{role}_forwards": model.forwards, f"{role}_row_forwards": model.row_forwards,
            f"{role}_seconds": model.seconds}


def _record_block(stats, rows: _Rows, active, drafts, n_acc, nxt, rejection_prob, g: int) -> None:
    """Emit each row's accepted drafts + next token and count acceptances, rejections, deferrals.

    rejection_prob (B, g) is TV(q, pi) at each drafted position; a position "defers" when pi
    differs from q there. Both are counted over the drafts the sampler evaluated.
    """
    stats["blocks"] += 1
    n_acc_l, nxt_l, drafts_l = n_acc.tolist(), nxt.tolist(), drafts.tolist()
    defers = (rejection_prob > PI_EQUALS_Q_TOL).tolist()  # (B, g)
    rej = rejection_prob.tolist()
    for i, b in enumerate(active):
        n = n_acc_l[i]
        stats["accepted_hist"][n] += 1
        evaluated = min(n + 1, g)  # drafts the sampler looked at
        stats["drafts_evaluated"] += evaluated
        stats["rejections"] += int(n < g)
        stats["expected_rejections"] += sum(rej[i][:evaluated])
        stats["deferrals"] += sum(defers[i][:evaluated])
        rows.emit(b, drafts_l[i][:n] + [nxt_l[i]], [FROM_DRAFTER] * n + [FROM_VERIFIER])


def _summarise(stats: dict) -> None:
    """Derived rates, guarded against empty runs."""
    n_new = max(stats["new_tokens"], 1)
    evaluated = max(stats.get("drafts_evaluated", 0), 1)
    if "rejections" in stats:
        stats["rejection_rate"] = stats["rejections"] / evaluated
        stats["expected_rejection_rate"] = stats["expected_rejections"] / evaluated
        row_blocks = max(sum(stats["accepted_hist"]), 1)
        stats["mean_accepted"] = sum(n * c for n, c in enumerate(stats["accepted_hist"])) / row_blocks
    if "deferrals" in stats:  # per evaluated draft in the speculative loop, per token in the baselines
        stats["deferral_rate"] = stats["deferrals"] / (evaluated if "rejections" in stats else n_new)
    stats["verifier_calls_per_token"] = stats.get("verifier_row_forwards", 0) / n_new
    model_s = stats.get("drafter_seconds", 0.0) + stats.get("verifier_seconds", 0.0)
    stats["overhead_fraction"] = max(0.0, 1 - model_s / stats["wall_seconds"]) if stats["wall_seconds"] else 0.0
    stats["drafter_calls_per_token"] = stats.get("drafter_row_forwards", 0) / n_new


# ---- baselines -----------------------------------------------------------------------------------

def generate_autoregressive(model, input_ids: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
                            max_new_tokens: int = 64, seed: int = 0, attention_mask=None,
                            role: str = "verifier") -> GenerateOutput:
    """One model alone, one token per forward, KV-cached; `role` names it in the stats."""
    attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, 1, temperature, top_p)
    out, _ = _autoregressive(model, input_ids, attention_mask, temperature, top_p, max_new_tokens, seed, role)
    return out


def _autoregressive(model, input_ids, attention_mask, temperature, top_p, max_new_tokens, seed, role):
    """Autoregressive loop; also returns each row's mean raw probability of its chosen tokens."""
    eos = eos_ids(model)
    gen = torch.Generator(device=input_ids.device).manual_seed(seed)
    started = time.perf_counter()
    batch = input_ids.shape[0]
    rows = _Rows.start(batch, eos, max_new_tokens)
    source = FROM_DRAFTER if role == "drafter" else FROM_VERIFIER
    confidence = [[] for _ in range(batch)]
    layout, m = Layout(input_ids, attention_mask), CachedModel(model, _vocab(model))
    active = list(range(batch))
    with torch.inference_mode():
        while active:
            raw, scaled = process_logits(m.feed(layout, layout.length, keep=1)[:, -1], temperature, top_p)
            x = sample(scaled, gen)  # (B,)
            x_prob = raw.gather(-1, x[:, None]).squeeze(-1).tolist()
            for i, b in enumerate(active):
                if rows.emit(b, [int(x[i])], [source]):
                    confidence[b].append(x_prob[i])
            layout.append(x[:, None])
            active = _drop_finished(rows, active, layout, m)
    stats = dict(method=f"{role}_only", blocks=0, **_forward_stats(m, role))
    out = _finish(input_ids, rows, _pad_id(model, eos), stats, started)
    _summarise(out.stats)
    mean_conf = [sum(c) / len(c) if c else 0.0 for c in confidence]
    return out, mean_conf


def generate_token_cascade(drafter, verifier, input_ids: torch.Tensor, alpha: float = 0.3,
                           temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 64,
                           seed: int = 0, attention_mask=None) -> GenerateOutput:
    """Sequential token-level cascade with Chow's rule: the drafter writes every position and the
    verifier is called only where max q_raw < 1 - alpha, catching up on the skipped tokens in that
    same forward. Deferred positions take the verifier's token."""
    attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, 1, temperature, top_p)
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha} is outside chow's range [0, 1]")
    vocab = check_pair(drafter, verifier)
    eos = eos_ids(verifier)
    gen = torch.Generator(device=input_ids.device).manual_seed(seed)
    started = time.perf_counter()
    rows = _Rows.start(input_ids.shape[0], eos, max_new_tokens)
    layout = Layout(input_ids, attention_mask)
    d, v = CachedModel(drafter, vocab), CachedModel(verifier, vocab)
    active, deferrals = list(range(input_ids.shape[0])), 0
    with torch.inference_mode():
        while active:
            q_raw, q = process_logits(d.feed(layout, layout.length, keep=1)[:, -1], temperature, top_p)
            defer = chow_defer(q_raw, alpha)  # (B,)
            dist = q
            if defer.any():
                _, p = process_logits(v.feed(layout, layout.length, keep=1)[:, -1], temperature, top_p)
                dist = torch.where(defer[:, None], p, q)
            x = sample(dist, gen)
            for i, b in enumerate(active):
                deferrals += rows.emit(b, [int(x[i])], [int(defer[i])]) * int(defer[i])
            layout.append(x[:, None])
            active = _drop_finished(rows, active, layout, d, v)
    stats = dict(method="token_cascade", rule="chow", alpha=alpha, deferrals=deferrals,
                 **_forward_stats(d, "drafter"), **_forward_stats(v, "verifier"))
    out = _finish(input_ids, rows, _pad_id(verifier, eos), stats, started)
    _summarise(out.stats)
    return out


def generate_sequence_cascade(drafter, verifier, input_ids: torch.Tensor, alpha: float = 0.3,
                              temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 64,
                              seed: int = 0, attention_mask=None) -> GenerateOutput:
    """Sequence-level cascade: the drafter writes each whole answer; rows whose mean token
    confidence (raw drafter probability of its chosen tokens) is below 1 - alpha are rewritten
    by the verifier from scratch. alpha 0 -> (almost) always the verifier, 1 -> the drafter."""
    attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, 1, temperature, top_p)
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha} is outside the sequence cascade's range [0, 1]")
    check_pair(drafter, verifier)
    started = time.perf_counter()
    draft, confidence = _autoregressive(drafter, input_ids, attention_mask, temperature, top_p,
                                        max_new_tokens, seed, "drafter")
    redo = [b for b, c in enumerate(confidence) if c < 1 - alpha]
    stats = dict(method="sequence_cascade", alpha=alpha, deferrals=len(redo), deferred_rows=redo,
                 **{k: draft.stats[k] for k in ("drafter_forwards", "drafter_row_forwards", "drafter_seconds")},
                 verifier_forwards=0, verifier_row_forwards=0, verifier_seconds=0.0)
    rows = _Rows.start(input_ids.shape[0], eos_ids(verifier), max_new_tokens)
    width = input_ids.shape[1]
    for b in range(input_ids.shape[0]):
        toks = [t for t, s in zip(draft.sequences[b, width:].tolist(), draft.sources[b].tolist()) if s != PADDING]
        rows.tokens[b], rows.sources[b] = toks, [FROM_DRAFTER] * len(toks)
    if redo:
        idx = torch.tensor(redo, device=input_ids.device)
        redone = generate_autoregressive(verifier, input_ids[idx], temperature, top_p, max_new_tokens, seed,
                                         attention_mask[idx])
        for k in ("verifier_forwards", "verifier_row_forwards", "verifier_seconds"):
            stats[k] = redone.stats[k]
        for i, b in enumerate(redo):
            keep = redone.sources[i] != PADDING
            rows.tokens[b] = redone.sequences[i, width:][keep].tolist()
            rows.sources[b] = [FROM_VERIFIER] * len(rows.tokens[b])
    out = _finish(input_ids, rows, _pad_id(verifier, eos_ids(verifier)), stats, started)
    _summarise(out.stats)
    return out
