"""Learned routers: target() semantics, export/load round trip, plugging into generate, bad folders."""

import dataclasses
import json

import pytest
import torch

from router.decoding import generate
from router.view import BlockView
from router.model import (
    ARCHS,
    HEADS,
    LearnedRouter,
    RouterConfig,
    RouterError,
    RouterNet,
    load_router,
    save_router,
    windows,
)
from router.pair import tiny_pair


def constant_router(head: str, value: float, arch: str = "linear") -> LearnedRouter:
    """A router whose predicted gap is `value` everywhere."""
    net = RouterNet(RouterConfig(arch=arch, head=head))
    with torch.no_grad():
        for prm in net.parameters():
            prm.zero_()
        last = net.body if arch != "mlp" else net.body[-1]
        last.bias.fill_(value)
    return LearnedRouter(net, "const")


def dists(seed, shape=(2, 3, 40)):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 2).softmax(-1)


@pytest.mark.parametrize("arch", ARCHS)
def test_cascade_head_defers_where_gap_exceeds_alpha_tv(arch):
    q, p = dists(1), dists(2)
    assert torch.allclose(constant_router("cascade", 0.1, arch).target(q, p, 1.0), q)  # 0.1 <= 1.0 * TV
    assert torch.allclose(constant_router("cascade", 5.0, arch).target(q, p, 1.0), p)  # 5 > TV always
    pi = constant_router("cascade", 0.3, arch).target(q, p, 0.6)  # defer exactly where TV < 0.5
    tv = (p - q).clamp_min(0).sum(-1)
    assert torch.allclose(pi, torch.where((0.3 > 0.6 * tv)[..., None], p, q))


def test_token_head_keeps_candidates_with_small_gap():
    q, p = dists(3), dists(4)
    keep_all = constant_router("token", -1.0).target(q, p, 0.0)
    top = q.topk(32, -1).indices
    kept_q = torch.zeros_like(q).scatter(-1, top, q.gather(-1, top))
    assert torch.allclose(keep_all, kept_q + p * (1 - kept_q.sum(-1, keepdim=True)), atol=1e-6)
    assert torch.allclose(constant_router("token", 1.0).target(q, p, 0.0), p, atol=1e-6)  # keeps nothing
    assert torch.allclose(keep_all.sum(-1), torch.ones(2, 3))


def test_windows_pad_and_order():
    x = torch.arange(1, 4.0)[None, :, None]  # (1, T=3, D=1)
    w = windows(x, 2)  # (1, 3, 2, 1)
    assert w[0, :, :, 0].tolist() == [[0, 1], [1, 2], [2, 3]]


def test_judge_reads_the_loops_shifted_view_as_a_separate_tensor():
    """In the loop next_p_raw is p_raw moved on by one position (views of one verification forward);
    the judge then reuses the position features for all but the last lookahead: same decisions, same
    pi, as when next_p_raw is a separate tensor."""
    torch.manual_seed(0)
    net = RouterNet(RouterConfig(head="judge", vocab=1024))
    with torch.no_grad():
        net.mean.uniform_(-1, 1)
    judge = LearnedRouter(net)
    q, p_all = dists(8, (2, 4, 1024)), dists(9, (2, 5, 1024))
    drafts = torch.randint(0, 1024, (2, 4), generator=torch.Generator().manual_seed(1))
    p, nxt = p_all[:, :4], p_all[:, 1:]
    shifted = judge.judge_scores(BlockView(q, p, drafts=drafts, next_p_raw=nxt))
    separate = judge.judge_scores(BlockView(q, p, drafts=drafts, next_p_raw=nxt.clone()))
    torch.testing.assert_close(shifted, separate, rtol=0, atol=1e-6)
    for alpha in (float(shifted.median()), -10.0, 10.0):
        pi = judge.decide(BlockView(q, p, drafts=drafts, next_p_raw=nxt), alpha)
        keep = (separate <= alpha)[..., None]
        assert torch.equal(pi, torch.where(keep, torch.nn.functional.one_hot(drafts, 1024).float(), p))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head", HEADS)
def test_export_load_round_trip_is_identical(tmp_path, arch, head):
    if (arch, head) == ("gru", "token"):
        with pytest.raises(RouterError, match="token head"):
            RouterConfig(arch=arch, head=head)
        return
    if head == "judge":
        if arch == "gru":
            with pytest.raises(RouterError, match="judge head"):
                RouterConfig(arch=arch, head=head, vocab=10)
            return
        return _judge_round_trip(tmp_path, arch)
    torch.manual_seed(0)
    net = RouterNet(RouterConfig(arch=arch, head=head, records_id="abc", alpha_grid=[0.1, 0.2]))
    with torch.no_grad():
        net.mean.uniform_(-1, 1)
        net.std.uniform_(0.5, 2)
    router = LearnedRouter(net)
    loaded = load_router(save_router(router, tmp_path / "r"))
    q, p = dists(5), dists(6)
    assert torch.equal(router.target(q, p, 0.2), loaded.target(q, p, 0.2))
    assert loaded.cfg.records_id == "abc" and loaded.cfg.alpha_grid == [0.1, 0.2]


def test_loaded_router_drives_generate(tmp_path):
    drafter, verifier, _ = tiny_pair(seed=2)
    torch.manual_seed(1)
    router = load_router(save_router(LearnedRouter(RouterNet(RouterConfig(arch="mlp"))), tmp_path / "mlp"))
    ids = torch.tensor([[5, 17, 33, 41, 8], [9, 3, 4, 5, 6]])
    out = generate(drafter, verifier, ids, rule=router, alpha=0.5, gamma=4, temperature=1.0, max_new_tokens=16)
    assert out.stats["rule"] == "mlp" and out.stats["new_tokens"] > 0
    # a gru reads the trajectory's predecessors, which the loop does not carry across blocks: refused
    gru = load_router(save_router(LearnedRouter(RouterNet(RouterConfig(arch="gru"))), tmp_path / "gru"))
    with pytest.raises(ValueError, match="router 'gru' is a gru .* offline-only: train arch=mlp"):
        generate(drafter, verifier, ids, rule=gru, alpha=0.5, gamma=4, max_new_tokens=16)
    never = generate(
        drafter, verifier, ids, rule=constant_router("cascade", -1.0), alpha=0.0, gamma=4, max_new_tokens=16
    )
    assert never.stats["deferrals"] == 0  # a router that never defers is the drafter


def test_bad_router_folders(tmp_path):
    with pytest.raises(RouterError, match="not a router folder"):
        load_router(tmp_path)
    folder = save_router(RouterNet(RouterConfig()), tmp_path / "r")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "schema_version": 0}))
    with pytest.raises(RouterError, match="schema 0"):
        load_router(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "feature_names": ["q_max"]}))
    with pytest.raises(RouterError, match="trained on features"):
        load_router(folder)
    with pytest.raises(RouterError, match="unknown router arch"):
        RouterConfig(arch="transformer")


class SpyRouter(LearnedRouter):
    """Records the hidden-state shapes generate() hands over."""

    def __init__(self, net):
        super().__init__(net, "spy")
        self.seen = []

    def decide(self, view, alpha):
        hidden = {role: view.get(f"hidden_{role}") for role in ("drafter", "verifier", "after")}
        self.seen.append({k: tuple(v.shape) for k, v in hidden.items() if v is not None})
        return super().decide(view, alpha)


def test_hidden_state_routers_get_hidden_states_from_generate(tmp_path):
    drafter, verifier, _ = tiny_pair(seed=2)
    size = verifier.config.hidden_size
    cfg = RouterConfig(
        arch="mlp", hidden_inputs=["drafter", "verifier"], hidden_sizes={"drafter": size, "verifier": size}
    )
    router = SpyRouter(load_router(save_router(RouterNet(cfg), tmp_path / "h")).net)
    ids = torch.tensor([[5, 17, 33, 41, 8], [9, 3, 4, 5, 6]])
    out = generate(drafter, verifier, ids, rule=router, alpha=0.2, gamma=3, max_new_tokens=12)
    assert out.stats["new_tokens"] > 0 and router.seen
    for shapes in router.seen:
        assert shapes["verifier"][-1] == size and shapes["drafter"][-1] == size
        assert shapes["verifier"][:-1] == shapes["drafter"][:-1]  # aligned with the positions of q and p
    with pytest.raises(RouterError, match="reads the drafter's hidden state"):
        router.target(dists(1, (2, 259)), dists(2, (2, 259)), 0.2)
    with pytest.raises(RouterError, match="hidden_inputs"):
        RouterConfig(hidden_inputs=["verifier"])


def _judge_round_trip(tmp_path, arch):
    """A judge's export carries its weights and token class table: identical decisions after loading."""
    torch.manual_seed(0)
    net = RouterNet(RouterConfig(arch=arch, head="judge", vocab=10))
    with torch.no_grad():
        net.mean.uniform_(-1, 1)
        net.token_classes.copy_(torch.randint(0, 64, (10,), dtype=torch.uint8))
    loaded = load_router(save_router(LearnedRouter(net), tmp_path / "j"))
    assert torch.equal(loaded.net.token_classes, net.token_classes)
    q, p, nxt = dists(5, (2, 3, 10)), dists(6, (2, 3, 10)), dists(7, (2, 3, 10))
    drafts = torch.tensor([[1, 4, 9], [0, 2, 3]])
    for alpha in (-0.5, 0.0, 0.5):
        a = LearnedRouter(net).decide(BlockView(q, p, drafts=drafts, next_p_raw=nxt), alpha)
        b = loaded.decide(BlockView(q, p, drafts=drafts, next_p_raw=nxt), alpha)
        assert torch.equal(a, b)


@pytest.mark.parametrize("head", ["cascade", "token", "judge"])
def test_generate_hands_routers_the_logits_and_decides_the_same(head):
    """The loop passes a router the logits behind q_raw and p_raw (cheaper features); the decisions,
    hence the outputs, are those of the same router computing its features from probabilities."""
    drafter, verifier, _ = tiny_pair(seed=2)
    torch.manual_seed(3)
    net = RouterNet(
        RouterConfig(arch="mlp", head=head, **({"vocab": drafter.config.vocab_size} if head == "judge" else {}))
    )
    with torch.no_grad():
        net.mean.uniform_(-1, 1)
    fast, plain = LearnedRouter(net, "fast"), LearnedRouter(net, "plain")
    plain.needs = dataclasses.replace(plain.needs, inputs=plain.needs.inputs - {"logits"})
    seen = []
    original = fast.decide

    def spy(view, alpha):
        seen.append(sorted(k for k in ("next_p_logits", "p_logits", "q_logits") if view.get(k) is not None))
        return original(view, alpha)

    fast.decide = spy
    ids = torch.tensor([[5, 17, 33, 41, 8], [9, 3, 4, 5, 6]])

    def run(router, alpha):
        return generate(
            drafter, verifier, ids, rule=router, alpha=alpha, gamma=4, temperature=1.0, seed=4, max_new_tokens=24
        )

    ends = [run(plain, a).sequences for a in (-1e3, 1e3)]  # defer everywhere / keep every candidate
    mixed = [
        a
        for a in (0.0, 0.05, 0.02, -0.5, 0.5, -2.0, 2.0)
        if not any(torch.equal(run(plain, a).sequences, end) for end in ends)
    ]
    assert mixed, "no alpha where the router's decisions change the output: the comparison would be vacuous"
    expected = ["next_p_logits", "p_logits", "q_logits"] if head == "judge" else ["p_logits", "q_logits"]
    for alpha in mixed[:2]:
        seen.clear()
        assert torch.equal(run(fast, alpha).sequences, run(plain, alpha).sequences)
        assert seen and all(set(expected) <= set(kw) for kw in seen)
