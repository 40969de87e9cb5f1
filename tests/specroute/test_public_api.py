"""`import specroute` offers the public API in one namespace: the core's own objects, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import specroute
from router import decoding, model, pair, policy, rules, view


def test_each_name_is_the_cores_own_object():
    assert specroute.generate is decoding.generate
    assert specroute.load_pair is pair.load_pair and specroute.load_router is model.load_router
    assert specroute.get_rule is rules.get_rule and specroute.register_rule is rules.register_rule
    assert specroute.Rule is policy.Rule and specroute.Needs is policy.Needs and specroute.BlockView is view.BlockView
    assert tuple(specroute.RULES) == tuple(rules.RULES)
    assert set(specroute.__all__) <= set(dir(specroute))


def test_an_unknown_name_lists_the_api():
    with pytest.raises(AttributeError, match="its API: BlockView, .*generate"):
        specroute.decode


def test_importing_it_loads_no_torch():
    code = "import sys, specroute; assert 'torch' not in sys.modules; specroute.get_rule; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"


def test_a_user_decodes_with_a_rule_of_their_own_through_the_namespace():
    drafter, verifier, tokenizer = specroute.load_pair("tiny:drafter", "tiny:verifier")
    mine = specroute.Rule(
        name="public_api_verifier",
        form="fixed",
        alpha_range=None,
        description="the verifier's distribution (a test rule)",
        pi=lambda q, p, alpha, q_raw, p_raw: p,
        online=False,
    )
    specroute.register_rule(mine)
    try:
        ids = torch.tensor([tokenizer.encode("def add(a, b):")])
        mine_out = specroute.generate(drafter, verifier, ids, rule="public_api_verifier", max_new_tokens=8)
        lossless = specroute.generate(drafter, verifier, ids, rule=specroute.get_rule("lossless"), max_new_tokens=8)
        assert torch.equal(mine_out.sequences, lossless.sequences)  # greedy: pi = p decodes the verifier's text
    finally:
        rules.unregister_rule("public_api_verifier")
