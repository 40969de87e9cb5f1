"""Routers saved by an earlier version still load, reproduce their golden vectors and decode exactly as
they did then; every rule too (tests/fixtures/make_saved_routers.py says how the fixture was made)."""

import json
from pathlib import Path

import pytest
import torch

from router.decoding import generate
from router.export.golden import reproduce, torch_runner
from router.model import load_router
from router.pair import tiny_pair

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "saved_routers"
DECODED = json.loads((FIXTURE / "decoded.json").read_text())
ROUTERS = sorted(p.name for p in FIXTURE.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", ROUTERS)
def test_a_saved_router_reproduces_its_golden_vectors(name):
    router = load_router(FIXTURE / name)
    report = reproduce(FIXTURE / name, router.cfg, torch_runner(router))
    assert report["decisions_equal"] and report["checked"] > 0, report


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(seed=2)


@pytest.mark.parametrize("key", sorted(DECODED))
def test_rules_and_saved_routers_decode_as_they_did(pair, key):
    """Tokens, their sources and the loop's counts, for every rule and router, greedy and sampled, with
    either bonus position: a change to the loop or the policy interface may not move one token."""
    drafter, verifier, _ = pair
    name, temperature, bonus = key.split("|")
    want = DECODED[key]
    rule = load_router(FIXTURE / name) if (FIXTURE / name).is_dir() else name
    ids = torch.tensor([[5, 17, 33, 41, 8], [9, 3, 4, 5, 6]])
    out = generate(
        drafter, verifier, ids, rule=rule, alpha=want["alpha"], gamma=want["gamma"],
        temperature=float(temperature.removeprefix("t=")), seed=3, max_new_tokens=20,
        bonus_from=bonus.removeprefix("bonus="),
    )  # fmt: skip
    assert out.sequences.tolist() == want["sequences"] and out.sources.tolist() == want["sources"]
    assert {k: out.stats[k] for k in want["stats"]} == want["stats"]
    # a sum of TV(q, pi) over the drafts: other kernels (another CPU, the GQA flag) round it differently
    assert out.stats["expected_rejections"] == pytest.approx(want["expected_rejections"], rel=1e-4)
