"""Shared prompt prefixes (prefilled once) and stop tokens: every loop and the recorder give what
they give without them."""

import numpy as np
import pytest
import torch

from helpers import left_padded
from data_gen.scoring import score_batch
from router.tasks.metrics import mbpp_metric
from router.loop.baselines import generate_autoregressive, generate_sequence_cascade, generate_token_cascade
from router.decoding import generate
from router.loop.common import PADDING
from router.loop.prefix import SharedPrefix
from router.tasks.prompts import StopStrings, cut_at_stop, default_stops
from router.loop.tiny import ByteTokenizer
from router.pair import tiny_pair

HEAD = [(7 * i) % 90 + 3 for i in range(40)]  # a 40-token "few-shot context" every prompt starts with
PROMPTS = [HEAD + [5, 17, 33], HEAD + [9], HEAD + [11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def pair():
    drafter, verifier, _ = tiny_pair(seed=2)
    return drafter, verifier


def _new(out, row, width):
    return out.sequences[row, width:][out.sources[row] != PADDING].tolist()


def test_common_prefix_leaves_each_prompt_a_token_and_needs_a_minimum():
    prefix = SharedPrefix.common(PROMPTS)
    assert prefix.ids == HEAD and len(prefix) == 40
    assert SharedPrefix.common([HEAD + [1], HEAD + [1]]).ids == HEAD  # identical prompts keep their last token
    assert SharedPrefix.common([HEAD[:10] + [1], HEAD[:10] + [2]]) is None  # too short to be worth it
    assert SharedPrefix.common([]) is None
    assert prefix.covers(PROMPTS) and not prefix.covers([HEAD]) and not prefix.covers([[1] + HEAD])
    with pytest.raises(ValueError, match="at least one token"):
        SharedPrefix([])


@pytest.mark.parametrize(
    "method", ["lossless", "opt", "token_v2", "verifier", "drafter", "token_cascade", "sequence_cascade"]
)
def test_every_loop_decodes_the_same_from_a_shared_prefix(pair, method):
    drafter, verifier = pair
    ids, mask = left_padded(PROMPTS)
    prefix = SharedPrefix.common(PROMPTS)

    def run(**extra):
        common = dict(max_new_tokens=24, attention_mask=mask, **extra)
        if method in ("verifier", "drafter"):
            return generate_autoregressive(verifier if method == "verifier" else drafter, ids, role=method, **common)
        if method == "token_cascade":
            return generate_token_cascade(drafter, verifier, ids, alpha=0.3, **common)
        if method == "sequence_cascade":
            return generate_sequence_cascade(drafter, verifier, ids, alpha=0.5, **common)
        return generate(drafter, verifier, ids, rule=method, alpha=0.2, gamma=3, **common)

    plain, cached = run(), run(prefix=prefix)
    for b in range(len(PROMPTS)):
        assert _new(cached, b, ids.shape[1]) == _new(plain, b, ids.shape[1])
    assert prefix.seconds > 0
    # the prefix columns were never fed again: the verifier read fewer tokens per forward
    if method not in ("drafter", "sequence_cascade"):
        assert cached.stats["verifier_seconds"] <= plain.stats["verifier_seconds"] * 5  # sanity, not timing


def test_a_prompt_without_the_prefix_falls_back_to_a_full_prefill(pair):
    drafter, verifier = pair
    prompts = [PROMPTS[0], [4, 4, 4]]
    ids, mask = left_padded(prompts)
    prefix = SharedPrefix.common(PROMPTS)
    a = generate(drafter, verifier, ids, rule="lossless", max_new_tokens=12, attention_mask=mask, prefix=prefix)
    b = generate(drafter, verifier, ids, rule="lossless", max_new_tokens=12, attention_mask=mask)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("judge", [False, True])
def test_recording_with_a_shared_prefix_matches_a_full_prefill(pair, judge):
    drafter, verifier = pair
    conts = [[20, 21, 22, 23], [30, 31], [40, 41, 42]]
    args = (drafter, verifier, PROMPTS, conts, 96, 0, 4, "both", [1, 2, 3])
    plain = score_batch(*args, judge=judge)
    cached = score_batch(*args, judge=judge, prefix=SharedPrefix.common(PROMPTS))
    for a, b in zip(plain, cached):
        assert a.keys() == b.keys()
        for key in a:
            x, y = np.asarray(a[key]), np.asarray(b[key])
            if x.dtype.kind == "f":
                np.testing.assert_allclose(x, y, atol=2e-3, rtol=2e-3, err_msg=key)
            else:
                assert (x == y).all(), key


def _first_hit(tokens: list[int], stop: StopStrings) -> int:
    """How many tokens a row keeps: up to the one completing a stop string."""
    text = ""
    for i, t in enumerate(tokens):
        text += stop.text(t)
        if stop.found(text):
            return i + 1
    return len(tokens)


@pytest.mark.parametrize("method", ["lossless", "verifier", "token_cascade"])
def test_stop_strings_end_a_row_even_split_over_tokens(pair, method):
    drafter, verifier = pair
    ids, mask = left_padded(PROMPTS)
    tok = ByteTokenizer()

    def run(stop=None):
        common = dict(max_new_tokens=30, attention_mask=mask, stop=stop)
        if method == "verifier":
            return generate_autoregressive(verifier, ids, **common)
        if method == "token_cascade":
            return generate_token_cascade(drafter, verifier, ids, alpha=0.3, **common)
        return generate(drafter, verifier, ids, rule=method, gamma=4, **common)

    free = run()
    first = _new(free, 0, ids.shape[1])
    stop = StopStrings.build(tok, [tok.decode(first[6:8])])  # two tokens the model writes: a string across them
    out = run(stop)
    n = _first_hit(first, stop)
    assert n <= 8 and _new(out, 0, ids.shape[1]) == first[:n]
    for b in range(1, len(PROMPTS)):  # every other row ends at its own first hit (or runs on)
        row = _new(free, b, ids.shape[1])
        assert _new(out, b, ids.shape[1]) == row[: _first_hit(row, stop)]


def test_stop_strings_and_the_prompt_formats_stops():
    tok = ByteTokenizer()
    stop = StopStrings.build(tok, ["\n\n", "\nQuestion:"])
    assert stop.found("9.\n\nQ") and stop.found("9.\nQuestion: x") and not stop.found("9.\nQ")
    assert StopStrings.build(tok, []) is None
    with pytest.raises(ValueError, match="non-empty strings"):
        StopStrings.build(tok, [""])
    assert (
        cut_at_stop(" 4 + 5 = 9. So the answer is 9.\n\nQuestion: next", ["\n\n", "\nQuestion:"])
        == " 4 + 5 = 9. So the answer is 9."
    )
    assert cut_at_stop("9.\nQuestion: next", ["\n\n", "\nQuestion:"]) == "9."
    assert default_stops("gsm8k", chat=False) == ["\n\n", "\nQuestion:"] and default_stops("gsm8k", chat=True) == []
    assert default_stops("mbpp", chat=False) == [] and default_stops("mbpp", chat=True) == ["\n```\n"]
    # a code answer ends at its closing fence; the metric still reads the code block
    answer = "```python\ndef add(a, b):\n    return a + b\n```\n\nThis function adds."
    assert (
        mbpp_metric(cut_at_stop(answer, default_stops("mbpp", True)), {"tests": ["assert add(1, 2) == 3"]})["quality"]
        == 1
    )
