"""The early stop of consequence branches that re-join their answer (data_gen/rejoin.py)."""

import pytest
import torch

from data_gen.consequence import ConsequenceSearch
from data_gen.rejoin import RejoinStop
from router.pair import tiny_pair
from router.tasks.prompts import StopStrings
from helpers import length_metric


def test_a_branch_ends_where_it_repeats_the_answer_after_the_substitution():
    answer = [1, 2, 3, 4, 5, 6, 3, 4, 9, 3, 4, 8]
    start = [1, 2, 77]  # the drafter's 77 replaces the answer's 3 at t = 2
    stop = RejoinStop(None, [answer], [start], [2], stretch=2)
    assert not stop.ends(0, [3])  # one token: not a stretch yet
    assert not stop.ends(0, [3, 5])  # (3, 5) is nowhere in the answer
    # (3, 4) ends at answer index 4 too, but that stretch starts at t: not after the substitution. Of its
    # occurrences after it (ending at 8 and 11) the one nearest the branch's own length (3 + 4 = 7) counts
    assert stop.ends(0, [6, 6, 3, 4])
    assert stop.rejoined == {0: 8} and stop.remainder(0) == [9, 3, 4, 8]
    assert RejoinStop(None, [answer], [start], [2], stretch=2).remainder(0) == []  # not re-joined: nothing spliced
    with pytest.raises(ValueError, match="stretch must be >= 1"):
        RejoinStop(None, [answer], [start], [2], stretch=0)


def test_stop_strings_still_end_a_branch():
    class Tok:
        name_or_path = "letters"

        def __len__(self):
            return 4

        def decode(self, i):
            return "ab\n#"[i[0] if isinstance(i, list) else i]

    strings = StopStrings.build(Tok(), ["\n"])
    stop = RejoinStop(strings, [[0, 1, 0, 1]], [[0]], [0], stretch=3)
    assert stop.window == strings.window and stop.text(2) == "\n" and stop.found("a\n") and not stop.found("ab")
    assert not stop.ends(0, [1, 0])


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(seed=2, noise=0.05)


def _search(pair, rejoin, budget=40):
    drafter, verifier, tok = pair
    return ConsequenceSearch(drafter, verifier, tok, length_metric, [], 259, 0, budget, 3, batch_size=4, rejoin=rejoin)


@torch.no_grad()
def test_rejoined_branches_are_the_full_branches_cut_where_they_repeat_the_answer(pair):
    """Each branch decodes the same tokens as without the stop up to where it repeats R answer tokens;
    the answer's remainder is spliced there. A stretch longer than any answer never stops a branch, so
    the search is then exactly the full one."""
    prompts = [[7, 9, 11, 13, 20 + i, 30 + 2 * i] for i in range(6)]
    full, never = _search(pair, 0), _search(pair, 10_000)
    found_full, found_never = full.run(prompts, [{}] * 6), never.run(prompts, [{}] * 6)
    assert [(s.tokens, s.labels) for s in found_full] == [(s.tokens, s.labels) for s in found_never]
    assert never.rejoined_branches == 0 and never.branch_tokens == full.branch_tokens
    # one round of branches, decoded both ways from the same answers
    answers = [s.tokens for s in found_full]
    todo = [(i, t) for i, s in enumerate(found_full) for t in list(s.labels)[:1]]
    starts = [answers[i][:t] + [answers[i][t] + 1] for i, t in todo]
    refs, deps = [answers[i] for i, _ in todo], [t for _, t in todo]
    args = ([prompts[i] + s for (i, _), s in zip(todo, starts)], [40 - len(s) for s in starts])
    cut = _search(pair, 3)
    whole = full.continue_answers(*args, ended=starts, references=refs, departures=deps)
    short = cut.continue_answers(*args, ended=starts, references=refs, departures=deps)
    assert cut.rejoined_branches > 0 and cut.branch_tokens < sum(map(len, whole))
    for w, got, ref, start, t, budget in zip(whole, short, refs, starts, deps, args[1]):
        # expected: the full branch up to the first token after which RejoinStop fires, then the answer's rest
        probe = RejoinStop(None, [ref], [start], [t], 3)
        k = next((k for k in range(1, len(w) + 1) if probe.ends(0, w[:k])), None)
        want = w if k is None else (w[:k] + probe.remainder(0))[:budget]
        assert got == want
    assert sum(got != w for got, w in zip(short, whole)) > 0  # some spliced branch differs from the full one
