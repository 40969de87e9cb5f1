"""A drafter without a network: drafts looked up in a reference answer (prompt lookup decoding).

The consequence search (data_gen/consequence.py) has the verifier finish branches that differ from
an answer it already decoded by one substituted token; a harmless branch soon says what the answer
said. Drafting the answer's own next tokens lets one verifier pass accept several tokens, and
`generate(LookupDrafter(...), verifier, ..., rule="lossless", temperature=0)` keeps every output
exactly the verifier's greedy one: lossless verification accepts a draft only where it is the
verifier's argmax, whatever proposed it.

A row's next draft: the token that follows, in its reference, the row's last n tokens (n = ngram
down to 1), at the match nearest the aligned position (the branch has as many tokens as the answer
up to the substitution). Where nothing matches, the row's distribution is uniform: with
`draft_stop` (any value above 1/V) the block ends once no row has a proposal, so failed lookups do
not pay for long verification passes.
"""

from __future__ import annotations

import numpy as np
import torch

from router.infra import clock
from router.loop.layout import Layout

MATCH_LOGIT = 40.0  # a proposal's logit (the others 0): probability 1 to float precision


class LookupDrafter:
    """Drafts for a batch from one reference per row: `references[b]` the tokens a row is expected
    to repeat (e.g. an earlier answer), `offsets[b]` the number of prompt tokens before them (the
    row's real tokens are prompt + its own answer)."""

    def __init__(self, references: list[list[int]], offsets: list[int], ngram: int = 3):
        if len(references) != len(offsets):
            raise ValueError(
                f"LookupDrafter: {len(references)} references but {len(offsets)} offsets (one each per row)"
            )
        if ngram < 1:
            raise ValueError(f"LookupDrafter: ngram must be >= 1, got {ngram}")
        self.references = [np.asarray(r, dtype=np.int64) for r in references]
        self.offsets = list(offsets)
        self.ngram = ngram

    def attach(self, vocab: int) -> "LookupCache":
        """The object the decoding loop drives in place of a drafter's CachedModel."""
        return LookupCache(self, vocab)

    def propose(self, row: int, seq: np.ndarray) -> int | None:
        """The next token for row `row` after its real tokens `seq` (prompt + answer so far), or None."""
        ref = self.references[row]
        aligned = len(seq) - self.offsets[row]  # the reference index of the next token, if lengths agree
        for n in range(min(self.ngram, len(seq), len(ref) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ref[:-1], n)  # (len(ref) - n, n), each followed
            starts = np.nonzero((windows == seq[-n:]).all(-1))[0]
            if len(starts):
                best = starts[np.abs(starts + n - aligned).argmin()]
                return int(ref[best + n])
        return None


class LookupCache:
    """The CachedModel interface (feed, start_from, crop_to, select_rows and the counters) over a
    LookupDrafter: no weights and no cache, proposals read from the layout's tokens."""

    def __init__(self, drafter: LookupDrafter, vocab: int):
        self.drafter, self.vocab = drafter, vocab
        self.rows = list(range(len(drafter.references)))  # which reference each current row uses
        self.n_cached = 0
        self.forwards = self.row_forwards = 0
        self.seconds = 0.0
        self.want_hidden, self.last_hidden = False, None

    def feed(self, layout: Layout, upto: int, keep: int) -> torch.Tensor:
        """Logits (B, keep, V) of the proposals after each of the last `keep` columns before `upto`."""
        started = clock.now()
        tokens, mask = layout.tokens[:, :upto].cpu().numpy(), layout.mask[:, :upto].bool().cpu().numpy()
        logits = torch.zeros(len(self.rows), keep, self.vocab, device=layout.tokens.device)
        for b, row in enumerate(self.rows):
            for k in range(keep):
                col = upto - keep + k
                seq = tokens[b, : col + 1][mask[b, : col + 1]]
                token = self.drafter.propose(row, seq) if mask[b, col] else None
                if token is not None and token < self.vocab:
                    logits[b, k, token] = MATCH_LOGIT
        self.n_cached = upto
        self.forwards += 1
        self.row_forwards += len(self.rows)
        self.seconds += clock.now() - started
        return logits

    def start_from(self, prefix, batch: int) -> None:
        self.n_cached = len(prefix)

    def crop_to(self, length: int) -> None:
        self.n_cached = min(self.n_cached, length)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in rows.tolist()]
