"""The speculative cascade decoding loop (docs/method.md, "The decoding loop").

`generate` decodes a batch of left-padded prompts block by block: the drafter proposes `gamma`
tokens, the verifier scores them all in one forward, the deferral policy forms
`pi = target(q, p, alpha, q_raw, p_raw)`, the speculative sampler accepts a prefix and draws the
next token at the first rejection (or the bonus token after a whole block). Each model keeps a
KV cache that is rolled back on rejection, never recomputing the accepted prefix, and rows of a
batch accept different numbers of tokens (see `router/engine/layout.py`). What every loop shares
(settings, checks, outputs, stats) is in `router/engine/loop.py`; the baselines in `router/engine/baselines.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from router.infra import clock
from router.machine.calibrate import MAX_GAMMA, AdaptiveGamma
from router.engine.layout import CachedModel, Layout, drop_trailing_holes, output_pad_id
from router.engine.lookup import LookupCache, LookupDrafter
from router.engine.loop import (
    FROM_DRAFTER,
    FROM_VERIFIER,
    GenerateOutput,
    Rows,
    check_inputs,
    check_token_ids,
    shared_vocab,
    eos_ids,
    finish,
    first_layout,
    final_stats,
    one_model_step,
    speculative_stats,
    vocab_size,
)
from router.engine.prefix import SharedPrefix
from router.tasks.prompts import StopStrings
from router.engine.options import DecodeOptions
from router.policy import DeferralPolicy
from router.rules import resolve_rule
from router.targets import trusted_inputs, tv_distance
from router.engine.policy_call import block_drafts, check_block_size, hidden_kwargs, logit_kwargs, policy_target
from router.sampling import accept_drafts, next_after, sample
from router.window.follow import block_window
from router.window.lag import LagCarry

PI_EQUALS_Q_TOL = 1e-6  # a position "defers" when TV(q, pi) exceeds this


# ---- speculative cascade -------------------------------------------------------------------------


@dataclass
class Block:
    """One block of the loop: g drafts and everything computed about them, shapes (B, g, ...)."""

    drafts: torch.Tensor  # (B, g) the drafter's tokens
    q_raw: torch.Tensor  # (B, g, V) drafter, temperature 1 (decisions)
    q: torch.Tensor  # (B, g, V) drafter, scaled (sampling)
    drafter_hidden: torch.Tensor | None  # (B, g, H) where q was computed, when the policy reads it
    p_raw: torch.Tensor | None = None  # (B, g+1, V) verifier at every draft and the bonus position
    p: torch.Tensor | None = None
    verifier_hidden: torch.Tensor | None = None  # (B, g+1, H)
    pi: torch.Tensor | None = None  # (B, g, V) the policy's target at each draft
    judge: bool = False  # pi depends on the drafted token (a judge): see _record_block
    n_accepted: torch.Tensor | None = None  # (B,) drafts each row keeps
    q_logits: torch.Tensor | None = None  # (B, g, V) the logits q_raw is the softmax of
    p_logits: torch.Tensor | None = None  # (B, g+1, V) the logits p_raw is the softmax of

    @property
    def g(self) -> int:
        return self.drafts.shape[1]

    @property
    def whole(self) -> torch.Tensor:
        """(B,) rows that accepted every draft (their next token is the bonus token)."""
        return self.n_accepted == self.g


def draft(
    drafter: CachedModel,
    layout: Layout,
    g: int,
    opts: DecodeOptions,
    gen,
    draft_stop: float | None = DecodeOptions.draft_stop,
    keep_logits: bool = False,
    carry: LagCarry | None = None,
) -> Block:
    """Step 1: up to g drafts with their drafter distributions, one drafter forward each. The last
    draft is left pending (not yet fed): its forward only pays off when some row accepts every draft
    (`block_end`). With `draft_stop`, the block ends early once the drafter's raw probability of its
    own draft is below it in every row (an unsure drafter's next drafts are likely rejected); what
    is drafted is still drawn from q, so the sampled distribution does not change. keep_logits: the
    block keeps the drafter's logits too (for a policy that reads them, `logit_kwargs`). A lag policy's
    `carry` gets the drafter's logits at the previous block's bonus position from the first forward,
    which feeds that block's last draft with the bonus token anyway (router/window/lag.py)."""
    raws, scaled, tokens, hidden, logits = [], [], [], [], []
    for step in range(g):
        spare = step == 0 and carry is not None and carry.needs_drafter_logits
        out = drafter.feed(layout, layout.length, keep=2 if spare else 1)  # (B, 1 or 2, V)
        if spare:
            carry.resolve(out[:, 0])  # the column of the last draft: the drafter's view of the bonus position
        logits.append(out[:, -1])  # (B, V)
        raw, q = opts.probs(logits[-1])  # (B, V) each
        x = sample(q, gen, greedy=opts.temperature == 0)  # (B,); greedy: no host sync per draft
        raws.append(raw)
        scaled.append(q)
        tokens.append(x)
        if drafter.want_hidden:
            hidden.append(drafter.last_hidden[:, -1])  # (B, H) where q was computed
        layout.append(x[:, None])
        if draft_stop is not None and bool((raw.gather(-1, x[:, None]) < draft_stop).all()):
            break
    return Block(
        torch.stack(tokens, 1),
        torch.stack(raws, 1),
        torch.stack(scaled, 1),
        torch.stack(hidden, 1) if hidden else None,
        q_logits=torch.stack(logits, 1) if keep_logits else None,
    )


def verify(verifier: CachedModel, layout: Layout, block: Block, opts: DecodeOptions) -> None:
    """Step 2: one verifier forward scores every draft and the bonus position."""
    block.p_logits = verifier.feed(layout, layout.length, keep=block.g + 1)  # (B, g+1, V)
    block.p_raw, block.p = opts.probs(block.p_logits)
    block.verifier_hidden = verifier.last_hidden if verifier.want_hidden else None


def form_target(
    policy: DeferralPolicy, alpha: float, block: Block, greedy: bool = False, carry: LagCarry | None = None
) -> None:
    """Step 3: the deferral policy's target pi at each draft.

    A judge (policy form "judge") decides each drafted token d_j from what the verification forward
    computed after reading it: the hidden state at d_j's column and p_{j+1} (its lookahead). A window
    policy (`follow` > 0) also reads the verifier's scores of the drafts after d_j (router/window/follow.py),
    a lag policy the features of the positions before the block (`carry`, router/window/lag.py)."""
    g = block.g
    vh = block.verifier_hidden
    v_hidden, after = (None, None) if vh is None else (vh[:, :g], vh[:, 1 : g + 1])
    judge = {"drafts": block.drafts, "next_p_raw": block.p_raw[:, 1 : g + 1]} if policy.form == "judge" else {}
    nxt_logits = block.p_logits[:, 1 : g + 1] if judge else None
    if policy.follow:  # a window policy: the verifier's scores of the drafts after each draft
        judge.update(drafts=block.drafts, follow=block_window(block.drafts, block.p_raw[:, :g], policy.follow))
    if carry is not None:
        judge["lag"] = carry.snapshot()
    logits = logit_kwargs(policy, block.q_logits, block.p_logits[:, :g], nxt_logits)
    block.pi = policy_target(
        policy,
        alpha,
        block.q,
        block.p[:, :g],
        block.q_raw,
        block.p_raw[:, :g],
        greedy,
        **hidden_kwargs(policy, block.drafter_hidden, v_hidden, after),
        **judge,
        **logits,
    )
    block.judge = policy.form in ("judge", "window")  # pi depends on the drafted token


def block_end(
    policy: DeferralPolicy,
    alpha: float,
    drafter: CachedModel,
    layout: Layout,
    block: Block,
    opts: DecodeOptions,
    bonus_from: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 5: (q, pi) (B, V) where each row's block ends: its first rejected draft, or the bonus position.

    The bonus position needs q there (one more drafter forward) only when some row accepted every
    draft; a policy whose target there ignores q (`bonus_needs_drafter` False, e.g. lossless) and
    bonus_from="verifier" (pi = p at that one position; not for an `exact_bonus` policy such as the
    drafter-only reference) skip the forward (the last draft is then fed
    with the next token, at no extra cost). q at a bonus position only matters for rejected rows, so
    p stands in for it there.
    """
    g, rows = block.g, torch.arange(block.q.shape[0], device=block.q.device)
    stop = block.n_accepted.clamp_max(g - 1)
    q_n, pi_n = block.q[rows, stop], block.pi[rows, stop]  # (B, V)
    if not bool(block.whole.any()):
        return q_n, pi_n
    if not policy.bonus_needs_drafter or (bonus_from == "verifier" and not policy.exact_bonus):
        bonus_q = bonus_pi = block.p[:, g]
    else:
        bq_logits = drafter.feed(layout, layout.length, keep=1)  # (B, 1, V)
        bq_raw, bq = opts.probs(bq_logits)
        v_hidden = None if block.verifier_hidden is None else block.verifier_hidden[:, g:]
        bonus_pi = policy_target(
            policy,
            alpha,
            bq,
            block.p[:, g:],
            bq_raw,
            block.p_raw[:, g:],
            opts.temperature == 0,
            **hidden_kwargs(policy, drafter.last_hidden, v_hidden),
            **logit_kwargs(policy, bq_logits, block.p_logits[:, g:]),
        )[:, 0]
        bonus_q = bq[:, 0]
    whole = block.whole[:, None]
    return torch.where(whole, bonus_q, q_n), torch.where(whole, bonus_pi, pi_n)


def generate(
    drafter,
    verifier,
    input_ids: torch.Tensor,
    rule="opt",
    alpha: float = 0.3,
    gamma: int | str = DecodeOptions.gamma,
    temperature: float = DecodeOptions.temperature,
    top_p: float = DecodeOptions.top_p,
    max_new_tokens: int = DecodeOptions.max_new_tokens,
    seed: int = DecodeOptions.seed,
    attention_mask: torch.Tensor | None = None,
    bonus_from: str = DecodeOptions.bonus_from,
    stop: StopStrings | None = None,
    prefix: SharedPrefix | None = None,
    draft_stop: float | None = DecodeOptions.draft_stop,
    check_pair: bool = True,
) -> GenerateOutput:
    """Speculative cascade decoding of a batch of left-padded prompts (see module docstring).

    `rule` is a rule name from `router.rules.rule_names()` or any deferral policy with the same
    `target` method (e.g. a learned router from `router.model.load_router`). When every draft of a
    block passes, the bonus token comes from the verifier's p (bonus_from="verifier", the default:
    that one position defers, no drafter forward) or from pi (bonus_from="target", exact as in the
    paper: one more drafter forward per wholly accepted block to get q there, for every policy whose
    target reads q). The default was chosen with measured numbers (docs/results.md, the exact bonus's
    cost). `stop` strings end a row like EOS
    (`router.tasks.prompts.StopStrings`); a `prefix` every prompt starts with is read from its cache
    (`router.engine.prefix.SharedPrefix`) instead of being prefilled again. `draft_stop` (in (0, 1)) ends a
    block early when the drafter is unsure of its draft in every row (as Hugging Face's assistant
    confidence threshold and llama.cpp's draft p_min do); None drafts gamma tokens every block.
    gamma="auto" chooses the block size before every block from the pair's measured costs on this
    machine and the acceptance rate so far (`router.machine.calibrate.AdaptiveGamma`; the costs are measured
    once per process, pair and batch size, about 30 s for the embedded pair on 2 CPU cores); where
    no block size is expected to beat the verifier alone, it decodes with the verifier alone
    (stats `verifier_steps`), whatever the rule: the verifier's quality at the verifier's speed.
    `drafter` is a causal LM sharing the verifier's tokenizer, or a `router.engine.lookup.LookupDrafter`
    (drafts looked up in a reference answer per row, no network; with rule="lossless" and greedy
    decoding the output is still exactly the verifier's). A learned router decodes only with the
    models it was trained on (their weight fingerprints, computed once per model object);
    check_pair=False skips that check.
    """
    knobs = dict(temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, gamma=gamma)
    opts = DecodeOptions(**knobs, draft_stop=draft_stop, bonus_from=bonus_from)  # checked once; only opts is read below
    attention_mask = check_inputs(input_ids, attention_mask)
    check_token_ids(input_ids, drafter, verifier)
    policy = _decoding_policy(rule, drafter, verifier, check_pair, opts.gamma)
    vocab, d = _drafter_for(drafter, verifier, policy, opts.gamma)
    exact_bonus = policy.bonus_needs_drafter and (opts.bonus_from == "target" or policy.exact_bonus)
    adaptive = AdaptiveGamma(drafter, verifier, input_ids.shape[0], exact_bonus) if opts.gamma == "auto" else None
    eos = eos_ids(verifier)
    gen = opts.generator(input_ids.device)
    started = clock.now()
    rows = Rows.start(input_ids.shape[0], eos, opts.max_new_tokens, stop)
    stats = speculative_stats(policy, alpha, opts, MAX_GAMMA if adaptive else opts.gamma)
    v = CachedModel(verifier, vocab)
    v.want_hidden = bool({"verifier", "after"} & set(policy.hidden_inputs))
    layout = first_layout(input_ids, attention_mask, prefix, output_pad_id(verifier, eos), d, v)
    active = list(range(input_ids.shape[0]))
    carry = LagCarry(len(active), policy.lag, input_ids.device) if getattr(policy, "lag", 0) else None
    with torch.inference_mode(), trusted_inputs():  # q, p come from softmax here: skip re-checking them
        while active:
            remaining = max(opts.max_new_tokens - len(rows.tokens[b]) for b in active)
            start = layout.length
            g = adaptive.next() if adaptive else opts.gamma
            if g == 0:  # gamma auto: speculation does not pay here; the drafter's cache catches up if it resumes
                one_model_step(v, layout, opts, gen, rows, active, FROM_VERIFIER, logps=True)
                stats["verifier_steps"] += 1
            else:
                block, nxt = _speculative_block(
                    policy, alpha, d, v, layout, opts, gen, block_drafts(policy, g, remaining), stats, carry
                )
                kept = _record_block(stats, rows, active, block, nxt)  # drafts each row kept, on the host
                if adaptive:
                    adaptive.update(sum(kept), sum(min(n + 1, block.g) for n in kept))
                layout.keep_first(start, block.n_accepted)
                drop_trailing_holes(layout, d, v, holes=layout.length - start - max(kept))
                layout.append(nxt[:, None])
            active = rows.drop_finished(active, layout, d, v, also=(carry,) if carry else ())
    final_stats(stats, d, v, adaptive)
    return finish(input_ids, rows, output_pad_id(verifier, eos), stats, started)


def _decoding_policy(rule, drafter, verifier, check_pair: bool, gamma) -> DeferralPolicy:
    """The policy `rule` names, refused when it cannot decode (offline-only) or, for a learned
    router, when these are not the models it was trained on (check_pair=False skips that)."""
    policy = resolve_rule(rule)
    if policy.offline_only:
        raise ValueError(policy.offline_only)
    check_block_size(policy, gamma)
    if check_pair and policy.trained_pair:
        from router.pair import check_pair_is

        models = (None if isinstance(drafter, LookupDrafter) else drafter, verifier, None)
        check_pair_is(models, policy.trained_pair, f"router {policy.name}")
    return policy


def _speculative_block(
    policy, alpha: float, d, v, layout, opts: DecodeOptions, gen, g: int, stats: dict, carry: LagCarry | None = None
):
    """One block (steps 1-6 of docs/method.md): draft g tokens, verify them in one pass, form pi,
    accept a prefix, and the token after it (the residual at a rejection, else the bonus). Returns
    the block and that next token (B,); the rule's and the bonus drafter's seconds go into stats. A lag
    policy's `carry` moves on by the positions the block emitted."""
    block = draft(d, layout, g, opts, gen, opts.draft_stop, keep_logits=policy.reads_logits, carry=carry)
    verify(v, layout, block, opts)
    stats["block_drafts"] += block.g
    ticked = clock.now()
    form_target(policy, alpha, block, greedy=opts.temperature == 0, carry=carry)
    stats["rule_seconds"] += clock.now() - ticked
    block.n_accepted = accept_drafts(block.drafts, block.q, block.pi, gen)  # step 4: accept a prefix
    if carry is not None:
        ticked = clock.now()
        carry.advance(block.q_raw, block.p_raw, block.n_accepted)
        stats["rule_seconds"] += clock.now() - ticked
    ticked, drafter_before = clock.now(), d.seconds
    q_n, pi_n = block_end(policy, alpha, d, layout, block, opts, opts.bonus_from)
    stats["bonus_drafter_seconds"] += d.seconds - drafter_before  # the bonus-position forward
    stats["rule_seconds"] += clock.now() - ticked - (d.seconds - drafter_before)
    nxt = next_after(q_n, pi_n, ~block.whole, gen)  # step 6: residual token at a rejection, else bonus
    return block, nxt


def _drafter_for(drafter, verifier, policy: DeferralPolicy, gamma) -> tuple[int, CachedModel | LookupCache]:
    """(shared vocabulary, what the loop drives as the drafter): a model's CachedModel, or a
    LookupDrafter's drafts looked up in reference answers (router.engine.lookup; no network)."""
    if not isinstance(drafter, LookupDrafter):
        vocab = shared_vocab(drafter, verifier)
        model = CachedModel(drafter, vocab)
        model.want_hidden = "drafter" in policy.hidden_inputs
        return vocab, model
    if gamma == "auto" or "drafter" in policy.hidden_inputs:
        raise ValueError(
            "a LookupDrafter has no network: give gamma as a number and a policy that does not read "
            "the drafter's hidden state"
        )
    vocab = vocab_size(verifier)
    return vocab, drafter.attach(vocab)


def _record_block(stats, rows: Rows, active, block: Block, nxt: torch.Tensor) -> list[int]:
    """Emit each row's accepted drafts + next token and count acceptances, rejections, deferrals;
    return the drafts each row kept.

    TV(q, pi) (B, g) is the rejection probability at each drafted position; a position "defers"
    when pi differs from q there. Both are counted over the drafts the sampler evaluated. A judge's
    pi depends on the draft, so its rejection probability is that of the draft actually made,
    1 - min(1, pi(d) / q(d)), and it "defers" where it did not keep the draft.
    """
    g = block.g
    if block.judge:
        d = block.drafts[..., None]
        ratio = block.pi.gather(-1, d) / block.q.gather(-1, d).clamp_min(1e-30)
        rejection_prob = (1 - ratio.clamp_max(1)).squeeze(-1)  # (B, g)
        deferred = block.pi.gather(-1, d).squeeze(-1) < 1  # pi is the one-hot draft where kept
    else:
        rejection_prob = tv_distance(block.q, block.pi)  # (B, g)
        deferred = rejection_prob > PI_EQUALS_Q_TOL
    stats["blocks"] += 1
    # the verifier's log-probability of every emitted token: the accepted drafts and the next token sit
    # at positions 0..n of this block's verification forward
    emitted = torch.cat([block.drafts, nxt[:, None]], 1)  # (B, g+1); row i's next token moved to n below
    emitted[torch.arange(len(nxt)), block.n_accepted] = nxt
    logp = block.p_raw.gather(-1, emitted[..., None]).squeeze(-1).clamp_min(1e-30).log()  # (B, g+1)
    # two host transfers per block (a GPU syncs on each), not one per quantity
    ints = torch.cat([block.n_accepted[:, None], nxt[:, None], block.drafts], 1).tolist()  # (B, 2 + g)
    floats = torch.cat([deferred.float(), rejection_prob.float(), logp.float()], 1).tolist()  # (B, 3g + 1)
    n_acc_l, nxt_l, drafts_l = [r[0] for r in ints], [r[1] for r in ints], [r[2:] for r in ints]
    defers, rej, logp = [r[:g] for r in floats], [r[g : 2 * g] for r in floats], [r[2 * g :] for r in floats]
    for i, b in enumerate(active):
        n = n_acc_l[i]
        stats["accepted_hist"][n] += 1
        evaluated = min(n + 1, g)  # drafts the sampler looked at
        stats["drafts_evaluated"] += evaluated
        stats["rejections"] += int(n < g)
        stats["expected_rejections"] += sum(rej[i][:evaluated])
        stats["deferrals"] += int(sum(defers[i][:evaluated]))
        rows.emit(b, drafts_l[i][:n] + [nxt_l[i]], [FROM_DRAFTER] * n + [FROM_VERIFIER], logp[i][: n + 1])
    return n_acc_l
