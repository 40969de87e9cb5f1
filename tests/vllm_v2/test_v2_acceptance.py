"""The plugin's acceptance under Model Runner V2 against vLLM's own V2 code (interpreted on CPU): `lossless` gives
vLLM's tokens at temperature 0 and vLLM's law at temperature 1 (with top-k/top-p); every rule and a saved router give
what router.vllm.acceptance gives on V1's layout of the same step; their sampled law is pi; a request's own policy,
the counts, seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from v2_steps import Request, V2Step, engine

from router.rules import get_rule
from router.view import BlockView
from router.vllm.acceptance import accept, next_token
from router.vllm.runner_v1 import padded_step
from router.vllm.settings import load_policy

RULES = {
    "lossless": 0.0,
    "chow": 0.3,
    "diff": 0.2,
    "opt": 0.2,
    "token_v1": 0.2,
    "token_v2": 0.3,
    "token_v3": 0.3,
    "kl_gate": 0.5,
    "entropy_gate": 0.5,
    "lossy": 0.5,
    "mixture": 0.5,
}
ROUTER = Path(__file__).parents[1] / "fixtures" / "saved_routers" / "token"


def _uneven(k: int, seed: int) -> list[Request]:
    """Five requests on scattered slots drafting 0..K each (one prefill-like request with none)."""
    rng = np.random.default_rng(seed)
    counts = [k, int(rng.integers(0, k + 1)), 0, int(rng.integers(1, k + 1)), k]
    return [Request(slot=s, drafts=d) for s, d in zip([3, 0, 6, 2, 5], counts)]


@pytest.mark.parametrize("k", range(1, 8))
def test_lossless_gives_vllms_tokens_at_temperature_0(k):
    step = V2Step(_uneven(k, k), k, vocab=48, seed=k)
    ours = step.plugin(engine(get_rule("lossless")))
    assert ours == step.vllm()
    assert any(len(t) > 1 for t in ours), "no draft was kept: the step tests nothing"


def _first_tokens(tokens: list[list[int]], vocab: int) -> np.ndarray:
    return np.bincount([t[0] for t in tokens], minlength=vocab).astype(float)


def _law(step: V2Step) -> torch.Tensor:
    """The first emitted token's law under lossless: the verifier's processed distribution at the first row."""
    r = step.requests[0]
    logits = step.logits[0] / r.temperature
    if r.top_k:
        logits = logits.masked_fill(logits < logits.topk(r.top_k).values[-1], float("-inf"))
    p = logits.softmax(-1)
    order = p.argsort(descending=True)
    keep = (p[order].cumsum(0) - p[order]) < r.top_p
    mask = torch.zeros_like(p, dtype=torch.bool)
    mask[order[keep]] = True
    return torch.where(mask, p, 0) / p[mask].sum()


def _fits(observed: np.ndarray, law: torch.Tensor) -> float:
    expected = law.double().numpy() * observed.sum()
    keep = expected > 5
    assert observed[~keep].sum() <= 5 * max(1, int((~keep).sum()))
    return chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (6, 0.9)])
def test_lossless_follows_vllms_law_at_temperature_1(top_k, top_p):
    """Many identical one-draft requests, each with its own seed: the first token out of vLLM's and of the plugin's
    acceptance both follow the verifier's processed distribution (chi-square), and each other."""
    vocab, n = 8, 100
    reqs = [Request(slot=i, drafts=1, temperature=1.0, top_k=top_k, top_p=top_p, seed=1000 + i) for i in range(n)]
    step = V2Step(reqs, 1, vocab=vocab, seed=3, scale=1.0, same=True)
    law = _law(step)
    theirs, ours = _first_tokens(step.vllm(), vocab), _first_tokens(step.plugin(engine(get_rule("lossless"))), vocab)
    assert _fits(theirs, law) > 1e-3 and _fits(ours, law) > 1e-3
    both = np.stack([theirs, ours])[:, (theirs + ours) > 0]
    from scipy.stats import chi2_contingency

    assert chi2_contingency(both).pvalue > 1e-3


def _policies():
    return [(name, get_rule(name), alpha) for name, alpha in RULES.items()] + [
        ("router", load_policy(str(ROUTER)), 0.2)
    ]


def _v1_layout(step: V2Step) -> tuple:
    """The same step as V1 hands it to the plugin (router/vllm/runner_v1.py padded_step): flat drafts, the drafter's
    and the verifier's logits at each draft, each request's bonus token (the verifier's argmax after its drafts)."""
    from types import SimpleNamespace

    drafts, q, p, bonus, made = [], [], [], [], []
    for i, r in enumerate(step.requests):
        start = int(step.cu[i])
        drafts += step.inputs["draft_sampled"][start + 1 : start + 1 + r.drafts].tolist()
        q.append(step.q[r.slot, : r.drafts])
        p.append(step.logits[start : start + r.drafts])
        bonus.append(int(step.logits[start + r.drafts].argmax()))
        made.append(r.drafts)
    b = len(made)
    meta = SimpleNamespace(all_greedy=True, temperature=None, top_k=None, top_p=None, generators={})
    flat = padded_step(torch.tensor(drafts), made, step.k, torch.cat(q), torch.cat(p), torch.tensor(bonus), meta, False)
    assert flat.drafts.shape == (b, step.k)
    return flat


@pytest.mark.parametrize("name,policy,alpha", _policies(), ids=[p[0] for p in _policies()])
def test_every_policy_decides_as_on_v1s_layout(name, policy, alpha):
    """Temperature 0: the plugin's V2 step emits and counts what router.vllm.acceptance emits and counts on V1's layout
    of the same step (uneven drafts, scattered slots)."""
    k = 5
    step = V2Step(_uneven(k, 11), k, vocab=40, seed=11)
    eng = engine(policy, alpha)
    ours = step.plugin(eng)
    done = accept(policy, alpha, _v1_layout(step))
    theirs = [[t for t in row if t >= 0] for row in done.tokens.tolist()]
    assert ours == theirs
    made = [r.drafts for r in step.requests]
    assert eng.counts.total["accepted"] == int(done.n_accepted.sum())
    assert eng.counts.total["deferred"] == int(done.deferred.sum())
    assert eng.counts.total["drafts"] == sum(made)
    assert set(eng.counts.requests) == {f"req{r.slot}" for r in step.requests if r.drafts}


def _first_token_law(policy, alpha: float, step: V2Step) -> torch.Tensor:
    """The law of the first token out of one-draft requests at temperature 1, by enumerating the draft x ~ q: kept
    with min(1, pi_x(x) / q(x)), else drawn from the residual (pi_x - q)+ (pi_x: the policy's target given draft x;
    a rule's pi does not depend on x, so the law is pi)."""
    from router.targets import safe_normalize

    q_logits, p_logits = step.q[0, :1], step.logits[:1]  # (1, V) each
    q, p = q_logits.softmax(-1)[0], p_logits.softmax(-1)[0]
    law = torch.zeros_like(q)
    for x in range(len(q)):
        view = BlockView(
            q[None, None],
            p[None, None],
            q[None, None],
            p[None, None],
            drafts=torch.tensor([[x]]),
            q_logits=q_logits[None],
            p_logits=p_logits[None],
            next_p_raw=step.logits[1:2][None].softmax(-1),
            next_p_logits=step.logits[1:2][None],
        )
        pi = policy.decide(view, alpha)[0, 0]
        keep = min(1.0, float(pi[x] / q[x]))
        residual = safe_normalize((pi - q).clamp_min(0), pi)
        law += q[x] * (keep * torch.nn.functional.one_hot(torch.tensor(x), len(q)) + (1 - keep) * residual)
    return law


@pytest.mark.parametrize("name,policy,alpha", _policies()[1:], ids=[p[0] for p in _policies()[1:]])
def test_every_policys_sampled_law_is_pi(name, policy, alpha):
    """Temperature 1, identical one-draft requests: the first token out follows pi (for a judge, pi given each draft)."""
    torch.manual_seed(0)  # unseeded requests draw from torch's default generator
    vocab, n = 10, 2000
    reqs = [Request(slot=i, drafts=1, temperature=1.0) for i in range(n)]
    step = V2Step(reqs, 1, vocab=vocab, seed=5, scale=1.0, same=True)
    ours = _first_tokens(step.plugin(engine(policy, alpha)), vocab)
    assert _fits(ours, _first_token_law(policy, alpha, step)) > 1e-3


def test_a_request_decides_with_its_own_policy_and_alpha():
    k = 4
    reqs = _uneven(k, 2)
    reqs[0].extra = {"specroute_policy": "token_v2", "specroute_alpha": 0.9}
    reqs[3].extra = {"specroute_alpha": 0.1}
    step = V2Step(reqs, k, vocab=40, seed=2)
    ours = step.plugin(engine(get_rule("opt"), 0.5))
    flat = _v1_layout(step)
    for i, (policy, alpha) in {
        0: (get_rule("token_v2"), 0.9),
        3: (get_rule("opt"), 0.1),
        1: (get_rule("opt"), 0.5),
    }.items():
        done = accept(policy, alpha, flat)
        assert ours[i] == [t for t in done.tokens[i].tolist() if t >= 0], i


def test_a_seeded_request_decodes_the_same_way_every_time():
    reqs = [Request(slot=0, drafts=3, temperature=1.0, seed=7), Request(slot=1, drafts=3, temperature=1.0, seed=8)]
    runs = [V2Step(reqs, 3, vocab=30, seed=4, scale=1.0).plugin(engine(get_rule("token_v2"), 0.3)) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_the_token_after_the_drafts_is_the_verifiers():
    """V2 samples it inside its acceptance: the plugin's is the verifier's argmax at temperature 0 (next_token)."""
    logits = torch.randn(4, 9)
    from router.vllm.acceptance import Sampling

    greedy = Sampling(torch.zeros(4), torch.zeros(4, dtype=torch.long), torch.ones(4), [None] * 4)
    assert torch.equal(next_token(logits, greedy), logits.argmax(-1))


def test_the_processed_logits_vllms_logprobs_read_are_vllms():
    """In a processed logprobs mode _verify's first output feeds vLLM's logprobs: the plugin's equals vLLM's (its
    temperature, top-k and top-p through vLLM's own Sampler)."""
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    from router.vllm.runner_v2 import verify_step

    reqs = [Request(slot=0, drafts=2, temperature=0.7, top_k=5, top_p=0.8, seed=1), Request(slot=1, drafts=1)]
    step = V2Step(reqs, 2, vocab=16, seed=9)
    step.rs.sampler.logprobs_mode = "processed_logprobs"
    theirs = RejectionSampler._verify(step.rs, **step.kwargs())[0]
    ours = verify_step(engine(get_rule("lossless")), step.rs, **step.kwargs())[0]
    assert torch.equal(torch.isfinite(theirs), torch.isfinite(ours))
    assert torch.allclose(theirs[torch.isfinite(theirs)], ours[torch.isfinite(ours)])
