"""What every decoding loop shares: input checks, per-row outputs and stats.

The speculative cascade (`router.decoding.generate`) and the baselines (`router.loop.baselines`) all
decode a batch of left-padded prompts with KV-cached models (`router.loop.layout`), emit tokens per row
until EOS or the length limit, drop finished rows from the batch and report the same statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from router.infra import clock
from router.loop.layout import CachedModel, Layout, keep_rows
from router.loop.prefix import SharedPrefix, start_layout
from router.tasks.prompts import StopStrings
from router.loop.options import DecodeOptions
from router.sampling import sample

FROM_DRAFTER, FROM_VERIFIER, PADDING = 0, 1, -1  # values of GenerateOutput.sources


@dataclass
class GenerateOutput:
    """sequences (B, prompt + new); sources (B, new): 0 drafter token kept, 1 from the verifier
    step (resampled or bonus token, or a deferred token), -1 padding after the end."""

    sequences: torch.Tensor
    stats: dict
    sources: torch.Tensor
    # per row, the verifier's (raw, temperature-1) log-probability of each new token, where the loop
    # computed the verifier's distribution there anyway (verifier-only and speculative loops); else None
    verifier_logprobs: list | None = None

    def new_tokens(self) -> list[list[int]]:
        """Each row's generated tokens, its end padding dropped (sequences hold the prompt, then `sources`'
        width of new tokens)."""
        width = self.sequences.shape[1] - self.sources.shape[1]
        return [self.sequences[b, width:][self.sources[b] >= 0].tolist() for b in range(self.sequences.shape[0])]


@dataclass
class Rows:
    """Per-row bookkeeping of what was generated, in the caller's row order."""

    eos: set
    max_new: int
    tokens: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    done: list = field(default_factory=list)
    stop: StopStrings | None = None
    tails: list = field(default_factory=list)  # the text of each row's last tokens, for stop strings
    logps: list | None = None  # per row, the verifier's log-probability of each kept token (when known)

    @classmethod
    def start(cls, batch: int, eos: set, max_new: int, stop: StopStrings | None = None) -> "Rows":
        return cls(
            eos,
            max_new,
            [[] for _ in range(batch)],
            [[] for _ in range(batch)],
            [False] * batch,
            stop,
            [""] * batch,
            [[] for _ in range(batch)],
        )

    def emit(self, row: int, tokens: list[int], sources: list[int], logps: list[float] | None = None) -> int:
        """Append tokens to a row up to EOS, a stop string or the length limit; return how many
        were kept. `logps`: the verifier's log-probability of each token, when the loop has it."""
        room = self.max_new - len(self.tokens[row])
        kept = 0
        if logps is None:
            self.logps = None  # one token without it: the row's log-probabilities are not all known
        for i, (tok, src) in enumerate(zip(tokens[:room], sources[:room])):
            self.tokens[row].append(tok)
            self.sources[row].append(src)
            if self.logps is not None:
                self.logps[row].append(logps[i])
            kept += 1
            if tok in self.eos or self._stops(row, tok):
                self.done[row] = True
                break
        if len(self.tokens[row]) >= self.max_new:
            self.done[row] = True
        return kept

    def _stops(self, row: int, tok: int) -> bool:
        if self.stop is None:
            return False
        self.tails[row] = (self.tails[row] + self.stop.text(tok))[-self.stop.window :]
        return self.stop.found(self.tails[row]) or self.stop.ends(row, self.tokens[row])

    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    def drop_finished(self, active: list[int], layout: Layout, *models: CachedModel, also=()) -> list[int]:
        """Remove finished rows from the batch (layout, caches and any per-row state in `also`, objects with
        keep_rows(idx)); return the still-active row ids."""
        still = [i for i, b in enumerate(active) if not self.done[b]]
        if len(still) < len(active) and still:
            idx = torch.tensor(still, device=layout.tokens.device)
            keep_rows(idx, layout, *models)
            for state in also:
                state.keep_rows(idx)
        return [active[i] for i in still]


def one_model_step(
    m: CachedModel, layout: Layout, opts: DecodeOptions, gen, rows: Rows, active: list[int], source: int, logps: bool
) -> list[tuple[bool, float]]:
    """One token per active row from one model's next-token distribution (a forward over the columns
    its cache has not seen), emitted and appended to the layout. `logps`: the model is the verifier,
    so the tokens' log-probabilities are the verifier's own. Returns (kept, raw probability of the
    token) per active row."""
    raw, scaled = opts.probs(m.feed(layout, layout.length, keep=1)[:, -1])  # (B, V) each
    x = sample(scaled, gen)  # (B,)
    x_prob = raw.gather(-1, x[:, None]).squeeze(-1).tolist()
    out = []
    for i, b in enumerate(active):
        logp = [math.log(max(x_prob[i], 1e-30))] if logps else None
        out.append((bool(rows.emit(b, [int(x[i])], [source], logp)), x_prob[i]))
    layout.append(x[:, None])
    return out


def first_layout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: SharedPrefix | None, pad: int, *models: CachedModel
) -> Layout:
    """The first layout of a loop, its models' caches starting from the shared prefix when every
    prompt has it (`router.loop.prefix`), else empty."""
    layout, used = start_layout(input_ids, attention_mask, prefix, pad)
    if used is not None:
        for m in models:
            m.start_from(used, input_ids.shape[0])
    return layout


# ---- input checks ------------------------------------------------------------------------------


def eos_ids(model) -> set:
    """The model's end-of-sequence token ids (generation config first, then model config)."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    if ids is None:
        ids = model.config.eos_token_id
    return set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])


def vocab_size(model) -> int:
    """Rows of the model's output layer (an engine's model states it: `vocab_size`)."""
    if isinstance(getattr(model, "vocab_size", None), int):
        return model.vocab_size
    return model.get_output_embeddings().weight.shape[0]


def shared_vocab(drafter, verifier) -> int:
    """Vocabulary size the two models share; a clear error when they cannot form a cascade."""
    v_d, v_v = vocab_size(drafter), vocab_size(verifier)
    e_d, e_v = eos_ids(drafter), eos_ids(verifier)
    if e_d and e_v and not e_d & e_v:
        raise ValueError(
            f"drafter and verifier disagree on the end-of-sequence token ({sorted(e_d)} vs "
            f"{sorted(e_v)}): they do not share one tokenizer; use a pair from one family"
        )
    shared = min(v_d, v_v)
    if abs(v_d - v_v) > 1024:  # padded embedding matrices differ by a few hundred rows at most
        raise ValueError(
            f"drafter vocabulary ({v_d}) and verifier vocabulary ({v_v}) differ by more than "
            f"padding: they do not share one tokenizer; use a pair from one family"
        )
    return shared


def check_inputs(input_ids, attention_mask) -> torch.Tensor:
    """The attention mask (all ones when None), or a ValueError naming what is wrong with the batch."""
    if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        shape = tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__
        raise ValueError(
            f"input_ids must be a LongTensor of shape (B, T), got {shape}; "
            f"for one prompt use ids[None] or tokenizer(..., return_tensors='pt')"
        )
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: every prompt needs at least one token")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids {tuple(input_ids.shape)}")
    if (attention_mask[:, -1] == 0).any():
        raise ValueError(
            "prompts must be left-padded (the last column is padding in some row): set tokenizer.padding_side = 'left'"
        )
    if (attention_mask.sum(-1) == 0).any():
        raise ValueError("a prompt is empty (its attention_mask is all zero): every prompt needs a token")
    return attention_mask


def check_loop_objects(stop, prefix) -> None:
    """Refuse a `stop` or `prefix` of the wrong kind in one line (they would fail deep in the loop)."""
    if isinstance(stop, (str, list, tuple)):  # texts: StopStrings (or a stop object of its kind) holds token ids
        raise ValueError(
            f"stop= takes StopStrings.build(tokenizer, [...]) (router.tasks.prompts), got {type(stop).__name__} "
            f"{stop!r:.60}: the loop stops on token ids, so the texts need the tokenizer"
        )
    if prefix is not None and not isinstance(prefix, SharedPrefix):
        raise ValueError(
            f"prefix= takes a router.loop.prefix.SharedPrefix (the shared prompt start, prefilled once), got "
            f"{type(prefix).__name__}: build one with SharedPrefix(ids) or SharedPrefix.common(prompts), or leave prefix out"
        )


def check_token_ids(input_ids: torch.Tensor, *models) -> None:
    """Refuse token ids outside every model's embedding table (torch would end in an IndexError)."""
    sizes = [m.get_input_embeddings().weight.shape[0] for m in models if hasattr(m, "get_input_embeddings")]
    if not sizes or not input_ids.numel():
        return
    vocab, low, high = min(sizes), int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:
        raise ValueError(
            f"input_ids holds token id {high if high >= vocab else low}, outside the models' vocabulary (0 to "
            f"{vocab - 1}): encode the prompt with the pair's own tokenizer (padding included)"
        )


# ---- outputs and statistics ------------------------------------------------------------------------


def finish(input_ids, rows: Rows, pad: int, stats: dict, started: float) -> GenerateOutput:
    """The output tensors of a finished loop, with the derived statistics filled in."""
    width = max((len(t) for t in rows.tokens), default=0)
    new = torch.full((len(rows.tokens), width), pad, dtype=torch.long)
    src = torch.full((len(rows.tokens), width), PADDING, dtype=torch.long)
    for b, (toks, srcs) in enumerate(zip(rows.tokens, rows.sources)):
        new[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
        src[b, : len(srcs)] = torch.tensor(srcs, dtype=torch.long)
    wall = clock.now() - started
    n_new = rows.new_tokens()
    stats.update(new_tokens=n_new, wall_seconds=wall, tokens_per_second=n_new / wall if wall > 0 else 0.0)
    _summarise(stats)
    return GenerateOutput(torch.cat([input_ids.cpu(), new], 1), stats, src, rows.logps)


def forward_stats(model: CachedModel, role: str) -> dict:
    return {
        f"{role}_forwards": model.forwards,
        f"{role}_row_forwards": model.row_forwards,
        f"{role}_seconds": model.seconds,
    }


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
