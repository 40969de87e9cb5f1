"""Small defects of the loop's bookkeeping: deferrals are counted by the policy's form (not by whether it reads
the drafts), and a block-size note points at the user's own call."""

from __future__ import annotations

import warnings

import torch

from helpers import left_padded, tiny_qwen
from router.decoding import generate
from router.policy import Needs, judges_the_draft
from router.rules import resolve_rule

PROMPTS = [[5, 17, 33, 41, 8], [9, 3]]


class KeepsTheDrafterReadingDrafts:
    """A custom policy that reads the drafts and their follow window yet returns q: it never defers."""

    name = "reads_drafts_keeps_q"
    needs = Needs(follow=2)

    def decide(self, view, alpha):
        view.read("drafts", self.name), view.read("follow", self.name)
        return view.q


class JudgeThatKeepsAll(KeepsTheDrafterReadingDrafts):
    """The same decision declared as a judge: pi is the one-hot draft, so every draft is kept."""

    name = "judge_keeps_all"
    form = "judge"

    def decide(self, view, alpha):
        return torch.nn.functional.one_hot(view.read("drafts", self.name), view.q.shape[-1]).to(view.q.dtype)


def _pair():
    return tiny_qwen(1), tiny_qwen(2)


def test_a_custom_policy_reading_drafts_counts_deferrals_where_pi_differs_from_q():
    drafter, verifier = _pair()
    ids, mask = left_padded(PROMPTS)
    policy = resolve_rule(KeepsTheDrafterReadingDrafts())
    assert "drafts" in policy.needs and not judges_the_draft(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its uncut-window note, tested below
        out = generate(drafter, verifier, ids, rule=policy, gamma=3, max_new_tokens=12, attention_mask=mask)
    # pi == q everywhere: counted as a judge, every draft it drew below probability one read as deferred
    assert out.stats["drafts_evaluated"] > 0 and out.stats["deferrals"] == 0


def test_a_declared_judge_counts_the_drafts_it_did_not_keep():
    drafter, verifier = _pair()
    ids, mask = left_padded(PROMPTS)
    policy = resolve_rule(JudgeThatKeepsAll())
    assert judges_the_draft(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate(drafter, verifier, ids, rule=policy, gamma=3, max_new_tokens=12, attention_mask=mask)
    assert out.stats["deferrals"] == 0 and out.stats["drafts_evaluated"] > 0
    assert judges_the_draft(resolve_rule("fly")) and not judges_the_draft(resolve_rule("token_v2"))


def test_the_block_size_note_points_at_the_users_call():
    drafter, verifier = _pair()
    ids, mask = left_padded(PROMPTS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate(
            drafter, verifier, ids, rule=KeepsTheDrafterReadingDrafts(), gamma=2, max_new_tokens=4, attention_mask=mask
        )
    notes = [w for w in caught if "uncut windows" in str(w.message)]
    assert notes and notes[0].filename == __file__, [(w.filename, w.lineno) for w in notes]
