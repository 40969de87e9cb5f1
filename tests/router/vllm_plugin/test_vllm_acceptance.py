"""The vLLM plugin's accept/resample step (router/vllm/acceptance.py), without vLLM: its emitted tokens follow
the policy's pi (chi-square, as the sampler's own test), greedy rows decide as specroute's block does, and a
request never keeps more drafts than it made."""

import pytest
import torch
from scipy.stats import chisquare

from router.loop.block import decide
from router.rules import get_rule
from router.sampling import accept_drafts, next_after, process_logits
from router.view import BlockView
from router.vllm.acceptance import PLACEHOLDER, Drafted, Sampling, accept, drafter_scaled

V = 12


def _sampling(b: int, temperature: float = 1.0, top_p: float = 1.0) -> Sampling:
    return Sampling(
        torch.full((b,), temperature), torch.zeros(b, dtype=torch.long), torch.full((b,), top_p), [None] * b
    )


def _step(q_logits, logits, drafts, n, sampling, bonus=None) -> Drafted:
    b = drafts.shape[0]
    bonus = torch.zeros(b, dtype=torch.long) if bonus is None else bonus
    return Drafted(drafts, n, q_logits, logits, None, bonus, sampling)


@pytest.mark.parametrize("rule,alpha", [("lossless", 0.0), ("opt", 0.2), ("token_v2", 0.3), ("lossy", 0.5)])
def test_the_first_emitted_token_follows_pi(rule, alpha):
    """One draft per request, N identical requests at temperature 1: the first token out is distributed as
    pi at the draft's position (kept draft or residual), whatever the policy."""
    torch.manual_seed(0)
    n_req = 40000
    q_logits = torch.randn(V) * 1.5
    logits = torch.randn(V) * 1.5
    sampling = _sampling(n_req)
    q_raw, q = drafter_scaled(q_logits[None].expand(n_req, V), torch.arange(n_req), sampling)  # (N, V) each
    q_raw = q_raw[0]
    drafts = torch.multinomial(q, 1)  # (N, 1) drawn from the q acceptance divides by
    step = _step(
        q_logits.expand(n_req, 1, V).clone(),
        logits.expand(n_req, 1, V).clone(),
        drafts,
        torch.ones(n_req, dtype=torch.long),
        sampling,
        bonus=torch.full((n_req,), V - 1),
    )
    first = accept(get_rule(rule), alpha, step).tokens[:, 0].long()
    p_raw, p = process_logits(logits, 1.0, 1.0)
    pi = get_rule(rule).decide(BlockView(q[:1], p[None], q_raw[None], p_raw[None]), alpha)[0]
    observed = torch.bincount(first, minlength=V).double()
    expected = pi.double() * n_req
    keep = expected > 5
    assert observed[~keep].sum() <= 5 * max(1, int((~keep).sum()))
    stat = chisquare(
        observed[keep].numpy(), expected[keep].numpy() * observed[keep].sum().item() / expected[keep].sum().item()
    )
    assert stat.pvalue > 1e-3, (rule, stat)


@pytest.mark.parametrize(
    "rule,alpha", [("opt", 0.1), ("token_v2", 0.2), ("kl_gate", 0.5), ("mixture", 0.5), ("chow", 0.3)]
)
def test_greedy_requests_decide_as_specroutes_block_does(rule, alpha):
    """Temperature 0: the tokens equal specroute's own block steps (decide, accept_drafts, next_after) on the same
    distributions, with the bonus token taken from the verifier (bonus_from="verifier")."""
    torch.manual_seed(1)
    b, k = 64, 4
    q_logits, p_logits = torch.randn(b, k, V) * 2, torch.randn(b, k + 1, V) * 2
    q_raw, q = process_logits(q_logits, 0.0, 1.0)
    p_raw, p = process_logits(p_logits, 0.0, 1.0)
    drafts = q.argmax(-1)  # (B, K) greedy drafts
    bonus = p[:, k].argmax(-1)
    view = BlockView(q, p[:, :k], q_raw, p_raw[:, :k], drafts=drafts)
    pi = decide(get_rule(rule), alpha, view, True)
    n_ref = accept_drafts(drafts, q, pi, None)
    rows = torch.arange(b)
    at = n_ref.clamp_max(k - 1)
    nxt = torch.where(n_ref == k, bonus, next_after(q[rows, at], pi[rows, at], n_ref < k, None))
    step = _step(q_logits, p_logits[:, :k], drafts, torch.full((b,), k), _sampling(b, 0.0), bonus)
    out = accept(get_rule(rule), alpha, step)
    assert torch.equal(out.n_accepted, n_ref)
    assert torch.equal(out.tokens[rows, n_ref].long(), nxt)
    for i in range(b):
        assert out.tokens[i, : n_ref[i]].tolist() == drafts[i, : n_ref[i]].tolist()
        assert (out.tokens[i, n_ref[i] + 1 :] == PLACEHOLDER).all()


def test_a_request_never_keeps_more_drafts_than_it_made():
    torch.manual_seed(2)
    b, k = 6, 4
    logits = torch.randn(b, k, V)
    q = process_logits(logits, 0.0, 1.0)[1]
    drafts = q.argmax(-1)
    n = torch.tensor([0, 1, 2, 3, 4, 2])
    bonus = torch.arange(b) + 3
    out = accept(get_rule("lossless"), 0.0, _step(logits, logits, drafts, n, _sampling(b, 0.0), bonus))  # p == q
    assert out.n_accepted.tolist() == n.tolist()  # every draft is the verifier's argmax: all kept, none beyond
    assert out.tokens[torch.arange(b), n].tolist() == bonus.tolist()
    assert out.evaluated.tolist() == n.tolist() and out.deferred.tolist() == [0] * b


def test_per_request_seeds_make_a_step_reproducible():
    b, k = 8, 3
    torch.manual_seed(3)
    q_logits, p_logits = torch.randn(b, k, V), torch.randn(b, k, V)
    drafts = torch.multinomial(q_logits.softmax(-1).reshape(-1, V), 1).view(b, k)
    outs = []
    for _ in range(2):
        sampling = _sampling(b)
        sampling.generators = [torch.Generator().manual_seed(10 + i) for i in range(b)]
        outs.append(
            accept(get_rule("opt"), 0.3, _step(q_logits, p_logits, drafts, torch.full((b,), k), sampling)).tokens
        )
    assert torch.equal(outs[0], outs[1])


def test_requests_of_one_step_decide_with_their_own_policies():
    """A step whose requests name different policies (the plugin groups them with rows_of): each group's tokens
    are the ones its requests get in a step of their own."""
    from router.vllm.acceptance import rows_of

    torch.manual_seed(4)
    b, k = 6, 4
    q_logits, p_logits = torch.randn(b, k, V) * 2, torch.randn(b, k, V) * 2
    drafts = process_logits(q_logits, 0.0, 1.0)[1].argmax(-1)
    step = _step(q_logits, p_logits, drafts, torch.tensor([4, 4, 3, 4, 2, 4]), _sampling(b, 0.0), torch.arange(b))
    mask = torch.tensor([True, False, True, False, True, False])
    for policy, alpha, rows in ((get_rule("opt"), 0.3, mask), (get_rule("lossless"), 0.0, ~mask)):
        grouped = accept(policy, alpha, rows_of(step, rows))
        for j, i in enumerate(rows.nonzero().flatten().tolist()):
            alone = accept(policy, alpha, rows_of(step, torch.arange(b) == i))
            assert grouped.tokens[j].tolist() == alone.tokens[0].tolist()
            assert int(grouped.n_accepted[j]) == int(alone.n_accepted[0])


@pytest.mark.parametrize("rule,alpha", [("lossless", 0.0), ("token_v2", 0.3), ("kl_gate", 0.5), ("mixture", 0.5)])
def test_deferrals_count_where_pi_differs_from_q_in_greedy_and_sampled_rows(rule, alpha):
    """Greedy rows count deferrals from pi at the draft (q is its one-hot there), sampled rows from the whole
    distributions: both as TV(q, pi) > tolerance, as specroute's block counts them; rows of both kinds in one step."""
    from router.loop.block import PI_EQUALS_Q_TOL
    from router.targets import tv_distance
    from router.vllm.acceptance import targets

    torch.manual_seed(1)
    b, k = 6, 3
    q_logits, logits = torch.randn(b, k, V) * 2, torch.randn(b, k, V) * 2
    sampling = _sampling(b)
    sampling.temperature[::2] = 0.0  # rows 0, 2, 4 greedy
    drafts = torch.where(sampling.greedy()[:, None], q_logits.argmax(-1), torch.randint(0, V, (b, k)))
    step = _step(q_logits, logits, drafts, torch.full((b,), k), sampling)
    policy = get_rule(rule)
    q, pi = targets(policy, alpha, step)
    out = accept(policy, alpha, step)
    want = tv_distance(q, pi) > PI_EQUALS_Q_TOL  # (B, K) the whole distributions
    inside = torch.arange(k)[None] < out.evaluated[:, None]
    assert out.deferred.tolist() == (want & inside).sum(-1).tolist()


def _greedy_step(seed: int, b: int = 32, k: int = 4) -> Drafted:
    gen = torch.Generator().manual_seed(seed)
    sharp = torch.tensor([0.5, 2.0, 6.0])[torch.randint(0, 3, (b, k, 1), generator=gen)]
    q_logits = torch.randn(b, k, V, generator=gen) * sharp
    logits = q_logits + torch.randn(b, k, V, generator=gen) * 1.5
    n = torch.randint(0, k + 1, (b,), generator=gen)
    bonus = torch.randint(0, V, (b,), generator=gen)
    return _step(q_logits, logits, q_logits.argmax(-1), n, _sampling(b, 0.0), bonus)


@pytest.mark.parametrize(
    "rule,alpha",
    [("lossless", 0.0), ("drafter", 0.0), ("token_v2", 0.3), ("token_v1", 0.2), ("kl_gate", 0.8), ("opt", 0.4)]
    + [("entropy_gate", 0.4), ("chow", 0.3), ("diff", 0.1), ("lossy", 0.5), ("lossy", 1.0), ("token_v3", 0.6)],
)
def test_the_sparse_greedy_step_emits_and_counts_what_the_full_step_does(rule, alpha):
    """All-greedy steps with uneven draft counts: the greedy verdicts give the full path's tokens and counts."""
    for seed in range(3):
        step = _greedy_step(seed)
        sparse, full = accept(get_rule(rule), alpha, step), accept(get_rule(rule), alpha, step, sparse=False)
        for field in ("tokens", "n_accepted", "deferred", "evaluated"):
            assert torch.equal(getattr(sparse, field), getattr(full, field)), (rule, seed, field)


def test_a_router_takes_the_sparse_step_and_a_mixed_step_the_full_one(monkeypatch):
    from router.arch import RouterConfig
    from router.model import LearnedRouter, RouterNet
    from router.vllm import acceptance

    torch.manual_seed(3)
    router = LearnedRouter(RouterNet(RouterConfig(head="token")), name="token")
    step = _greedy_step(7)
    assert torch.equal(accept(router, 0.0, step).tokens, accept(router, 0.0, step, sparse=False).tokens)
    calls, full_targets = [], acceptance.targets
    monkeypatch.setattr(acceptance, "targets", lambda *a: calls.append(1) or full_targets(*a))
    accept(router, 0.0, step)
    assert not calls, "an all-greedy step with a greedy verdict forms no full pi"
    step.sampling.temperature[0] = 1.0  # one sampled request: the step needs pi over the vocabulary
    accept(router, 0.0, step)
    assert calls
