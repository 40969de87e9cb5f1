"""Offline trade-off curves: agreement with the rules' own targets, endpoints, the oracle bound."""

import numpy as np
import pytest
import torch

from router.rules import get_rule
from router.targets import token_mix, tv_distance
from router.offline.tradeoff import (
    Candidates,
    at_threshold,
    curve,
    learned_defer_scores,
    normalised_area,
    oracle_bound,
    oracle_scores,
    quality_at,
    random_curve,
    rule_curve,
    token_curve,
    token_point,
)


def rule_scores(name, s, cand=None):
    """The registered rule's offline score on the fixture's columns (and candidates)."""
    return get_rule(name).offline_score(s, cand)


def oracle(s):
    return oracle_scores({"p_token": s["p_gold"], "q_token": s["q_gold"], "tv": s["tv"]})


@pytest.fixture(scope="module")
def positions():
    """Full distributions at 3000 positions (V = 12) with a sampled gold token, and their scalars."""
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(3000, 12, generator=g) * 2).softmax(-1)
    p = (torch.randn(3000, 12, generator=g) * 2.5).softmax(-1)
    y = torch.multinomial(p, 1, generator=g).squeeze(-1)  # the verifier is the better model
    rows = torch.arange(3000)
    s = dict(
        q=q,
        p=p,
        y=y,
        q_max=q.amax(-1).numpy(),
        p_max=p.amax(-1).numpy(),
        tv=tv_distance(p, q).numpy(),
        q_gold=q[rows, y].numpy(),
        p_gold=p[rows, y].numpy(),
    )
    return s


@pytest.mark.parametrize(
    "name,alphas", [("chow", [0.2, 0.5, 0.8]), ("diff", [-0.2, 0.0, 0.3]), ("opt", [-1.0, 0.0, 0.5, 2.0])]
)
def test_threshold_points_equal_the_rules_targets(positions, name, alphas):
    s = positions
    scores = rule_scores(name, s)
    for alpha in alphas:
        pi = get_rule(name).target(s["q"], s["p"], alpha)
        quality = pi[torch.arange(3000), s["y"]].mean().item()
        rejection = tv_distance(s["q"], pi).mean().item()
        rej, qual = at_threshold(scores, alpha, s["tv"], s["q_gold"], s["p_gold"])
        assert rej == pytest.approx(rejection, abs=1e-6) and qual == pytest.approx(quality, abs=1e-6)


def test_curve_endpoints_are_drafter_and_lossless(positions):
    s = positions
    q_top1 = (s["q"].argmax(-1) == s["y"]).numpy()
    p_top1 = (s["p"].argmax(-1) == s["y"]).numpy()
    c = curve(rule_scores("opt", s), s["tv"], s["q_gold"], s["p_gold"], q_top1, p_top1)
    assert c.rejection[0] == 0 and c.quality[0] == pytest.approx(s["q_gold"].mean())
    assert c.top1[0] == pytest.approx(q_top1.mean()) and c.top1[-1] == pytest.approx(p_top1.mean())
    assert c.threshold[0] == np.inf
    for i in (5, len(c.threshold) // 2):  # each point is what the rule gives at its threshold as alpha
        pi = get_rule("opt").target(s["q"], s["p"], float(c.threshold[i]))
        assert c.quality[i] == pytest.approx(pi[torch.arange(3000), s["y"]].mean().item(), abs=1e-6)
    assert c.rejection[-1] == pytest.approx(s["tv"].mean()) and c.quality[-1] == pytest.approx(s["p_gold"].mean())
    assert np.all(np.diff(c.rejection) >= -1e-12)


def test_oracle_is_never_beaten_and_areas_are_normalised(positions):
    s = positions
    args = (s["tv"], s["q_gold"], s["p_gold"])
    best = curve(oracle(s), *args)
    g = np.random.default_rng(1)
    methods = {name: curve(rule_scores(name, s), *args) for name in ("chow", "diff", "opt")}
    methods["noise"] = curve(learned_defer_scores(g.normal(size=3000), s["tv"]), *args)
    for name, c in methods.items():
        for rej, qual in zip(c.rejection, c.quality):
            assert qual <= oracle_bound(best, rej) + 1e-9, name
        assert normalised_area(c, best) <= 1 + 1e-9
    assert normalised_area(best, best) == pytest.approx(1.0)
    assert normalised_area(methods["opt"], best) > normalised_area(random_curve(*args), best)
    assert quality_at(best, 0.0) == pytest.approx(s["q_gold"].mean())
    with pytest.raises(KeyError, match="unknown rule 'bleu'"):
        rule_scores("bleu", s)


def _candidates(s, k):
    """The top-k drafter candidates of the fixture's positions as a tradeoff.Candidates."""
    q, p = s["q"].double(), s["p"].double()
    ids = q.argsort(-1, descending=True)[:, :k]  # (N, k), column 0 = argmax q
    return ids, Candidates(
        q=q.gather(-1, ids).numpy(),
        p=p.gather(-1, ids).numpy(),
        is_gold=(ids == s["y"][:, None]).numpy(),
        is_p_argmax=(ids == p.argmax(-1, keepdim=True)).numpy(),
        q_gold=s["q_gold"].astype(np.float64),
        p_gold=s["p_gold"].astype(np.float64),
        p_max=s["p_max"].astype(np.float64),
    )


@pytest.mark.parametrize(
    "name,alphas", [("token_v1", [-0.2, 0.1, 0.5]), ("token_v2", [0.0, 0.2, 0.6]), ("token_v3", [0.0, 0.3, 0.9])]
)
def test_token_points_equal_the_rules_targets_when_every_token_is_a_candidate(positions, name, alphas):
    s = positions
    _, cand = _candidates(s, 12)
    scores = rule_scores(name, s, cand)
    for alpha in alphas:
        pi = get_rule(name).target(s["q"], s["p"], alpha)
        rej, qual, _, top1 = token_point(scores <= alpha, cand)
        assert qual == pytest.approx(pi[torch.arange(3000), s["y"]].mean().item(), abs=1e-6)
        assert top1 == pytest.approx((pi.argmax(-1) == s["y"]).double().mean().item(), abs=1e-9)
        assert rej == pytest.approx(tv_distance(s["q"], pi).mean().item(), abs=1e-6)


def test_token_points_with_truncated_candidates(positions):
    """Top-4 candidates: the quality is exact for the rule restricted to them (the rest deferred)
    and the rejection rate a lower bound on the exact one."""
    s = positions
    ids, cand = _candidates(s, 4)
    keep = rule_scores("token_v2", s, cand) <= 0.3
    full_keep = torch.zeros(3000, 12, dtype=torch.bool).scatter(-1, ids, torch.from_numpy(keep))
    pi = token_mix(s["q"], s["p"], full_keep)
    rej, qual, deferral, top1 = token_point(keep, cand)
    assert qual == pytest.approx(pi[torch.arange(3000), s["y"]].mean().item(), abs=1e-6)
    assert top1 == pytest.approx((pi.argmax(-1) == s["y"]).double().mean().item(), abs=1e-9)  # exact, k < V
    assert rej <= tv_distance(s["q"], pi).mean().item() + 1e-9
    assert deferral == pytest.approx(1 - (cand.q * keep).sum(-1).mean())


def test_token_curve_ends_and_oracle(positions):
    s = positions
    _, cand = _candidates(s, 12)
    c = token_curve(rule_scores("token_v3", s, cand), cand)
    assert c.rejection[0] == 0 and c.quality[0] == pytest.approx(s["q_gold"].mean())  # keep all: the drafter
    assert np.all(np.diff(c.rejection) >= 0)
    defer_all = token_point(np.zeros_like(cand.is_gold), cand)
    assert defer_all[1] == pytest.approx(s["p_gold"].mean()) and defer_all[0] == pytest.approx(s["tv"].mean())
    token_oracle = token_curve(cand.labels, cand)
    assert token_oracle.quality.max() >= c.quality.max() - 1e-9
    cols = {"tv": s["tv"], "q_token": s["q_gold"], "p_token": s["p_gold"]}
    assert np.allclose(rule_curve("token_v3", cols, cand).quality, c.quality)  # the registry picks the token form


def test_area_uses_the_frontier_of_non_monotone_curves():
    from router.offline.tradeoff import Curve, area, frontier

    zigzag = Curve(np.array([0.0, 0.2, 0.1, 0.3]), np.array([0.5, 0.6, 0.7, 0.55]), np.zeros(4))
    rej, best = frontier(zigzag)
    assert list(rej) == [0.0, 0.1, 0.2, 0.3] and list(best) == [0.5, 0.7, 0.7, 0.7]
    # best quality reachable: 0.5 -> 0.7 over [0, 0.1], then 0.7 up to 0.3
    assert area(zigzag, 0.3) == pytest.approx(0.5 * 0.1 * 0.2 + 0.2 * 0.2)
