"""Window policies: the follow window's numbers, FLy's rule case by case and against a literal port of
its code, the loop's block-size checks, and the sampler's law at temperature 1 (chi-square)."""

import itertools
import math

import pytest
import torch

from helpers import StubLM
from router.view import BlockView
from router.decoding import generate
from router.rules import get_rule, register_rule, unregister_rule
from router.window.fly import FLY_ENTROPY_THRE, fly_keep, fly_rule
from router.window.follow import (
    DRAFT_SCALARS,
    block_followers,
    block_window,
    continuation_window,
    cut_window,
    draft_scalars,
)

SURE = [0.97, 0.01, 0.01, 0.005, 0.005]  # top-3 entropy 0.1216 < 0.3: FLy's gate is closed
UNSURE = [0.4, 0.3, 0.2, 0.05, 0.05]  # top-3 entropy 1.0496: the gate is open


def top3_entropy(row):
    return -sum(x * math.log(x) for x in sorted(row, reverse=True)[:3])


def test_draft_scalars_and_follow_window_by_hand():
    p = torch.tensor([[UNSURE, SURE, UNSURE]])  # (1, 3, 5)
    drafts = torch.tensor([[1, 0, 0]])  # a mismatch, then the verifier's argmax twice
    s = draft_scalars(drafts, p)
    assert DRAFT_SCALARS == ("p_draft", "agree", "top3_entropy", "p_max")
    assert torch.allclose(s[0, :, 0], torch.tensor([0.3, 0.97, 0.4]))
    assert s[0, :, 1].tolist() == [0.0, 1.0, 1.0]
    assert torch.allclose(s[0, :, 2], torch.tensor([top3_entropy(UNSURE), top3_entropy(SURE), top3_entropy(UNSURE)]))
    w = block_window(drafts, p, 2)
    assert w.values.shape == (1, 3, 2, 4) and w.width == 2
    assert w.valid[0].tolist() == [[True, True], [True, False], [False, False]]  # the block ends after 3 drafts
    assert torch.equal(w.values[0, 0], s[0, 1:3]) and torch.equal(w.values[0, 1, 0], s[0, 2])
    assert (w.values[0, 1, 1] == 0).all() and (w.values[0, 2] == 0).all()  # invalid entries are zeros
    assert w.scalar("agree")[0, 0].tolist() == [1.0, 1.0] and w.own("agree")[0].tolist() == [0.0, 1.0, 1.0]


def test_continuation_window_is_the_block_window_of_the_same_tokens():
    """The offline twin: a draft and its recorded continuation give the block's numbers at that draft."""
    g = torch.Generator().manual_seed(0)
    p = torch.randn(2, 6, 11, generator=g).softmax(-1)
    drafts = torch.randint(0, 11, (2, 6), generator=g)
    online = block_window(drafts, p, 3)
    for j in range(6):
        offline = continuation_window(draft_scalars(drafts[:, j:], p[:, j:]), 3)
        assert torch.equal(offline.at, online.at[:, j]) and torch.equal(offline.values, online.values[:, j])
        assert torch.equal(offline.valid, online.valid[:, j])


def test_a_recorded_window_cut_for_a_block_is_that_blocks_window():
    """Training's cut (follow_block): the uncut window of a draft with a long continuation, cut to the
    g - 1 - j drafts that follow it at position j of a block of g, is the block's own window there."""
    g = torch.Generator().manual_seed(1)
    p = torch.randn(1, 9, 11, generator=g).softmax(-1)
    drafts = torch.randint(0, 11, (1, 9), generator=g)
    block = 4  # the loop's block: the first 4 drafts
    online = block_window(drafts[:, :block], p[:, :block], 3)
    for j in range(block):
        uncut = continuation_window(draft_scalars(drafts[:, j:], p[:, j:]), 3)
        assert uncut.valid.all()  # recorded: every follower exists
        cut = cut_window(uncut, torch.tensor([block - 1 - j]))
        assert torch.equal(cut.valid, online.valid[:, j]) and torch.equal(cut.values, online.values[:, j])
        assert torch.equal(cut.at, online.at[:, j])


def test_block_followers_are_uniform_over_the_positions_of_a_block_and_seeded():
    n = block_followers(20000, 5)
    assert n.min() == 0 and n.max() == 4  # the last draft has none, the first has 4
    assert abs(n.mean() - 2.0) < 0.05 and all(abs((n == k).mean() - 0.2) < 0.02 for k in range(5))
    assert (block_followers(20000, 5) == n).all() and not (block_followers(20000, 5, seed=1) == n).all()
    assert (block_followers(7, 1) == 0).all()
    with pytest.raises(ValueError, match="at least 1 draft"):
        block_followers(3, 0)


def _fly_case(rows, drafts, win_len=2, alpha=FLY_ENTROPY_THRE):
    p = torch.tensor([rows])
    d = torch.tensor([drafts])
    return fly_keep(block_window(d, p, win_len), alpha, win_len)[0].tolist()


def test_fly_gate_closed_refuses_a_mismatch_even_when_the_window_agrees():
    # position 0: a mismatch (draft 1, argmax 0) where the verifier is sure; positions 1-3 agree
    assert _fly_case([SURE, SURE, SURE, SURE], [1, 0, 0, 0]) == [False, False, False, False]


def test_fly_gate_open_and_window_agrees_keeps_the_mismatch():
    # position 0 unsure, the next win_len - 1 = 1 draft is the verifier's argmax, 2 drafts follow
    assert _fly_case([UNSURE, SURE, SURE, SURE], [1, 0, 0, 0]) == [True, False, False, False]
    # win_len 3: the next 2 drafts must agree
    assert _fly_case([UNSURE, SURE, UNSURE, SURE, SURE], [1, 0, 0, 0, 0], win_len=3)[0] is True


def test_fly_gate_open_and_window_disagrees_refuses():
    assert _fly_case([UNSURE, SURE, SURE, SURE], [1, 3, 0, 0]) == [False, False, False, False]
    assert _fly_case([UNSURE, SURE, UNSURE, SURE, SURE], [1, 0, 2, 0, 0], win_len=3)[0] is False


def test_fly_window_cut_by_the_block_end_falls_back_to_verification():
    # positions 1 and 2 are unsure mismatches whose next draft agrees; position 1 has 2 drafts after it
    # (kept), position 2 only 1 (< win_len 2: cut, refused), as FLy's `updated_accept[:, -win_len:] &= ...`
    assert _fly_case([SURE, UNSURE, UNSURE, SURE], [0, 1, 1, 0]) == [False, False, False, False]
    assert _fly_case([SURE, UNSURE, SURE, SURE], [0, 1, 0, 0]) == [False, True, False, False]
    assert _fly_case([SURE, SURE, UNSURE, SURE], [0, 0, 1, 0]) == [False, False, False, False]


def _fly_reference(accepted, entropy, win_len, thre):
    """AMD-AGI/FLy fly/models/FLy.py (6667ae8) generate_chunks, lines 1094-1122, ported line for line."""
    rej_mask = ~((entropy < thre) & (~accepted))
    if accepted.shape[1] >= win_len:
        pattern = torch.ones(win_len, dtype=torch.bool)
        pattern[0] = False
        unfold_accept = accepted.unfold(1, win_len, 1)
        matched = torch.all(unfold_accept == pattern, dim=-1)
        updated_mask = torch.zeros_like(accepted, dtype=torch.bool)
        updated_mask[:, : matched.shape[1]] = matched
        updated_accept = accepted | updated_mask
        updated_accept[:, -win_len:] = updated_accept[:, -win_len:] & accepted[:, -win_len:]
        accepted = updated_accept
    return accepted & rej_mask


@pytest.mark.parametrize("win_len,k", [(2, 5), (3, 8), (6, 15), (4, 4)])
def test_fly_matches_a_literal_port_of_its_code(win_len, k):
    g = torch.Generator().manual_seed(win_len * 100 + k)
    for _ in range(200):
        p = (torch.randn(1, k, 7, generator=g) * 3).softmax(-1)
        agree = torch.rand(1, k, generator=g) < 0.75
        drafts = torch.where(agree, p.argmax(-1), (p.argmax(-1) + 1) % 7)
        window = block_window(drafts, p, win_len)
        ours = (window.own("agree") > 0) | fly_keep(window, 0.5, win_len)
        ref = _fly_reference(drafts == p.argmax(-1), window.own("top3_entropy"), win_len, 0.5)
        assert torch.equal(ours, ref), (drafts, p.argmax(-1))


def test_fly_rule_target_keeps_or_verifies_and_needs_its_inputs():
    rule = fly_rule(2, "fly_w2")
    p = torch.tensor([[UNSURE, SURE, SURE, SURE]])
    q = torch.full_like(p, 0.2)
    drafts = torch.tensor([[1, 0, 0, 0]])
    pi = rule.decide(BlockView(q, p, drafts=drafts, follow=block_window(drafts, p, 2)), 0.3)
    assert torch.equal(pi[0, 0], torch.nn.functional.one_hot(torch.tensor(1), 5).float())  # kept
    assert torch.equal(pi[0, 1:], p[0, 1:])  # verified losslessly
    lossless = rule.decide(BlockView(q, p, drafts=drafts, follow=lambda: block_window(drafts, p, 2)), 1.1)
    assert torch.equal(lossless, p)  # alpha 1.1 > ln 3: every mismatch refused
    with pytest.raises(ValueError, match="rule fly_w2 reads 'drafts'.*declare 'drafts'"):
        rule.target(q, p, 0.3)
    with pytest.raises(ValueError, match="outside fly_w2's range"):
        rule.decide(BlockView(q, p, drafts=drafts, follow=block_window(drafts, p, 2)), 1.5)
    with pytest.raises(ValueError, match="win_len must be an integer >= 1"):
        fly_rule(0)
    assert get_rule("fly").needs.follow == 6 and get_rule("fly").min_gamma == 7


def _stubs(vocab=5):
    """A pair over 5 tokens whose verifier is unsure at even positions and sure at odd ones."""
    q = torch.tensor([0.1, 0.5, 0.2, 0.1, 0.1])  # the drafter prefers token 1
    p_unsure, p_sure = torch.tensor(UNSURE), torch.tensor(SURE)  # the verifier's argmax is 0
    drafter = StubLM(probs=lambda t: q, vocab=vocab, eos=100)
    verifier = StubLM(probs=lambda t: p_unsure if t % 2 == 0 else p_sure, vocab=vocab, eos=100)
    return drafter, verifier


def test_generate_refuses_block_sizes_a_window_rule_cannot_use():
    drafter, verifier = _stubs()
    ids = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="use gamma >= 7"):
        generate(drafter, verifier, ids, rule="fly", alpha=0.3, gamma=4)
    with pytest.raises(ValueError, match="gamma auto would choose shorter ones"):
        generate(drafter, verifier, ids, rule="fly", alpha=0.3, gamma="auto")


def test_greedy_fly_decodes_what_flys_algorithm_emits():
    """Temperature 0, gamma 3, win_len 2: the drafter always drafts 1, the verifier's argmax is 0, the
    gate is open at even positions. FLy keeps a block's first draft (an unsure mismatch) only if the next
    draft agrees, which it never does here, so every block emits the verifier's token."""
    drafter, verifier = _stubs()
    register_rule(fly_rule(2, "fly_w2"))
    try:
        out = generate(drafter, verifier, torch.zeros(1, 1, dtype=torch.long), rule="fly_w2", alpha=0.3, gamma=3)
        lossless = generate(drafter, verifier, torch.zeros(1, 1, dtype=torch.long), rule="lossless", gamma=3)
    finally:
        unregister_rule("fly_w2")
    assert torch.equal(out.sequences, lossless.sequences) and (out.sequences[0, 1:] == 0).all()
    assert out.stats["deferrals"] == out.stats["drafts_evaluated"]  # nothing kept


def test_greedy_fly_keeps_an_unsure_mismatch_the_verifier_then_agrees_with():
    """The drafter writes 1 at the first new position (the verifier, unsure there, prefers 0), then 0s;
    FLy (win_len 2, gamma 3) keeps the 1, since the next draft is the verifier's argmax; lossless does not."""
    drafter = StubLM(lambda t: 1 if t == 1 else 0, vocab=5, eos=100)
    verifier = StubLM(probs=lambda t: torch.tensor(UNSURE if t == 1 else SURE), vocab=5, eos=100)
    ids = torch.zeros(1, 1, dtype=torch.long)
    register_rule(fly_rule(2, "fly_w2"))
    try:
        out = generate(drafter, verifier, ids, rule="fly_w2", alpha=0.3, gamma=3, max_new_tokens=8)
        closed = generate(drafter, verifier, ids, rule="fly_w2", alpha=1.1, gamma=3, max_new_tokens=8)
    finally:
        unregister_rule("fly_w2")
    assert out.sequences[0, 1:].tolist() == [1, 0, 0, 0, 0, 0, 0, 0] and out.sources[0, :4].tolist() == [0, 0, 0, 1]
    assert closed.sequences[0, 1:].tolist() == [0] * 8  # gate closed everywhere: the verifier's tokens


def _window_law(q0, p0, keep_prob):
    """The law of a block's first token under a window policy (docs/method.md, window policies):
    pi(v) = q(v) k(v) + (1 - k(v)) min(q(v), p(v)) + beta r(v), k(v) the probability (over the drafts
    after it) that the policy keeps draft v, beta = sum_u (1 - k(u)) max(0, q(u) - p(u)), r the
    normalised residual max(0, p - q)."""
    k = keep_prob
    beta = ((1 - k) * (q0 - p0).clamp_min(0)).sum()
    residual = (p0 - q0).clamp_min(0) / (p0 - q0).clamp_min(0).sum()
    return q0 * k + (1 - k) * torch.minimum(q0, p0) + beta * residual


def test_window_sampler_draws_the_stated_law_at_temperature_1():
    """gamma 3, win_len 2: the first draft is kept when it is a mismatch, the gate is open there and the
    second draft is the verifier's argmax (probability q(0) = 0.1); the law of the first token is checked
    by chi-square over 20,000 rows, and the stated law against enumeration of the block's drafts."""
    vocab, n = 5, 20000
    q = torch.tensor([0.1, 0.5, 0.2, 0.1, 0.1], dtype=torch.float64)
    p_unsure = torch.tensor(UNSURE, dtype=torch.float64)
    p_sure = torch.tensor(SURE, dtype=torch.float64)
    drafter = StubLM(probs=lambda t: q.float(), vocab=vocab, eos=100)
    verifier = StubLM(probs=lambda t: (p_unsure if t == 1 else p_sure).float(), vocab=vocab, eos=100)
    register_rule(fly_rule(2, "fly_w2"))
    try:
        out = generate(
            drafter, verifier, torch.zeros(n, 1, dtype=torch.long), rule="fly_w2", alpha=0.3, gamma=3,
            temperature=1.0, max_new_tokens=4, seed=5,
        )  # fmt: skip
    finally:
        unregister_rule("fly_w2")
    # max_new_tokens 4: the first block has all 3 drafts (a block never drafts past the length limit)
    # position 1 (the first draft) has the unsure verifier: every draft but 0 is a mismatch with the gate
    # open; it is kept iff the second draft (position 2, sure verifier, argmax 0) is 0: probability q(0)
    keep = torch.tensor([0.0, 0.1, 0.1, 0.1, 0.1], dtype=torch.float64)
    expected = _window_law(q, p_unsure, keep)
    assert torch.allclose(expected, _enumerated_first_token(q, p_unsure, p_sure))
    freq = torch.bincount(out.sequences[:, 1], minlength=vocab).double()
    stat = float(((freq - n * expected) ** 2 / (n * expected)).sum())  # chi-square, 4 degrees of freedom
    assert stat < 18.47, (freq / n, expected)  # p = 0.001


def _enumerated_first_token(q, p0, p1):
    """The first emitted token's law by brute force over the block's first two drafts (the third only
    has to exist: the window of the first draft reads the second's agreement)."""
    law = torch.zeros_like(q)
    residual = (p0 - q).clamp_min(0) / (p0 - q).clamp_min(0).sum()
    for d0, d1 in itertools.product(range(len(q)), repeat=2):
        weight = q[d0] * q[d1]
        kept = d0 != int(p0.argmax()) and d1 == int(p1.argmax())
        accept = 1.0 if kept else min(1.0, float(p0[d0] / q[d0]))
        law[d0] += weight * accept
        law += weight * (1 - accept) * residual
    return law


def test_eval_grid_runs_window_rules_only_at_block_sizes_they_can_use(capsys):
    from eval.config import EvalConfig
    from eval.grid import method_alphas, online_methods
    from router.infra.config import ConfigError

    assert "fly" not in online_methods(EvalConfig(gamma=5), {})
    assert "leaving out ['fly'] (they need longer blocks than gamma 5" in capsys.readouterr().out
    assert "fly" in online_methods(EvalConfig(gamma=5, gammas={"fly": 15}), {})
    assert "fly" in online_methods(EvalConfig(gamma=8), {})
    with pytest.raises(ConfigError, match=r"fly needs blocks of at least 7 drafts .* gammas: \{fly: 15\}"):
        online_methods(EvalConfig(gamma=5, online_methods=["fly", "lossless"]), {})
    with pytest.raises(ConfigError, match=r"gammas are set for \['opt'\]"):
        online_methods(EvalConfig(online_methods=["lossless"], gammas={"opt": 8}), {})
    with pytest.raises(ConfigError, match="each an integer >= 1"):
        EvalConfig(gammas={"fly": 0})
    assert method_alphas("fly", EvalConfig(), {}, [0.1]) == [0.3, 0.6, 0.9]  # no offline curve yet


def test_a_points_fingerprint_holds_its_own_block_size():
    from eval.points import point_fingerprint

    run = {"gamma": 5, "gammas": {"fly": 15}, "routers": {}}
    assert point_fingerprint(run, "fly") == {"gamma": 15, "routers": {}}
    assert point_fingerprint(run, "opt") == {"gamma": 5, "routers": {}}  # fly's gamma does not redo opt
