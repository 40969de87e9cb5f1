"""A prompt prefix every prompt shares (a few-shot context), prefilled once per model.

Few-shot prompts repeat the same worked examples before each question, and on a CPU that shared
prefill is most of a prompt's cost (GSM8K's 5-shot prompts share 709 of their ~775 tokens; the
1.5B verifier prefills ~31 tokens/s on 2 AVX2 cores in float32). A `SharedPrefix` holds those
token ids and, per model, the KV cache over them, computed on first use; every batch that starts
with them then starts from a copy of that cache and feeds only the rest of its prompts, as a
server with prompt caching does. The layout puts the prefix in the first columns and left-pads
the remainders after it: position ids come from the mask (`router.loop.layout.Layout`), so every token
keeps the position it has without the prefix, and the outputs equal an uncached run up to float
rounding (the matmul shapes differ).
"""

from __future__ import annotations

import copy

import torch

from router.infra import clock
from router.loop.layout import Layout, left_pad, returned_cache
from router.backends import backend_of

MIN_SHARED_TOKENS = 32  # below this a shared prefix saves less than the cache copies cost


class SharedPrefix:
    """Token ids shared by every prompt, and each model's KV cache over them (made once)."""

    def __init__(self, ids: list[int]):
        if not ids:
            raise ValueError("a shared prefix needs at least one token")
        self.ids = list(ids)
        self._caches: dict[int, object] = {}  # id(model) -> cache over self.ids, batch 1
        self.seconds = 0.0  # time spent prefilling the prefix (once per model)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def common(cls, prompts: list[list[int]], min_tokens: int = MIN_SHARED_TOKENS) -> "SharedPrefix | None":
        """The longest prefix all prompts share, leaving each at least one token of its own; None
        when it is shorter than `min_tokens` (zero-shot or chat prompts)."""
        if not prompts:
            return None
        shortest = min(len(p) for p in prompts)
        n = 0
        first = prompts[0]
        while n < shortest - 1 and all(p[n] == first[n] for p in prompts):
            n += 1
        return cls(first[:n]) if n >= min_tokens else None

    def covers(self, rows: list[list[int]]) -> bool:
        """True when every row starts with the prefix and has a token after it."""
        n = len(self.ids)
        return all(len(r) > n and r[:n] == self.ids for r in rows)

    def layout(self, rows: list[list[int]], pad_id: int) -> Layout:
        """Columns [prefix | left-padded remainders], (B, P + R)."""
        rest_ids, rest_mask = left_pad([r[len(self.ids) :] for r in rows], pad_id)
        head = torch.tensor(self.ids, dtype=torch.long)[None].expand(len(rows), -1)
        return Layout(torch.cat([head, rest_ids], 1), torch.cat([torch.ones_like(head), rest_mask], 1))

    def ready(self, model) -> None:
        """Make the model's state over the prefix now, timed in `seconds`, so no batch pays for it (its
        backend's `warm_prefix`: torch keeps the KV cache of `cache_for`, an engine its own state)."""
        backend_of(model).warm_prefix(self, model)

    def cache_for(self, model, batch: int):
        """A fresh copy of the model's cache over the prefix, repeated for `batch` rows."""
        key = id(model)
        if key not in self._caches:
            started = clock.now()
            ids = torch.tensor([self.ids], device=next(model.parameters()).device)
            with torch.inference_mode():
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            self._caches[key] = returned_cache(out)
            self.seconds += clock.now() - started
        cache = copy.deepcopy(self._caches[key])
        if batch > 1:
            cache.batch_repeat_interleave(batch)
        return cache


def rows_of(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real tokens of each left-padded row."""
    return [input_ids[b][attention_mask[b].bool()].tolist() for b in range(input_ids.shape[0])]


def start_layout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: SharedPrefix | None, pad_id: int
) -> tuple[Layout, SharedPrefix | None]:
    """The loop's first layout, and the prefix it starts from (None when not every row has it)."""
    if prefix is not None:
        rows = rows_of(input_ids, attention_mask)
        if prefix.covers(rows):
            layout = prefix.layout(rows, pad_id)
            return Layout(layout.tokens.to(input_ids.device), layout.mask.to(input_ids.device)), prefix
    return Layout(input_ids, attention_mask), None
