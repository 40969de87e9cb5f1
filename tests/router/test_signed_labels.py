"""Signed answer-level labels: which way keeping a draft moves the answer (harm, rescue, neutral), in
records (router.labels.signed_consequence) and label files (`specroute labels show`), and labels that
belong to the token their branch substituted (a near-tie the recording's drafter pass rounds otherwise
than the search's is not a label of the row's drafter token)."""

from pathlib import Path

import numpy as np

from data_gen.consequence import Searched, consequence_columns
from data_gen.label_store import LabelStore, substitutions
from data_gen.label_summary import signed_summary, summary_lines
from router.labels import AGREE, HARM, HARMLESS, IMPORTANT, NEUTRAL, RESCUE, UNTESTED, signed_consequence

REPO_LABELS = Path(__file__).resolve().parents[2] / "data" / "labels" / "gsm8k-consequence.jsonl.gz"


def test_an_important_mismatch_is_a_harm_or_a_rescue_by_the_verifiers_verdict():
    consequence = np.array([AGREE, HARMLESS, IMPORTANT, IMPORTANT, UNTESTED, HARMLESS])
    answer_correct = np.array([1, 1, 1, 0, 0, 0])
    assert signed_consequence(consequence, answer_correct).tolist() == [
        UNTESTED,
        NEUTRAL,
        HARM,  # right answer, the draft makes it wrong
        RESCUE,  # wrong answer, the draft makes it right
        UNTESTED,
        NEUTRAL,
    ]


def _entries():
    # tokens; verifier verdict; tested [position, label, stored token, branch correct, branch answer]
    right = {
        "tokens": [5, 6, 7, 8],
        "answer_correct": 1,
        "tested": [[0, HARMLESS, 5, 1, "1"], [2, IMPORTANT, 9, 0, "2"]],
    }
    wrong = {
        "tokens": [5, 6, 7, 8],
        "answer_correct": 0,
        "tested": [[1, IMPORTANT, 3, 1, "1"], [3, IMPORTANT, 4, 1, "1"]],
    }
    odd = {
        "tokens": [5, 6, 7, 8],
        "answer_correct": 0,
        "tested": [[0, HARMLESS, 4, 0, "3"], [1, IMPORTANT, 6, 1, "1"]],  # the two kinds that break the definition
    }
    return [right, wrong, odd, {"tokens": [1], "answer_correct": 1, "tested": []}]


def test_the_summary_counts_signs_problems_and_the_first_order_oracle():
    s = signed_summary(_entries())
    assert (s["harms"], s["rescues"], s["neutral"], s["tested"]) == (1, 3, 2, 6)
    assert (s["harmed_problems"], s["rescued_problems"], s["verifier_correct"], s["examples"]) == (1, 2, 2, 4)
    assert s["oracle_accuracy"] == (2 + 2) / 4 and s["verifier_accuracy"] == 0.5
    assert (s["harmless_token_not_in_answer"], s["important_token_is_answer"]) == (1, 1)
    text = "\n".join(summary_lines(s))
    assert "1 harms, 3 rescues, 2 neutral" in text and "2 tested mismatches store" in text


def test_a_replay_reads_a_harmless_substitution_from_the_answer_and_drops_an_impossible_one():
    odd = _entries()[2]
    assert substitutions(odd) == [[0, HARMLESS, 5, 0, "3"]]  # the answer goes on with the substituted token


def test_a_label_is_written_only_where_the_recordings_drafter_drafts_the_substituted_token():
    s = Searched(tokens=[5, 6, 7, 8], correct=1, answer="", labels={0: HARMLESS, 2: IMPORTANT})
    s.branches = {0: ("1", 1), 2: ("2", 0)}
    s.substituted = {0: 5, 2: 9}
    counts = {}
    kept = consequence_columns(s, np.array([5, 1, 9, 8]), counts)["consequence"].tolist()
    assert kept == [HARMLESS, UNTESTED, IMPORTANT, AGREE] and "consequence_labels_dropped" not in counts
    # the recording's pass drafts 3 at position 2 where the search substituted 9 (a near-tie rounded otherwise)
    dropped = consequence_columns(s, np.array([5, 1, 3, 8]), counts)["consequence"].tolist()
    assert dropped == [HARMLESS, UNTESTED, UNTESTED, AGREE] and counts["consequence_labels_dropped"] == 1


def test_the_shipped_gsm8k_label_file_signed_and_checked_against_its_definition():
    """data/labels/gsm8k-consequence.jsonl.gz, its first 498 problems (the file grows with `specroute labels export
    --add-only`, which keeps them as they are): 545 important = 382 harms + 163 rescues; 83 of the 233 problems
    the verifier gets wrong are rescued by one kept draft (first-order oracle 348/498). Its 61 harmless
    mismatches whose answer does not go on with the stored token (8 in the first 120 problems) and 11
    important ones storing the answer's own token are the recording's drafter token, not the search's:
    after `substitutions` every harmless label's token is the answer's."""
    store = LabelStore(REPO_LABELS)
    studied = list(store.entries.values())[:498]
    s = signed_summary(studied)
    assert (s["harms"], s["rescues"], s["neutral"]) == (382, 163, 2332)
    assert (s["verifier_correct"], s["rescued_problems"], s["examples"]) == (265, 83, 498)
    assert round(s["oracle_accuracy"] * 498) == 348
    assert (s["harmless_token_not_in_answer"], s["important_token_is_answer"]) == (61, 11)
    assert signed_summary(studied[:120])["harmless_token_not_in_answer"] == 8
    for e in store.entries.values():
        for t, kind, sub, *_ in substitutions(e):
            assert (sub == e["tokens"][t]) == (kind == HARMLESS)
