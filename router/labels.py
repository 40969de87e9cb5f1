"""Answer-level labels of a tested mismatch, and the first-order accuracy change they give a policy.

Consequence labels (data_gen/consequence.py) say whether keeping the drafter's token changes the answer's verdict;
signed labels (derived, never stored) say which way: a harm on a right answer, a rescue on a wrong one. Records keep
them in the `consequence` and `answer_correct` columns (router/records.py); docs/method.md defines the measures.
"""

from __future__ import annotations

import numpy as np

# Consequence labels (data_gen/consequence.py): what keeping the drafter's argmax does to the answer's correctness
AGREE = -1  # the drafter's argmax is the trajectory's token: nothing to decide
HARMLESS = 0  # a mismatch whose substitution leaves the answer's correctness unchanged
IMPORTANT = 1  # a mismatch whose substitution changes it
UNTESTED = -2  # a mismatch past the search's budget, or a row not made by the search
CONSEQUENCE_LABELS = {"agree": AGREE, "harmless": HARMLESS, "important": IMPORTANT, "untested": UNTESTED}
# Signed consequence: which way keeping the drafter's token moves the answer. An important mismatch is a harm
# where the verifier's answer is right (the draft makes it wrong) and a rescue where it is wrong (the draft
# makes it right): opposite outcomes that "important" counts alike. Derived from `consequence` and
# `answer_correct` (signed_consequence), never stored twice.
HARM = -1
NEUTRAL = 0  # a harmless mismatch: the verdict stays
RESCUE = 1
SIGNED_LABELS = {"harm": HARM, "neutral": NEUTRAL, "rescue": RESCUE}


def signed_consequence(consequence, answer_correct) -> np.ndarray:
    """Per row (N,) int8: HARM, NEUTRAL or RESCUE at a tested mismatch (consequence HARMLESS or IMPORTANT,
    with the verifier's answer's verdict `answer_correct` 1/0), UNTESTED elsewhere (agreements, untested
    mismatches, rows the search did not make)."""
    consequence, answer_correct = np.asarray(consequence), np.asarray(answer_correct)
    sign = np.where(answer_correct == 1, HARM, RESCUE)  # an important mismatch flips the verdict
    out = np.where(consequence == IMPORTANT, sign, np.where(consequence == HARMLESS, NEUTRAL, UNTESTED))
    return out.astype(np.int8)


def first_order_change(signs: np.ndarray, kept: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
    """Per problem (n,) the first-order accuracy change of keeping the `kept` (N,) rows' drafts instead of the
    verifier's tokens: +1 where a kept draft rescues a wrong answer, -1 where one harms a right one (an
    answer flips once, whichever of its flipping drafts is kept; a problem's answer is right or wrong, so
    it has rescues or harms, never both). `signs` (N,) from signed_consequence, `index` (N,) problem 0..n-1."""

    def kept_count(sign: int) -> np.ndarray:
        return np.bincount(index, weights=((signs == sign) & kept).astype(np.float64), minlength=n)

    return np.minimum(kept_count(RESCUE), 1) - np.minimum(kept_count(HARM), 1)
