"""Early stop of a consequence branch once it has re-joined the answer it departed from.

A branch substitutes the drafter's token d for the verifier's token v at answer position t and lets
the verifier finish the answer. Most branches are harmless rephrasings that soon say word for word
what the answer said; from there on the verifier mostly writes the answer's own remainder again,
so decoding it to the end costs a whole answer and rarely changes the verdict. With a stretch of R
tokens, a branch ends as soon as its last R tokens repeat R consecutive tokens of the answer after
position t (the occurrence nearest the branch's own length, for text that repeats itself), and the
answer's remainder after that stretch is spliced on. This is an approximation: the verifier may
still leave the answer again later. docs/results.md measures how often the spliced verdict agrees
with the full-answer one, and what it saves per labelled mismatch.
"""

from __future__ import annotations

from router.tasks.prompts import StopStrings


class RejoinStop:
    """The stop-string interface the decoding loop reads (`text`, `found`, `ends`, `window`) for a batch
    of branches: the task's stop strings (or none) plus the re-join test. Row b decodes after
    `starts[b]` (the answer up to the substitution, d included: the branch's first len(starts[b])
    tokens) and departs from `references[b]` at `departures[b]` (t)."""

    def __init__(
        self,
        stop: StopStrings | None,
        references: list[list[int]],
        starts: list[list[int]],
        departures: list[int],
        stretch: int,
    ):
        if stretch < 1:
            raise ValueError(f"RejoinStop: stretch must be >= 1 token, got {stretch}")
        self.stop, self.stretch = stop, stretch
        self.start_lengths = [len(s) for s in starts]
        self.window = stop.window if stop is not None else 1
        self.references = [list(r) for r in references]
        self.rejoined: dict[int, int] = {}  # row -> the answer index its remainder is spliced from
        # per row: each R-gram of the answer strictly after the departure -> the indices just past it
        self.grams = []
        for ref, t in zip(self.references, departures):
            grams: dict[tuple, list[int]] = {}
            for j in range(t + 1 + stretch, len(ref) + 1):
                grams.setdefault(tuple(ref[j - stretch : j]), []).append(j)
            self.grams.append(grams)

    def text(self, token: int) -> str:
        return self.stop.text(token) if self.stop is not None else ""

    def found(self, tail: str) -> bool:
        return self.stop is not None and self.stop.found(tail)

    def ends(self, row: int, tokens: list[int]) -> bool:
        """True once the branch's last R tokens, all decoded after the substitution, repeat the answer's."""
        if len(tokens) < self.stretch:  # the stretch must not reach back over d into the shared prefix
            return False
        ends_at = self.grams[row].get(tuple(tokens[-self.stretch :]))
        if not ends_at:
            return False
        length = self.start_lengths[row] + len(tokens)  # the branch's length so far, in the answer's index space
        self.rejoined[row] = min(ends_at, key=lambda j: abs(j - length))
        return True

    def remainder(self, row: int) -> list[int]:
        """The answer's tokens spliced after the row's branch (none if it did not re-join)."""
        j = self.rejoined.get(row)
        return self.references[row][j:] if j is not None else []
