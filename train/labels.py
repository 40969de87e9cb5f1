"""Per-token router labels from records (docs/method.md, Learned routers): the quality gap of keeping the drafter.

gap > 0 means the verifier is better at that position (deferring pays). `y` is the trajectory's
next token (the gold token in gold mode).
"""

from __future__ import annotations

import numpy as np

from router.labels import IMPORTANT, SIGNED_LABELS, UNTESTED, signed_consequence

TOKEN_TARGET = "token_label"  # per drafted token v: 1[v != y] - (1 - p(y)); token head only (train/data.py)
JUDGE_TARGET = "greedy_01_gap"  # the judge head's label: the greedy gap of keeping the drafter's argmax
# consequence-mode records (data_gen/consequence.py): 1 where keeping the drafter's argmax changes the
# answer's correctness, 0 where it does not (or where it is the token anyway); untested rows weigh 0
CONSEQUENCE_TARGET = "consequence"
# consequence-mode records with consequence_horizon > 0 (data_gen/horizon.py): SelfJudge's short-horizon score
# of keeping the drafter's argmax where it is not the token (regression: larger = the swap derails more), 0
# where it is the token; every mismatch is scored, tested by the full search or not
HORIZON_TARGET = "horizon_score"
# consequence-mode records, signed (router.labels.signed_consequence): the answer accuracy lost by keeping the
# drafter's argmax, +1 at a harm (the verifier's answer is right, the draft makes it wrong), -1 at a rescue (the
# draft makes a wrong answer right), 0 at a neutral mismatch or where d is the token; untested rows weigh 0.
# A router trained on it defers where it predicts a loss above alpha, and keeps drafts it predicts to rescue.
SIGNED_TARGET = "signed"
TARGETS = (
    "logloss_gap",
    "expected_01_gap",
    "greedy_01_gap",
    TOKEN_TARGET,
    CONSEQUENCE_TARGET,
    HORIZON_TARGET,
    SIGNED_TARGET,
)
ANSWER_TARGETS = (CONSEQUENCE_TARGET, HORIZON_TARGET, SIGNED_TARGET)  # labels of consequence-mode rows
EPS = 1e-12


def weights(cols: dict, target: str) -> np.ndarray:
    """Per-row weights: 1, except rows the consequence search did not test (weight 0: no label)."""
    if target in (CONSEQUENCE_TARGET, SIGNED_TARGET) and "consequence" in cols:
        return (np.asarray(cols["consequence"]) != UNTESTED).astype(np.float32)
    if target == HORIZON_TARGET and "horizon_score" in cols:  # a mismatch the score missed weighs 0
        agree = np.asarray(cols["q_argmax"]) == np.asarray(cols["token"])
        return (agree | np.isfinite(np.asarray(cols["horizon_score"], np.float64))).astype(np.float32)
    return np.ones(len(cols["token"]), np.float32)


def labels(cols: dict, target: str) -> np.ndarray:
    """Gap per row from record columns q_token, p_token, q_argmax, p_argmax, token (answer-level targets: from
    their label columns)."""
    if target in ANSWER_TARGETS:
        return _answer_labels(cols, target)
    q_y, p_y = np.asarray(cols["q_token"], np.float64), np.asarray(cols["p_token"], np.float64)
    if target == "logloss_gap":  # E[-log q] - E[-log p] with one sample of y
        return (np.log(np.maximum(p_y, EPS)) - np.log(np.maximum(q_y, EPS))).astype(np.float32)
    if target == "expected_01_gap":  # (1 - q(y)) - (1 - p(y))
        return (p_y - q_y).astype(np.float32)
    if target == "greedy_01_gap":
        y = np.asarray(cols["token"])
        return (np.asarray(cols["q_argmax"]) != y).astype(np.float32) - (np.asarray(cols["p_argmax"]) != y).astype(
            np.float32
        )
    if target == TOKEN_TARGET:
        raise ValueError(f"{TOKEN_TARGET} is a per-candidate label: train it with head: token")
    raise KeyError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")


def _answer_labels(cols: dict, target: str) -> np.ndarray:
    """The labels of consequence-mode rows (ANSWER_TARGETS), from their label columns."""
    if target == CONSEQUENCE_TARGET:
        if "consequence" not in cols:
            raise ValueError(
                "target consequence needs consequence labels: record with modes: [consequence] and train "
                "with mode: consequence"
            )
        return (np.asarray(cols["consequence"]) == IMPORTANT).astype(np.float32)
    if target == SIGNED_TARGET:
        if "consequence" not in cols or "answer_correct" not in cols:
            raise ValueError(
                "target signed needs consequence labels and the verifier's answer verdicts: record with modes: "
                "[consequence] and train with mode: consequence"
            )
        signs = signed_consequence(cols["consequence"], cols["answer_correct"])
        tested = np.isin(signs, list(SIGNED_LABELS.values()))
        return np.where(tested, -signs, 0).astype(np.float32)  # untested rows weigh 0
    if target == HORIZON_TARGET:
        if "horizon_score" not in cols:
            raise ValueError(
                "target horizon_score needs short-horizon scores: record with modes: [consequence] and "
                "consequence_horizon: 5 (or more), and train with mode: consequence"
            )
        return np.nan_to_num(np.asarray(cols["horizon_score"], np.float32), nan=0.0)
    raise KeyError(target)
