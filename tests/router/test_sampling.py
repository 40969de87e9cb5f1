"""Sampler exactness: emitted tokens follow pi; rejection rates; temperature / top-p processing."""

import math

import pytest
import torch
from scipy.stats import chisquare

from router.rules import RULES, get_rule
from router.targets import tv_distance
from router.sampling import process_logits, speculative_block, top_p_filter

V, GAMMA, DRAWS = 6, 3, 20_000


def _dists(seed, n=GAMMA + 1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, V, generator=g) * 1.5).softmax(-1)  # (gamma+1, V)


def _alpha(name):
    rule = get_rule(name)
    if rule.alpha_range is None:
        return 0.0
    lo, hi = rule.alpha_range
    return 0.3 if math.isinf(lo) else lo + 0.4 * (hi - lo)


def _first_tokens(q, pi, draws, seed, batched):
    """First emitted token of `draws` independent blocks (drafts sampled from q)."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q[:GAMMA], draws, replacement=True, generator=gen).T  # (draws, gamma)
    if batched:
        n_acc, nxt = speculative_block(drafts, q.expand(draws, -1, -1), pi.expand(draws, -1, -1), gen)
        return torch.where(n_acc > 0, drafts[:, 0], nxt)
    firsts = []
    for row in drafts:
        n, nxt = speculative_block(row, q, pi, gen)
        firsts.append(int(row[0]) if n > 0 else nxt)
    return torch.tensor(firsts)


def assert_follows(tokens: torch.Tensor, target: torch.Tensor) -> None:
    """Chi-square goodness of fit of sampled tokens against a distribution (sparse bins pooled)."""
    counts = torch.bincount(tokens, minlength=target.shape[0]).double()
    expected = target.double() / target.double().sum() * counts.sum()
    keep = expected > 5
    obs = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    if exp[-1] == 0:
        assert obs[-1] == 0, "sampled a token that has zero probability under pi"
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("name", [n for n in RULES if get_rule(n).form != "window"])  # window: test_window.py
def test_first_emitted_token_follows_pi(name):
    q, p = _dists(1), _dists(2)
    pi = get_rule(name).target(q, p, _alpha(name), q_raw=_dists(3), p_raw=_dists(4))
    assert_follows(_first_tokens(q, pi, DRAWS, seed=11, batched=True), pi[0])


def test_public_single_block_follows_pi():
    """The one-sequence entry point, draw by draw (20k calls), for a token-form target."""
    q, p = _dists(1), _dists(2)
    pi = get_rule("token_v3").target(q, p, 0.4)
    assert_follows(_first_tokens(q, pi, DRAWS, seed=12, batched=False), pi[0])


def test_every_position_follows_pi_batched():
    """All emitted positions (not only the first): position j's token, given the block reached j."""
    q, p = _dists(5), _dists(6)
    pi = get_rule("token_v2").target(q, p, 0.2)
    n = 60_000
    gen = torch.Generator().manual_seed(3)
    drafts = torch.multinomial(q[:GAMMA], n, replacement=True, generator=gen).T  # (n, gamma)
    n_acc, nxt = speculative_block(drafts, q.expand(n, -1, -1), pi.expand(n, -1, -1), gen)
    # With position-independent blocks, token at j (when emitted) is the draft if n_acc > j else nxt.
    for j in range(GAMMA):
        reached = n_acc >= j
        assert_follows(torch.where(n_acc[reached] > j, drafts[reached, j], nxt[reached]), pi[j])


@pytest.mark.parametrize("name,alpha", [("chow", 0.45), ("diff", 0.05), ("opt", 0.3)])
def test_cascade_rejection_rate_equals_r_tv(name, alpha):
    q, p = _dists(7), _dists(8)
    pi = get_rule(name).target(q, p, alpha)
    expected = tv_distance(q, pi)[0]
    r = float((pi[0] - q[0]).abs().sum() > 0)
    assert expected.item() == pytest.approx(r * tv_distance(p, q)[0].item(), abs=1e-6)
    n = 40_000
    gen = torch.Generator().manual_seed(4)
    drafts = torch.multinomial(q[:GAMMA], n, replacement=True, generator=gen).T
    n_acc, _ = speculative_block(drafts, q.expand(n, -1, -1), pi.expand(n, -1, -1), gen)
    rate = (n_acc == 0).double().mean().item()
    assert rate == pytest.approx(expected.item(), abs=4 * math.sqrt(0.25 / n) + 1e-9)


def test_all_accepted_gives_bonus_from_last_pi():
    q = torch.eye(V)[[1, 2, 3, 4]]  # one-hot drafter
    pi = q.clone()
    pi[GAMMA] = torch.eye(V)[5]
    n, nxt = speculative_block(torch.tensor([1, 2, 3]), q, pi, torch.Generator().manual_seed(0))
    assert (n, nxt) == (3, 5)


def test_block_shape_errors_are_clear():
    with pytest.raises(ValueError, match="gamma"):
        speculative_block(torch.tensor([1, 2]), _dists(1), _dists(2), None)


def test_process_logits_temperature_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    raw, scaled = process_logits(logits, 0.0, 1.0)
    assert torch.allclose(raw, logits.softmax(-1)) and torch.equal(scaled, torch.tensor([[1.0, 0, 0, 0]]))
    raw, scaled = process_logits(logits, 0.5, 1.0)
    assert torch.allclose(scaled, (logits / 0.5).softmax(-1)) and torch.allclose(raw, logits.softmax(-1))
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(top_p_filter(probs, 0.8), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(top_p_filter(probs, 0.1), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))  # top-1 always kept
