"""The greedy (temperature 0) verdicts of router/greedy.py agree with each policy's own pi: every built-in rule
that declares one, over its alpha range, and cascade and token routers; the rest take the full path."""

import math

import pytest
import torch

from router.arch import RouterConfig
from router.greedy import GreedyView, greedy_choice, greedy_keeps
from router.loop.block import decide
from router.model import LearnedRouter, RouterNet
from router.reduce import fast_argmax
from router.rules import get_rule, rule_names
from router.sampling import process_logits
from router.view import BlockView

pytestmark = pytest.mark.unit
V = 40


def _position(seed: int, b: int = 24, k: int = 4):
    """Greedy drafts and both models' logits (B, K, V) of varied sharpness (some verifier rows above 0.9)."""
    gen = torch.Generator().manual_seed(seed)
    sharp = torch.tensor([0.3, 1.0, 3.0, 8.0])[torch.randint(0, 4, (b, k, 1), generator=gen)]
    q_logits = torch.randn(b, k, V, generator=gen) * sharp
    p_logits = (q_logits + torch.randn(b, k, V, generator=gen) * 2) * sharp.flip(0)
    return q_logits.argmax(-1), q_logits, p_logits


def _full_choice(policy, alpha, drafts, q_logits, p_logits) -> torch.Tensor:
    """The token pi's mode names at temperature 0, from the policy's decide on the view the plugin builds."""
    q_raw, q = process_logits(q_logits, 0.0, 1.0)
    p_raw, p = process_logits(p_logits, 0.0, 1.0)
    view = BlockView(q, p, q_raw, p_raw, drafts=drafts, q_logits=q_logits, p_logits=p_logits)
    pi = decide(policy, alpha, view, True)
    assert torch.allclose(pi.amax(-1), torch.ones(())), "pi is one-hot at temperature 0"
    return fast_argmax(pi)


def _alphas(name: str) -> list[float]:
    lo, hi = get_rule(name).alpha_range or (0.0, 0.0)
    if math.isinf(lo) or math.isinf(hi):
        return [lo, -0.5, 0.0, 0.3, 2.0, hi]
    return [lo, *(lo + (hi - lo) * f for f in (0.01, 0.1, 0.3, 0.5, 0.8)), hi] if hi < 100 else [0.0, 0.05, 0.5, 2.0]


GREEDY_RULES = [name for name in rule_names() if get_rule(name).greedy is not None]


def test_every_built_in_rule_but_the_mixing_and_window_ones_declares_a_greedy_verdict():
    assert set(rule_names()) - set(GREEDY_RULES) == {"mixture", "fly"}


@pytest.mark.parametrize("name", GREEDY_RULES)
def test_a_rules_greedy_verdict_names_the_token_its_pi_names(name):
    rule = get_rule(name)
    for seed in range(3):
        drafts, q_logits, p_logits = _position(seed)
        for alpha in _alphas(name):
            view = GreedyView(drafts, q_logits, p_logits)
            got = greedy_choice(greedy_keeps(rule, alpha, view), view)
            assert torch.equal(got, _full_choice(rule, alpha, drafts, q_logits, p_logits)), (name, alpha, seed)


def test_the_verdicts_vary_over_the_range():
    """The checks above are not all-keep or all-defer: token_v2 keeps some drafts and defers others midway."""
    drafts, q_logits, p_logits = _position(0)
    view = GreedyView(drafts, q_logits, p_logits)
    keep = greedy_keeps(get_rule("token_v2"), 0.3, view) & view.differs
    assert 0 < int(keep.sum()) < int(view.differs.sum())


def test_the_view_statistics_match_the_raw_distributions():
    drafts, q_logits, p_logits = _position(3)
    view = GreedyView(drafts, q_logits, p_logits)
    q_raw, p_raw = q_logits.softmax(-1), p_logits.softmax(-1)
    torch.testing.assert_close(view.q_max, q_raw.amax(-1))
    torch.testing.assert_close(view.p_at_draft, p_raw.gather(-1, drafts[..., None])[..., 0])
    from router.targets import kl_pq, p_certainty

    torch.testing.assert_close(view.kl_pq, kl_pq(q_raw, p_raw), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.exp(-view.p_entropy), p_certainty(p_raw), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("head,arch", [("cascade", "mlp"), ("cascade", "gru"), ("cascade", "linear"), ("token", "mlp")])
def test_a_routers_greedy_verdict_names_the_token_its_pi_names(head, arch):
    torch.manual_seed(0)
    router = LearnedRouter(RouterNet(RouterConfig(head=head, arch=arch)), name=f"{head}-{arch}")
    drafts, q_logits, p_logits = _position(4)
    keeps = []
    for alpha in (-1.0, -0.05, 0.0, 0.05, 1.0):
        view = GreedyView(drafts, q_logits, p_logits)
        keep = greedy_keeps(router, alpha, view)
        keeps.append(int((keep & view.differs).sum()))
        assert torch.equal(greedy_choice(keep, view), _full_choice(router, alpha, drafts, q_logits, p_logits)), alpha
    assert len(set(keeps)) > 1, "the alphas tried all decide alike"


def test_policies_without_a_greedy_verdict_take_the_full_path():
    drafts, q_logits, p_logits = _position(5)
    view = GreedyView(drafts, q_logits, p_logits)
    judge = LearnedRouter(RouterNet(RouterConfig(head="judge", vocab=V)), name="judge")
    hidden = LearnedRouter(
        RouterNet(RouterConfig(hidden_inputs=["verifier"], hidden_sizes={"verifier": 8})), name="hidden"
    )

    class Custom:  # a policy of the user's own: decide() only
        name, form, greedy_mode = "custom", "custom", False

    for policy in (get_rule("mixture"), get_rule("fly"), judge, hidden, Custom()):
        assert greedy_keeps(policy, 0.5, view) is None, policy.name
