"""Rules: hand-computed targets, ties, raw vs scaled probabilities, alpha endpoints, bad input."""

import math

import pytest
import torch

from router.rules import RULES, get_rule
from router.targets import tv_distance

Q = torch.tensor([0.5, 0.3, 0.2])
P = torch.tensor([0.2, 0.7, 0.1])  # TV(p, q) = 0.4


PER_POSITION = [n for n in RULES if get_rule(n).form != "window"]  # window rules: tests/router/window/test_window.py


def rand_dist(*shape, seed=0, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * sharp).softmax(-1)


def test_registry_names_and_unknown_rule():
    assert RULES == (
        "chow",
        "diff",
        "opt",
        "token_v1",
        "token_v2",
        "token_v3",
        "kl_gate",
        "entropy_gate",
        "lossy",
        "mixture",
        "lossless",
        "drafter",
        "fly",
    )
    with pytest.raises(KeyError, match="known rules: chow, diff"):
        get_rule("nope")


@pytest.mark.parametrize(
    "name,alpha,defer",
    [
        ("chow", 0.4, True),  # 0.5 < 1 - 0.4 = 0.6
        ("chow", 0.5, False),  # tie 0.5 == 0.5 keeps the drafter
        ("chow", 0.6, False),
        ("diff", 0.1, True),  # 0.5 < 0.7 - 0.1
        ("diff", 0.2, False),  # tie keeps the drafter
        ("opt", 0.4, True),  # 0.5 < 0.7 - 0.4 * 0.4 = 0.54
        ("opt", 0.5, False),  # tie: 0.7 - 0.5 * 0.4 = 0.5
        ("opt", -math.inf, True),
        ("opt", math.inf, False),
        ("kl_gate", 0.3, True),  # KL(P || Q) = 0.3405 > 0.3
        ("kl_gate", 0.35, False),
        ("entropy_gate", 0.4, True),  # exp(-H(P)) = exp(-0.8018) = 0.4485 > 0.4: the verifier is nearly sure
        ("entropy_gate", 0.5, False),
    ],
)
def test_cascade_rules_hand_computed(name, alpha, defer):
    pi = get_rule(name).target(Q, P, alpha)
    assert torch.allclose(pi, P if defer else Q)


def test_kl_gate_verifies_where_the_verifier_is_confident():
    confident = torch.tensor([0.05, 0.92, 0.03])  # max p > 0.9: lossless there, whatever the KL
    assert torch.allclose(get_rule("kl_gate").target(Q, confident, 1e6), confident)


def test_token_rules_hand_computed():
    # token_v1 alpha 0.3: keep v iff q(v) >= 0.7 - 0.3 = 0.4 -> A = {0}; eta = 0.5
    assert torch.allclose(get_rule("token_v1").target(Q, P, 0.3), torch.tensor([0.5 + 0.1, 0.35, 0.05]))
    # token_v2 alpha 0.5: keep v iff p(v) >= 0.2 -> A = {0, 1} (0.2 is a tie, kept); eta = 0.2
    assert torch.allclose(get_rule("token_v2").target(Q, P, 0.5), torch.tensor([0.5 + 0.04, 0.3 + 0.14, 0.02]))
    # token_v3 alpha 0.5: keep v iff p(v) >= 0.35 -> A = {1}; eta = 0.7
    assert torch.allclose(get_rule("token_v3").target(Q, P, 0.5), torch.tensor([0.14, 0.3 + 0.49, 0.07]))


def test_lossy_hand_computed():
    # alpha 0.5: a = min(1, p / (0.5 q)) = [0.8, 1, 1]; kept = [0.4, 0.3, 0.2]; rejected mass 0.1
    # residual normalize(max(0, p - q)) = [0, 1, 0]
    assert torch.allclose(get_rule("lossy").target(Q, P, 0.5), torch.tensor([0.4, 0.4, 0.2]))


def test_decisions_use_raw_and_targets_use_scaled():
    q_raw, p_raw = Q, P
    q = torch.tensor([1.0, 0.0, 0.0])  # temperature-0 drafter: one-hot
    p = torch.tensor([0.0, 1.0, 0.0])
    # chow alpha 0.4 on raw: 0.5 < 0.6 -> defer; on the scaled one-hot it would keep (1 >= 0.6)
    assert torch.equal(get_rule("chow").target(q, p, 0.4, q_raw=q_raw, p_raw=p_raw), p)
    assert torch.equal(get_rule("chow").target(q, p, 0.4), q)
    # token_v3 alpha 0.5 on raw keeps {1}; the drafted token 0 is outside -> all mass to p
    assert torch.allclose(get_rule("token_v3").target(q, p, 0.5, q_raw=q_raw, p_raw=p_raw), p)


@pytest.mark.parametrize("name", PER_POSITION)
def test_targets_are_distributions_any_leading_shape(name):
    q, p = rand_dist(2, 3, 5, 11, seed=1, sharp=3), rand_dist(2, 3, 5, 11, seed=2, sharp=3)
    rule = get_rule(name)
    lo, hi = rule.alpha_range or (0.0, 0.0)
    for alpha in (lo, hi, 0.25 if math.isinf(lo) else (lo + hi) / 2):
        pi = rule.target(q, p, alpha, q_raw=rand_dist(2, 3, 5, 11, seed=3), p_raw=rand_dist(2, 3, 5, 11, seed=4))
        assert pi.shape == q.shape
        assert (pi >= 0).all()
        assert torch.allclose(pi.sum(-1), torch.ones(2, 3, 5), atol=1e-5)


@pytest.mark.parametrize(
    "name,lossless_exact,drafter_exact",
    [
        ("chow", False, True),
        ("diff", True, True),
        ("opt", True, True),
        ("token_v1", True, True),
        ("token_v2", True, True),
        ("token_v3", False, True),
        ("lossy", True, False),
    ],
)
def test_alpha_endpoints(name, lossless_exact, drafter_exact):
    """docs/method.md: each rule's lossless end gives pi = p and its drafter end pi = q, where exact."""
    q, p = rand_dist(50, 13, seed=5, sharp=2), rand_dist(50, 13, seed=6, sharp=2)
    rule = get_rule(name)
    lossless_end, drafter_end = rule.alpha_range
    if lossless_exact:
        assert torch.allclose(rule.target(q, p, lossless_end), p, atol=1e-6)
    if drafter_exact:
        assert torch.allclose(rule.target(q, p, drafter_end), q, atol=1e-6)
    assert torch.equal(get_rule("lossless").target(q, p, 0.0), p)
    assert torch.equal(get_rule("drafter").target(q, p, 0.0), q)


def test_chow_and_token_v3_lossless_end_where_inexact():
    """chow at 0 keeps a certain drafter; token_v3 at 0 keeps only the verifier's argmax."""
    q, p = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.2, 0.7, 0.1])
    assert torch.equal(get_rule("chow").target(q, p, 0.0), q)
    q2 = torch.tensor([0.2, 0.5, 0.3])
    assert torch.allclose(
        get_rule("token_v3").target(q2, p, 0.0), torch.tensor([0.2 * 0.5, 0.5 + 0.7 * 0.5, 0.1 * 0.5])
    )


def test_cascade_rejection_rate_is_r_times_tv():
    """Lemma 3: TV(q, pi) = r * TV(p, q) for cascade-form rules."""
    q, p = rand_dist(400, 17, seed=7, sharp=2), rand_dist(400, 17, seed=8, sharp=2)
    for name, alpha in (("chow", 0.4), ("diff", 0.0), ("opt", 0.5)):
        pi = get_rule(name).target(q, p, alpha)
        r = (pi - q).abs().sum(-1) > 0
        assert 0 < r.sum() < 400  # a real mix of deferrals
        assert torch.allclose(tv_distance(q, pi), r.float() * tv_distance(p, q), atol=1e-6)


@pytest.mark.parametrize(
    "bad,match",
    [
        (torch.tensor([0.5, 0.6]), "sum to 1"),
        (torch.tensor([1.5, -0.5]), "negative"),
        (torch.tensor([float("nan"), 1.0]), "NaN"),
        (torch.tensor([1, 0]), "floating-point"),
        (torch.tensor(1.0), "shape"),
    ],
)
def test_bad_input_is_a_clear_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        get_rule("opt").target(bad, torch.tensor([0.5, 0.5]), 0.3)


def test_shape_mismatch_and_alpha_range_errors():
    with pytest.raises(ValueError, match="share one shape"):
        get_rule("opt").target(torch.full((3,), 1 / 3), torch.full((4,), 0.25), 0.3)
    with pytest.raises(ValueError, match="outside chow's range"):
        get_rule("chow").target(Q, P, 1.5)


def test_trusted_inputs_skip_content_checks_only_inside_the_block():
    from router.targets import trusted_inputs

    bad = torch.tensor([[0.7, 0.7]])  # rows do not sum to 1
    good = torch.tensor([[0.5, 0.5]])
    with pytest.raises(ValueError, match="sum to 1"):
        get_rule("opt").target(bad, good, 0.0)
    with trusted_inputs():
        get_rule("opt").target(bad, good, 0.0)  # the decoding loop's own softmax outputs are not re-checked
        with pytest.raises(ValueError, match="share one shape"):
            get_rule("opt").target(good, torch.tensor([[0.2, 0.3, 0.5]]), 0.0)
    with pytest.raises(ValueError, match="sum to 1"):
        get_rule("opt").target(bad, good, 0.0)


def test_mixture_is_the_static_ensemble_and_decodes_its_mode_greedily():
    """pi = w p + (1 - w) q with w = alpha (0 drafter, 1 lossless); at temperature 0 the loop takes
    the mode of the raw mixture (router.loop.block.decide), not a mix of one-hots."""
    from router.loop.block import decide
    from router.view import BlockView

    def policy_target(rule, alpha, q, p, q_raw, p_raw, greedy):
        return decide(rule, alpha, BlockView(q, p, q_raw, p_raw), greedy)

    q = torch.tensor([[0.6, 0.3, 0.1]])
    p = torch.tensor([[0.1, 0.5, 0.4]])
    rule = get_rule("mixture")
    assert torch.allclose(rule.target(q, p, 0.25), 0.25 * p + 0.75 * q)
    assert torch.equal(rule.target(q, p, 1.0), p) and torch.equal(rule.target(q, p, 0.0), q)
    with pytest.raises(ValueError, match="outside mixture's range"):
        rule.target(q, p, 1.5)
    one_hot_q, one_hot_p = torch.tensor([[1.0, 0, 0]]), torch.tensor([[0, 1.0, 0]])
    # raw mixture at w = 0.7: [0.25, 0.44, 0.31] -> token 1; at w = 0.2: [0.5, 0.34, 0.16] -> token 0
    assert policy_target(rule, 0.7, one_hot_q, one_hot_p, q, p, greedy=True).tolist() == [[0.0, 1.0, 0.0]]
    assert policy_target(rule, 0.2, one_hot_q, one_hot_p, q, p, greedy=True).tolist() == [[1.0, 0.0, 0.0]]
    # other rules are untouched by greedy mode (their pi is already one-hot there)
    assert torch.equal(
        policy_target(get_rule("opt"), 0.3, one_hot_q, one_hot_p, q, p, greedy=True),
        get_rule("opt").target(one_hot_q, one_hot_p, 0.3, q, p),
    )
