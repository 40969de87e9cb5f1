"""Batched token layout with KV caches that roll back, shared by every decoding loop.

Rows of a batch accept different numbers of draft tokens per block, so their sequences grow
unevenly. Instead of falling back to batch 1, every row lives in one rectangular "physical"
layout: rejected drafts stay in the KV caches as masked holes (the attention mask hides them
and position ids skip them), and trailing columns that are holes in every row are cropped
from the layout and from both caches. With batch 1 there are never any holes.
"""

from __future__ import annotations

import inspect

import torch

from router.infra import clock


def tokenizer_pad_id(tokenizer) -> int:
    """The id prompts are left-padded with: the tokenizer's pad token, else its end of sequence
    (padding is masked out, so any id the model knows will do), else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)


def output_pad_id(model, eos: set) -> int:
    """The id finished output rows are padded with: the model's generation pad token, else its smallest end
    of sequence id, else 0 (prompts are padded from the tokenizer instead: `tokenizer_pad_id`)."""
    pad = getattr(model.generation_config, "pad_token_id", None)
    return pad if pad is not None else (min(eos) if eos else 0)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (input_ids, attention_mask), both (B, T)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, seq in enumerate(sequences):
        if seq:
            ids[b, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[b, width - len(seq) :] = 1
    return ids, mask


def model_device(model) -> torch.device:
    """Where a model's inputs go: its parameters' device; the CPU for an engine without torch parameters
    (router.backends.llamacpp)."""
    params = getattr(model, "parameters", None)
    return next(params()).device if callable(params) else torch.device("cpu")


def returned_cache(out):
    """The KV cache a forward returned: `cache` in transformers >= 5.24, `past_key_values` before."""
    return getattr(out, "cache", None) or out.past_key_values


def cache_argument(model) -> str:
    """transformers >= 5.24 names the cache argument `cache`; older releases `past_key_values`."""
    forward = getattr(model, "forward", None)  # none on llama.cpp, whose cache is its own (unused name)
    return "cache" if forward is None or "cache" in inspect.signature(forward).parameters else "past_key_values"


class Layout:
    """Physical token columns of a batch: tokens, validity mask and position ids, all (B, L)."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.tokens = input_ids.clone()  # (B, L)
        self.mask = attention_mask.long().clone()  # (B, L) 1 = real token, 0 = pad or hole
        self.pos = (self.mask.cumsum(-1) - 1).clamp_min(0)  # (B, L) position of each real token

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def append(self, new_tokens: torch.Tensor) -> None:
        """Append one column per token in new_tokens (B, n), all real."""
        next_pos = self.pos.gather(1, self._last_real()) + 1  # (B, 1)
        n = new_tokens.shape[1]
        self.tokens = torch.cat([self.tokens, new_tokens], 1)
        self.mask = torch.cat([self.mask, torch.ones_like(new_tokens)], 1)
        steps = torch.arange(n, device=new_tokens.device)[None]  # (1, n)
        self.pos = torch.cat([self.pos, next_pos + steps], 1)

    def _last_real(self) -> torch.Tensor:
        """Column index of each row's last real token, (B, 1)."""
        cols = torch.arange(self.length, device=self.mask.device)[None]
        return torch.where(self.mask.bool(), cols, -1).amax(-1, keepdim=True)

    def keep_first(self, start: int, n_keep: torch.Tensor) -> None:
        """In columns start.., keep the first n_keep[b] (B,) for row b and turn the rest into holes."""
        offsets = torch.arange(self.length - start, device=self.mask.device)[None]  # (1, n)
        self.mask[:, start:] *= (offsets < n_keep[:, None]).long()

    def trailing_holes(self) -> int:
        """Number of last columns that are holes in every row."""
        used = self.mask.any(0).nonzero()
        return self.length - (int(used[-1]) + 1 if len(used) else 0)

    def crop(self, n: int) -> None:
        if n > 0:
            self.tokens, self.mask, self.pos = (x[:, :-n] for x in (self.tokens, self.mask, self.pos))

    def select_rows(self, rows: torch.Tensor) -> None:
        self.tokens, self.mask, self.pos = (x[rows] for x in (self.tokens, self.mask, self.pos))


# True (benchmarks/gpu.py): every forward waits for the GPU before reading the clock, so a model's seconds hold
# its kernels' time and the loop's own time is what remains (two synchronisations per forward; off by default)
SYNC_TIMING = False


def _synchronize(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


class CachedModel:
    """A causal LM with its KV cache over a prefix of the layout's columns."""

    def __init__(self, model, vocab: int):
        self.model = model
        self.vocab = vocab  # logits are cut to the vocabulary both models share
        self.cache = None  # the model creates the right cache type on its first forward
        self._cache_arg = cache_argument(model)
        self.n_cached = 0  # columns of the layout the cache covers
        self.forwards = 0  # forward calls
        self.row_forwards = 0  # forward calls weighted by the rows they served
        self.seconds = 0.0  # wall time inside forward calls
        self.want_hidden = False  # keep the last layer's hidden states of each feed (learned routers)
        self.last_hidden = None  # (B, keep, H) of the latest feed when want_hidden

    def feed(self, layout: Layout, upto: int, keep: int) -> torch.Tensor:
        """Run the columns [n_cached, upto) and return logits (B, keep, V) of the last `keep`."""
        if SYNC_TIMING:
            _synchronize(layout.tokens)
        started = clock.now()
        out = self.model(
            input_ids=layout.tokens[:, self.n_cached : upto],
            attention_mask=layout.mask[:, :upto],
            position_ids=layout.pos[:, self.n_cached : upto],
            use_cache=True,
            logits_to_keep=keep,
            **{self._cache_arg: self.cache},
            **({"output_hidden_states": True} if self.want_hidden else {}),
        )
        if self.want_hidden:  # the final (normed) layer, as data_gen records it
            self.last_hidden = out.hidden_states[-1][:, -keep:].float()
        self.cache = returned_cache(out)
        self.n_cached = upto
        self.forwards += 1
        self.row_forwards += layout.tokens.shape[0]
        logits = out.logits[:, -keep:, : self.vocab].float()
        if SYNC_TIMING:
            _synchronize(logits)
        self.seconds += clock.now() - started
        return logits

    def start_from(self, prefix, batch: int) -> None:
        """Begin with a copy of the model's cache over a shared prefix (`router.loop.prefix`), which
        fills the layout's first len(prefix) columns."""
        self.cache = prefix.cache_for(self.model, batch)
        self.n_cached = len(prefix)

    def crop_to(self, length: int) -> None:
        """Roll the cache back to its first `length` columns (never recomputes what is kept)."""
        drop = self.n_cached - length
        if drop > 0 and self.cache is not None:
            self.cache.crop(-drop)  # a negative count removes that many tokens in every version
            self.n_cached = length

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.batch_select_indices(rows)


def model_cache(model, vocab: int):
    """The loop's KV cache over `model`: the engine's own where the model brings one (`kv_cache`, e.g.
    router.backends.llamacpp.LlamaCppLM), else a CachedModel over a transformers model."""
    return model.kv_cache(vocab) if callable(getattr(model, "kv_cache", None)) else CachedModel(model, vocab)


def drop_trailing_holes(layout: Layout, *models: CachedModel, holes: int | None = None) -> None:
    """Crop columns that are holes in every row from the layout and from every cache; `holes`: their
    number when the caller knows it (no device-to-host read)."""
    n = layout.trailing_holes() if holes is None else holes
    if n:
        layout.crop(n)
        for m in models:
            m.crop_to(layout.length)


def keep_rows(rows: torch.Tensor, layout: Layout, *models: CachedModel) -> None:
    """Drop finished rows from the layout and the caches, then any all-hole tail they leave."""
    layout.select_rows(rows)
    for m in models:
        m.select_rows(rows)
    drop_trailing_holes(layout, *models)
