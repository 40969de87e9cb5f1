"""The cascade decoding loop: exactness against HF greedy, batching, seeds, stub acceptance counts."""

import pytest
import torch

from helpers import StubLM, left_padded, tiny_qwen
from router.pair import tiny_pair
from router.loop.baselines import generate_autoregressive, generate_sequence_cascade, generate_token_cascade
from router.loop.teacher import continuation_logprobs
from router.decoding import generate
from router.loop.block_size import block_drafts
from router.rules import resolve_rule
from router.loop.common import FROM_DRAFTER, PADDING

PROMPTS = [[5, 17, 33, 41, 8], [9, 3], [11, 12, 13, 14, 15, 16, 17, 18]]
NEW = 40


@pytest.fixture(scope="module")
def near_pair():
    """A verifier and a drafter that is a slightly perturbed copy: they agree often, not always."""
    drafter, verifier, _ = tiny_pair(seed=2)
    return drafter, verifier


def hf_greedy(model, prompt, new=NEW):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)
    return out[0, len(prompt) :].tolist()


def test_new_tokens_are_each_rows_generated_tokens_without_end_padding():
    """GenerateOutput.new_tokens: the tokens after the (padded) prompt width, up to each row's end."""
    from router.loop.common import GenerateOutput

    prompts = torch.tensor([[0, 7, 8], [9, 10, 11]])  # left-padded to width 3
    new = torch.tensor([[1, 2, 3, 0], [4, 0, 0, 0]])  # row 1 ended after one token (0: the pad id)
    sources = torch.tensor([[0, 1, 0, 1], [1, PADDING, PADDING, PADDING]])
    out = GenerateOutput(torch.cat([prompts, new], 1), {}, sources)
    assert out.new_tokens() == [[1, 2, 3, 0], [4]]  # a generated pad-valued token stays; end padding goes


@pytest.mark.parametrize("rule,reference", [("lossless", "verifier"), ("drafter", "drafter")])
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch3"])
def test_greedy_matches_hf_generate(near_pair, rule, reference, prompts):
    """lossless decodes the verifier's greedy output; the drafter rule (pi = q) the drafter's, with the
    exact bonus (bonus_from="target": the default takes a whole block's bonus token from p)."""
    drafter, verifier = near_pair
    ids, mask = left_padded(prompts)
    out = generate(
        drafter,
        verifier,
        ids,
        rule=rule,
        gamma=4,
        temperature=0.0,
        max_new_tokens=NEW,
        attention_mask=mask,
        bonus_from="target",
    )
    model = verifier if reference == "verifier" else drafter
    for b, prompt in enumerate(prompts):
        assert out.new_tokens()[b] == hf_greedy(model, prompt)
    assert torch.equal(out.sequences[:, : ids.shape[1]], ids)


def test_batch_rows_really_accept_different_lengths(near_pair):
    """The batch-3 case above must exercise ragged acceptance, or it proves nothing."""
    ids, mask = left_padded(PROMPTS)
    out = generate(*near_pair, ids, rule="lossless", gamma=4, max_new_tokens=NEW, attention_mask=mask)
    hist = out.stats["accepted_hist"]
    assert sum(1 for c in hist if c > 0) >= 3, hist
    assert out.stats["verifier_forwards"] == out.stats["blocks"]  # one verifier forward per block


@pytest.mark.parametrize("rule,alpha", [("opt", 0.5), ("token_v3", 0.4), ("lossy", 0.5), ("chow", 0.6)])
def test_sampling_is_reproducible_by_seed(near_pair, rule, alpha):
    ids, mask = left_padded(PROMPTS)
    kw = dict(rule=rule, alpha=alpha, gamma=3, temperature=1.0, top_p=0.9, max_new_tokens=NEW, attention_mask=mask)
    a = generate(*near_pair, ids, seed=7, **kw)
    b = generate(*near_pair, ids, seed=7, **kw)
    c = generate(*near_pair, ids, seed=8, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, c.sequences)


def test_stats_are_consistent(near_pair):
    ids, mask = left_padded(PROMPTS)
    out = generate(
        *near_pair, ids, rule="opt", alpha=0.0, gamma=4, temperature=1.0, max_new_tokens=NEW, attention_mask=mask
    )
    s = out.stats
    assert s["new_tokens"] == int((out.sources != PADDING).sum())
    assert 0 <= s["rejection_rate"] <= 1 and s["tokens_per_second"] > 0
    assert s["drafter_forwards"] <= s["blocks"] * 5
    assert s["rejections"] <= s["drafts_evaluated"]


def test_eos_stops_each_row_and_pads(near_pair):
    drafter, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    out = generate(drafter, verifier, ids, rule="lossless", gamma=4, max_new_tokens=NEW, attention_mask=mask)
    for b in range(len(PROMPTS)):
        toks = out.new_tokens()[b]
        assert 2 not in toks[:-1]  # nothing generated after an EOS
        assert len(toks) <= NEW


def test_autoregressive_baseline_matches_hf(near_pair):
    _, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    out = generate_autoregressive(verifier, ids, max_new_tokens=NEW, attention_mask=mask)
    for b, prompt in enumerate(PROMPTS):
        assert out.new_tokens()[b] == hf_greedy(verifier, prompt)
    assert out.stats["verifier_forwards"] >= NEW // 2


def test_token_cascade_endpoints_and_sparse_verifier_calls(near_pair):
    drafter, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    never = generate_token_cascade(drafter, verifier, ids, alpha=1.0, max_new_tokens=NEW, attention_mask=mask)
    always = generate_token_cascade(drafter, verifier, ids, alpha=0.0, max_new_tokens=NEW, attention_mask=mask)
    mid = generate_token_cascade(drafter, verifier, ids, alpha=0.75, max_new_tokens=NEW, attention_mask=mask)
    for b, prompt in enumerate(PROMPTS):
        assert never.new_tokens()[b] == hf_greedy(drafter, prompt)
        assert always.new_tokens()[b] == hf_greedy(verifier, prompt)
    assert never.stats["verifier_forwards"] == 0
    assert 0 < mid.stats["verifier_forwards"] < always.stats["verifier_forwards"]


def test_sequence_cascade_endpoints(near_pair):
    drafter, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    keep = generate_sequence_cascade(drafter, verifier, ids, alpha=1.0, max_new_tokens=NEW, attention_mask=mask)
    redo = generate_sequence_cascade(drafter, verifier, ids, alpha=0.0, max_new_tokens=NEW, attention_mask=mask)
    for b, prompt in enumerate(PROMPTS):
        assert keep.new_tokens()[b] == hf_greedy(drafter, prompt)
        assert redo.new_tokens()[b] == hf_greedy(verifier, prompt)
    assert keep.stats["verifier_forwards"] == 0 and redo.stats["deferrals"] == len(PROMPTS)


def test_vocab_padding_difference_is_handled():
    """A verifier whose output matrix has extra padding rows pairs up: they are never emitted."""
    drafter = tiny_qwen(seed=1, layers=1, hidden=32)
    verifier = tiny_qwen(seed=2, vocab=128)
    ids = torch.tensor([PROMPTS[0]])
    out = generate(drafter, verifier, ids, rule="lossless", max_new_tokens=20)
    ref = verifier.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=20,
        suppress_tokens=list(range(96, 128)),
    )
    assert out.new_tokens()[0] == ref[0, ids.shape[1] :].tolist()


# ---- stub models with fixed logits: exact acceptance counts ------------------------------------


def _stub_pair(drafter_choice, verifier_choice):
    return StubLM(drafter_choice), StubLM(verifier_choice)


def _simulate_greedy(d_choice, v_choice, start, gamma, new):
    """Reference greedy speculative decoding over positions, in plain Python."""
    hist, pos, emitted = [0] * (gamma + 1), start, 0
    while emitted < new:
        g = max(1, min(gamma, new - emitted - 1))
        n = 0
        while n < g and d_choice(pos + n) == v_choice(pos + n):
            n += 1
        hist[n] += 1
        pos += n + 1
        emitted += n + 1
    return hist


@pytest.mark.parametrize(
    "case,v_choice,expected_acc",
    [
        ("always", lambda t: 5, 4),
        ("never", lambda t: 6, 0),
        ("sometimes", lambda t: 6 if t % 3 == 0 else 5, None),
    ],
)
def test_stub_exact_accept_counts(case, v_choice, expected_acc):
    def d_choice(t):
        return 5

    drafter, verifier = _stub_pair(d_choice, v_choice)
    ids = torch.tensor([[7, 8, 9, 10]])
    out = generate(drafter, verifier, ids, rule="lossless", gamma=4, max_new_tokens=21)
    hist = _simulate_greedy(d_choice, v_choice, start=4, gamma=4, new=21)
    assert out.stats["accepted_hist"] == hist
    if expected_acc is not None:
        assert sum(hist[:-1] if expected_acc == 4 else hist[1:]) <= 1  # only the shortened last block differs
    assert out.stats["verifier_forwards"] == verifier.calls == sum(hist)
    toks = out.new_tokens()[0]
    assert toks == [v_choice(t) for t in range(4, 4 + 21)]  # lossless greedy = the verifier's choices
    assert out.sources[0].tolist().count(FROM_DRAFTER) == sum(n * c for n, c in enumerate(hist))


@pytest.mark.parametrize("same,expected", [(True, "all"), (False, "none")])
def test_stub_sampling_always_or_never_accepts(same, expected):
    """temperature 1: q == p accepts every draft; disjoint supports accept none."""
    q = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.5, 0, 0, 0]) + 1e-12
    p = q if same else torch.tensor([0.0, 0, 0, 0, 0, 0.5, 0.5, 0]) + 1e-12
    drafter = StubLM(probs=lambda t: q / q.sum(), vocab=8)
    verifier = StubLM(probs=lambda t: p / p.sum(), vocab=8)
    out = generate(
        drafter, verifier, torch.tensor([[3, 4]]), rule="lossless", gamma=3, temperature=1.0, max_new_tokens=16, seed=1
    )
    hist = out.stats["accepted_hist"]
    if expected == "all":
        assert hist[0] == hist[1] == 0 and out.stats["rejections"] == 0
    else:
        assert hist[1:] == [0, 0, 0] and out.stats["rejection_rate"] == 1.0
        assert set(out.new_tokens()[0]) <= {5, 6}


class HalfwayRule:
    """A user-defined rule object: plugs into generate through the same target() interface."""

    name = "halfway"

    def __init__(self):
        self.calls = 0

    def target(self, q, p, alpha, q_raw=None, p_raw=None):
        self.calls += 1
        return 0.5 * q + 0.5 * p


def test_any_object_with_target_plugs_in(near_pair):
    ids, mask = left_padded(PROMPTS)
    rule = HalfwayRule()
    out = generate(*near_pair, ids, rule=rule, gamma=3, temperature=1.0, max_new_tokens=12, attention_mask=mask)
    assert rule.calls >= out.stats["blocks"] and out.stats["rule"] == "halfway"
    with pytest.raises(TypeError, match="target"):
        generate(*near_pair, ids, rule=object(), max_new_tokens=4, attention_mask=mask)
    with pytest.raises(KeyError, match="known rules"):
        generate(*near_pair, ids, rule="fastest", max_new_tokens=4, attention_mask=mask)


def test_bad_inputs_are_clear_errors(near_pair):
    with pytest.raises(ValueError, match="left-padded"):
        generate(*near_pair, torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        generate(*near_pair, torch.tensor([5, 6, 7]))
    with pytest.raises(ValueError, match="top_p"):
        generate(*near_pair, torch.tensor([[5, 6]]), top_p=0.0)
    with pytest.raises(ValueError, match="outside opt"):
        generate(*near_pair, torch.tensor([[5, 6]]), alpha=float("nan"))


def test_bonus_from_verifier_saves_drafter_forwards(near_pair):
    """bonus_from='verifier' (the default) draws full-block bonus tokens from p: fewer drafter forwards
    than the exact bonus_from='target' (token_v3 at alpha 1 keeps every draft, pi = q; the drafter
    rule itself always takes the exact bonus, see the drafter-only test)."""
    ids, mask = left_padded(PROMPTS)
    kw = dict(rule="token_v3", alpha=1.0, gamma=4, max_new_tokens=NEW, attention_mask=mask)
    exact = generate(*near_pair, ids, bonus_from="target", **kw)
    cheap = generate(*near_pair, ids, **kw)
    full_blocks = exact.stats["accepted_hist"][-1]
    assert full_blocks > 0
    assert cheap.stats["drafter_forwards"] < exact.stats["drafter_forwards"]
    assert cheap.stats["bonus_from"] == "verifier"
    with pytest.raises(ValueError, match="bonus_from"):
        generate(*near_pair, ids, bonus_from="drafter", **kw)


@pytest.mark.parametrize("bonus_from,bonus_token", [("target", 5), ("verifier", 6)])
def test_bonus_token_source_is_exact(bonus_from, bonus_token):
    """token_v3 at alpha 1 keeps every draft (pi = q); only the bonus token can differ."""
    drafter, verifier = StubLM(lambda t: 5), StubLM(lambda t: 6)
    out = generate(
        drafter,
        verifier,
        torch.tensor([[7, 8]]),
        rule="token_v3",
        alpha=1.0,
        gamma=4,
        max_new_tokens=10,
        bonus_from=bonus_from,
    )
    assert out.new_tokens()[0] == [5, 5, 5, 5, bonus_token, 5, 5, 5, 5, bonus_token]
    expected_drafter_calls = 2 * (4 if bonus_from == "verifier" else 5)
    assert drafter.calls == expected_drafter_calls


@pytest.mark.parametrize("method", ["verifier", "lossless", "opt", "token_v2"])
def test_loop_logprobs_are_the_verifiers_teacher_forced_ones(near_pair, method):
    """The verifier's log-probability of each emitted token, kept by the loop, equals a
    teacher-forced verifier pass over the output (batch 3, ragged rows)."""
    drafter, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    if method == "verifier":
        out = generate_autoregressive(verifier, ids, max_new_tokens=20, attention_mask=mask)
    else:
        out = generate(drafter, verifier, ids, rule=method, alpha=0.3, gamma=4, max_new_tokens=20, attention_mask=mask)
    assert out.verifier_logprobs is not None
    for b, prompt in enumerate(PROMPTS):
        new = out.new_tokens()[b]
        assert len(out.verifier_logprobs[b]) == len(new)
        with torch.no_grad():
            logits = verifier(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1]
        want = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(new)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(out.verifier_logprobs[b]), want, atol=1e-4, rtol=1e-4)
    # eval's pass for outputs the loop did not score: the same sums, batched and ragged
    outputs = [out.new_tokens()[b] for b in range(len(PROMPTS))]
    sums = continuation_logprobs(verifier, PROMPTS, outputs, verifier.config.vocab_size, 0)
    torch.testing.assert_close(
        torch.tensor(sums), torch.tensor([sum(x) for x in out.verifier_logprobs]), atol=1e-3, rtol=1e-4
    )


def test_loops_without_the_verifiers_view_report_no_logprobs(near_pair):
    drafter, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    common = dict(max_new_tokens=5, attention_mask=mask)
    assert generate_autoregressive(drafter, ids, role="drafter", **common).verifier_logprobs is None
    assert generate_token_cascade(drafter, verifier, ids, alpha=0.3, **common).verifier_logprobs is None
    assert (
        generate_sequence_cascade(
            drafter, verifier, ids, alpha=0.5, max_new_tokens=5, attention_mask=mask
        ).verifier_logprobs
        is None
    )


def test_draft_stop_ends_unsure_blocks_without_changing_greedy_outputs(near_pair):
    """A drafter-confidence stop shortens blocks; lossless greedy output stays the verifier's."""
    drafter, verifier = near_pair
    ids, mask = left_padded(PROMPTS)
    full = generate(drafter, verifier, ids, rule="lossless", gamma=5, max_new_tokens=30, attention_mask=mask)
    short = generate(
        drafter, verifier, ids, rule="lossless", gamma=5, max_new_tokens=30, attention_mask=mask, draft_stop=0.99
    )  # a random tiny drafter is never this sure: one draft per block
    assert torch.equal(full.sequences, short.sequences)
    assert short.stats["block_drafts"] == short.stats["blocks"] and short.stats["draft_stop"] == 0.99
    never = generate(
        drafter, verifier, ids, rule="lossless", gamma=5, max_new_tokens=30, attention_mask=mask, draft_stop=1e-9
    )  # always sure enough: the same blocks as without the option
    assert never.stats["block_drafts"] == full.stats["block_drafts"] and torch.equal(never.sequences, full.sequences)
    with pytest.raises(ValueError, match="draft_stop must be in"):
        generate(drafter, verifier, ids, rule="lossless", attention_mask=mask, draft_stop=1.5)


def test_draft_stop_keeps_the_sampled_distribution():
    """Lossless sampling with blocks that end where the drafter is unsure still draws every token
    from the verifier's distribution. The stub drafter is flat (unsure in every row) at odd
    positions, so blocks end there for the whole batch; chi-square per output column."""
    q = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.05, 0.05, 0.03, 0.02])
    flat = torch.full((8,), 1 / 8)
    p = torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.02, 0.03, 0.05])
    drafter = StubLM(probs=lambda t: flat if t % 2 else q, vocab=8, eos=100)  # eos outside the vocabulary
    verifier = StubLM(probs=lambda t: p, vocab=8, eos=100)
    n = 20000
    plain = generate(
        drafter, verifier, torch.full((n, 1), 3), rule="lossless", gamma=4, temperature=1.0, max_new_tokens=5, seed=5
    )
    out = generate(
        drafter,
        verifier,
        torch.full((n, 1), 3),
        rule="lossless",
        gamma=4,
        temperature=1.0,
        max_new_tokens=5,
        seed=5,
        draft_stop=0.2,
    )
    assert out.stats["block_drafts"] / out.stats["blocks"] < plain.stats["block_drafts"] / plain.stats["blocks"]
    for column in range(1, 6):
        freq = torch.bincount(out.sequences[:, column], minlength=8).double() / n
        stat = float(((freq - p.double()) ** 2 / p.double()).sum() * n)  # chi-square, 7 degrees of freedom
        assert stat < 24.3, (column, freq)  # p = 0.001


def test_auto_gamma_adapts_the_block_size_and_stays_exact(near_pair, monkeypatch):
    """gamma="auto": gamma re-chosen each block from the pair's costs and the acceptance so far;
    greedy lossless still reproduces the verifier token for token."""
    from router.machine import calibrate

    drafter, verifier = near_pair
    # costs where long blocks pay only at high acceptance: a pass over n tokens costs 1 + 0.4 (n - 1)
    monkeypatch.setattr(calibrate, "measure_costs", lambda d, v, b, m: (0.05, [1 + 0.4 * n for n in range(m + 1)]))
    calibrate._COSTS.clear()
    ids, mask = left_padded(PROMPTS)
    out = generate(drafter, verifier, ids, rule="lossless", gamma="auto", max_new_tokens=NEW, attention_mask=mask)
    for b, prompt in enumerate(PROMPTS):
        assert out.new_tokens()[b] == hf_greedy(verifier, prompt)
    chosen, acceptance = out.stats["gamma_chosen"], out.stats["acceptance_estimate"]
    assert sum(chosen.values()) == out.stats["blocks"] and 0 < acceptance < 1
    assert len(out.stats["accepted_hist"]) == calibrate.MAX_GAMMA + 1
    # the last choice is what choose_gamma gives at the final acceptance estimate
    from router.machine.costs import choose_gamma

    assert all(1 <= g <= calibrate.MAX_GAMMA for g in chosen)
    expected, _ = choose_gamma(acceptance, 0.05, [1 + 0.4 * n for n in range(calibrate.MAX_GAMMA + 1)])
    assert expected in chosen
    with pytest.raises(ValueError, match="integer from 1 to 128"):
        generate(drafter, verifier, ids, gamma="fast", attention_mask=mask)


def test_auto_gamma_decodes_with_the_verifier_alone_where_speculation_does_not_pay(near_pair, monkeypatch):
    """gamma="auto" on a machine where no block size beats the verifier (a drafter step as slow as
    a verifier pass): every token from the verifier alone, the drafter never runs, and the output
    is exactly the verifier's own, sampled ones included (same seed, same draws)."""
    from router.machine import calibrate

    drafter, verifier = near_pair
    monkeypatch.setattr(calibrate, "measure_costs", lambda d, v, b, m: (1.0, [1 + 0.5 * n for n in range(m + 1)]))
    calibrate._COSTS.clear()
    ids, mask = left_padded(PROMPTS)
    for temperature in (0.0, 1.0):
        common = dict(temperature=temperature, max_new_tokens=NEW, attention_mask=mask, seed=3)
        out = generate(drafter, verifier, ids, rule="opt", alpha=0.9, gamma="auto", **common)
        alone = generate_autoregressive(verifier, ids, **common)
        assert torch.equal(out.sequences, alone.sequences) and torch.equal(out.sources, alone.sources)
        assert out.verifier_logprobs == alone.verifier_logprobs
        assert out.stats["drafter_forwards"] == 0 and out.stats["blocks"] == 0
        assert out.stats["verifier_steps"] == alone.stats["verifier_forwards"] and out.stats["gamma_chosen"] == {
            0: out.stats["verifier_steps"]
        }


def test_verifier_steps_between_blocks_keep_the_loop_exact(near_pair, monkeypatch):
    """Blocks after verifier-alone steps: the drafter's cache catches up on the tokens it missed in
    its next forward, and greedy lossless output stays the verifier's."""
    from router.machine import calibrate

    drafter, verifier = near_pair
    monkeypatch.setattr(calibrate, "measure_costs", lambda d, v, b, m: (0.05, [1.0] * (m + 1)))
    calibrate._COSTS.clear()
    schedule = iter([0, 0, 3, 0, 2] * NEW)
    monkeypatch.setattr(calibrate.AdaptiveGamma, "next", lambda self: next(schedule))
    ids, mask = left_padded(PROMPTS)
    out = generate(drafter, verifier, ids, rule="lossless", gamma="auto", max_new_tokens=NEW, attention_mask=mask)
    for b, prompt in enumerate(PROMPTS):
        assert out.new_tokens()[b] == hf_greedy(verifier, prompt)
    assert out.stats["verifier_steps"] > 0 and out.stats["blocks"] > 0 and out.stats["drafter_forwards"] > 0


def test_calibrated_gamma_follows_the_costs(near_pair):
    from router.machine.calibrate import GammaChoice, calibrate_gamma

    drafter, verifier = near_pair
    flat = (0.01, [1.0] * 9)  # a GPU-like verifier: 8 drafts cost what 1 does
    steep = (0.3, [1.0 + 0.5 * n for n in range(9)])  # a CPU in float32 with a slow drafter
    assert calibrate_gamma(drafter, verifier, 1, 0.9, costs=flat).gamma == 8
    slow = calibrate_gamma(drafter, verifier, 1, 0.5, costs=steep)
    assert not slow.pays and "does NOT pay" in slow.summary()
    measured = calibrate_gamma(drafter, verifier, 2, 0.8, max_gamma=3)  # the real measurement, tiny pair
    assert len(measured.verify_seconds) == 4 and measured.batch == 2 and 1 <= measured.gamma <= 3
    assert GammaChoice.from_dict(measured.as_dict()) == measured
    with pytest.raises(ValueError, match="acceptance"):
        calibrate_gamma(drafter, verifier, 1, 1.5, costs=flat)


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("bonus_from", ["verifier", "target"])
def test_the_drafter_rule_is_drafter_only_decoding_whatever_the_bonus_default(tiny, gamma, bonus_from):
    """rule="drafter" says pi = q: every token, the bonus ones included, is the drafter's (under the
    default bonus_from="verifier" a whole block's bonus token used to come from p)."""
    from router.loop.baselines import generate_autoregressive

    drafter, verifier, _ = tiny
    prompts = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    alone = generate_autoregressive(drafter, prompts, max_new_tokens=20, role="drafter")
    out = generate(drafter, verifier, prompts, rule="drafter", gamma=gamma, max_new_tokens=20, bonus_from=bonus_from)
    assert torch.equal(out.sequences, alone.sequences)
    assert out.stats["rejections"] == 0


@pytest.mark.parametrize("rule,alpha,gamma", [("fly", 0.5, 7), ("entropy_gate", 0.1, 4), ("token_v2", 0.3, 4)])
def test_a_ragged_batch_decodes_each_row_as_that_prompt_alone(near_pair, rule, alpha, gamma):
    """At temperature 0 a lossy rule decodes every row of a batch as it decodes that prompt alone, and a
    shorter budget gives a prefix of a longer one, so online comparisons at batch > 1 measure the same
    policy. For a window rule this needs the last block uncut (a cut block cuts its windows: with
    PROMPTS[2], fly's 34th token changed with the budget and the batch before block_drafts)."""
    ids, mask = left_padded(PROMPTS)
    kw = dict(rule=rule, alpha=alpha, gamma=gamma, temperature=0.0)
    batch = generate(*near_pair, ids, attention_mask=mask, max_new_tokens=NEW, **kw)
    kept_drafts = 0
    for b, prompt in enumerate(PROMPTS):
        alone = generate(*near_pair, torch.tensor([prompt]), max_new_tokens=NEW, **kw)
        longer = generate(*near_pair, torch.tensor([prompt]), max_new_tokens=NEW + 20, **kw)
        assert batch.new_tokens()[b] == alone.new_tokens()[0]
        assert longer.new_tokens()[0][:NEW] == alone.new_tokens()[0]
        kept_drafts += alone.stats["drafts_evaluated"] - alone.stats["deferrals"]
    assert batch.stats["deferrals"] > 0 and kept_drafts > 0  # the rule both keeps and defers here


def test_only_a_window_policy_drafts_past_the_budget():
    assert block_drafts(resolve_rule("fly"), 8, 3) == 8
    assert block_drafts(resolve_rule("token_v2"), 8, 3) == 2 and block_drafts(resolve_rule("token_v2"), 8, 1) == 1
