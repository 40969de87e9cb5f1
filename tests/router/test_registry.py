"""The rule registry is the single source: a rule added with one `register_rule` call appears in
`specroute rules`, train validation, offline and online eval, the report and the demo with no other
edit; names of rules, baselines and references cannot be taken by routers."""

import json

import numpy as np
import pytest
import torch

from router.policy import DeferralPolicy, Needs, Rule
from router.view import BlockView
from router.model import RouterConfig, RouterError, RouterNet, LearnedRouter, save_router
from router.rules import (
    RULES,
    get_rule,
    offline_rules,
    online_rules,
    register_rule,
    resolve_rule,
    rule_names,
    rules_of_form,
    unregister_rule,
)
from router.targets import cascade_mix
from specroute import cli


def _peek_target(q, p, alpha, q_raw, p_raw):
    """opt's decision with a small fixed margin (what the rule does online)."""
    return cascade_mix(q, p, q_raw.amax(-1) < p_raw.amax(-1) - alpha * (p - q).clamp_min(0).sum(-1) - 0.01)


def _peek_score(cols, cand):
    """Offline, this test rule peeks at the gold token (the oracle's score), so it is the best cascade rule by
    validation area and the demo must pick it for the online run."""
    tv = np.asarray(cols["tv"])
    return (np.asarray(cols["p_token"]) - np.asarray(cols["q_token"])) / np.maximum(tv, 1e-12)


@pytest.fixture
def peek_rule():
    rule = register_rule(Rule("peek", "cascade", (-10.0, 10.0), "test rule", _peek_target, _peek_score))
    yield rule
    unregister_rule("peek")


def test_registered_rule_is_everywhere(peek_rule):
    assert "peek" in rule_names() and "peek" in rules_of_form("cascade") and "peek" in offline_rules()
    assert "peek" in online_rules() and get_rule("peek") is peek_rule
    assert isinstance(peek_rule, DeferralPolicy) and resolve_rule("peek") is peek_rule
    with pytest.raises(ValueError, match="already registered"):
        register_rule(peek_rule)
    with pytest.raises(ValueError, match="offline_score"):
        register_rule(Rule("no_score", "token", (0.0, 1.0), "x", _peek_target))
    with pytest.raises(ValueError, match="built-in"):
        unregister_rule("opt")
    # RULES, imported before the registration, is a live read-only view of the registry
    assert RULES == rule_names() and RULES[-1] == "peek" and len(RULES) == len(rule_names())
    with pytest.raises(TypeError):
        RULES[0] = "x"


def test_rules_view_follows_unregistration():
    rule = register_rule(Rule("gone", "fixed", None, "test rule", lambda q, p, alpha, q_raw, p_raw: p))
    assert "gone" in RULES
    unregister_rule(rule.name)
    assert "gone" not in RULES and RULES == rule_names() and RULES != list(rule_names())[:-1]


@pytest.mark.e2e
def test_registered_rule_runs_through_the_tiny_pipeline(peek_rule, tmp_path, capsys):
    assert cli.main(["rules"]) == 0
    assert "peek" in capsys.readouterr().out
    out = tmp_path / "demo"
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out)]) == 0
    for router in ("mlp", "gru", "token"):  # train validation compares it
        assert "peek" in json.loads((out / "routers" / router / "metrics.json").read_text())["plugins"]
    summary = json.loads((out / "demo_summary.json").read_text())
    assert "peek" in summary["online_methods"]  # the demo picked it as the best cascade rule
    for task in ("gsm8k", "mbpp"):
        metrics = json.loads((out / "eval" / task / "metrics.json").read_text())
        assert "peek" in metrics["offline"]["summary"]["methods"]  # offline eval
        assert "peek" in {p["method"] for p in metrics["online"]["points"]}  # online eval
        report = (out / "eval" / task / "report.md").read_text()
        assert report.count("| peek |") >= 2  # offline and online tables


def test_a_router_cannot_take_a_rule_or_baseline_name(tmp_path):
    from eval.offline import load_routers

    for name in ("lossless", "opt", "verifier", "oracle"):
        save_router(RouterNet(RouterConfig()), tmp_path / name)
        with pytest.raises(RouterError, match="rename the folder"):
            load_routers([str(tmp_path / name)], taken=(*rule_names(), "verifier", "drafter", "oracle"))


def test_bonus_shortcut_follows_the_policy_not_its_name():
    """A router named `lossless` gets no lossless shortcut: the loop asks the policy, not its name."""
    router = LearnedRouter(RouterNet(RouterConfig()), name="lossless")
    assert "bonus_q" in router.needs and "bonus_q" not in get_rule("lossless").needs
    assert router.form == "cascade" and router.check_alpha(0.5) == 0.5
    with pytest.raises(ValueError, match="finite"):
        router.check_alpha(float("inf"))


def test_plain_objects_with_target_are_wrapped():
    class Half:
        def target(self, q, p, alpha, q_raw=None, p_raw=None):
            return (q + p) / 2

    policy = resolve_rule(Half())
    assert isinstance(policy, DeferralPolicy) and policy.name == "Half" and policy.needs == Needs({"bonus_q"})
    q, p = torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]])
    assert torch.allclose(policy.decide(BlockView(q, p), 0.0), torch.tensor([[0.75, 0.25]]))


def test_a_policy_declaring_the_former_flags_is_told_to_declare_needs():
    class Old:
        hidden_inputs, follow = ("verifier",), 0

        def target(self, q, p, alpha, q_raw=None, p_raw=None, hidden=None):
            return p

    with pytest.raises(TypeError, match=r"declares hidden_inputs, follow: declare what it reads as needs"):
        resolve_rule(Old())


def test_a_view_refuses_an_input_its_policy_did_not_declare():
    """A policy reading what it did not declare gets the need to declare, not a None deep inside torch."""

    class ReadsDrafts:
        def decide(self, view, alpha):
            return view.p * (view.drafts[..., None] >= 0)

    q, p = torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]])
    policy = resolve_rule(ReadsDrafts())
    assert torch.equal(policy.decide(BlockView(q, p, drafts=torch.tensor([1])), 0.0), p)
    with pytest.raises(ValueError, match="declare 'drafts' in the policy's needs"):
        policy.decide(BlockView(q, p), 0.0)
    with pytest.raises(TypeError, match="BlockView has no input 'hidden'"):
        BlockView(q, p, hidden={})
    with pytest.raises(ValueError, match="unknown need 'hiden_after'"):
        Needs({"hiden_after"})
