"""One block of the speculative cascade, read top to bottom (docs/method.md, "The decoding loop").

`decode_block` runs the block's steps in order: draft g tokens (one drafter forward each), verify
them (one verifier forward scores every draft and the bonus position), decide (the policy's pi at each
draft, from one `router.view.BlockView`), accept a prefix (speculative sampling towards pi), end the block
(q and pi where each row's block ends: its first rejection, or the bonus position), draw the next token.
`emit` then hands each row its kept drafts and next token and counts them; rolling the caches back to
what was kept is the loop's (router/decoding.py). Shapes: B rows, g drafts, V tokens, H hidden units.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from router.loop.layout import CachedModel, Layout
from router.loop.common import FROM_DRAFTER, FROM_VERIFIER, Rows
from router.loop.options import DecodeOptions
from router.loop.stats import Stats
from router.policy import DeferralPolicy
from router.reduce import fast_argmax
from router.sampling import accept_drafts, next_after, sample
from router.targets import tv_distance
from router.view import BlockView
from router.window.follow import block_window
from router.window.lag import LagCarry

PI_EQUALS_Q_TOL = 1e-6  # a position "defers" when TV(q, pi) exceeds this


@dataclass
class Block:
    """One block: g drafts and everything computed about them."""

    drafts: torch.Tensor  # (B, g) the drafter's tokens
    q_raw: torch.Tensor  # (B, g, V) drafter, temperature 1 (decisions)
    q: torch.Tensor  # (B, g, V) drafter, scaled (sampling)
    q_logits: torch.Tensor | None  # (B, g, V) the logits q_raw is the softmax of, when the policy reads them
    drafter_hidden: torch.Tensor | None  # (B, g, H) where q was computed, when the policy reads it
    p_raw: torch.Tensor | None = None  # (B, g+1, V) verifier at every draft and the bonus position
    p: torch.Tensor | None = None  # (B, g+1, V) scaled
    p_logits: torch.Tensor | None = None  # (B, g+1, V)
    verifier_hidden: torch.Tensor | None = None  # (B, g+1, H)
    pi: torch.Tensor | None = None  # (B, g, V) the policy's target at each draft
    n_accepted: torch.Tensor | None = None  # (B,) drafts each row keeps

    @property
    def g(self) -> int:
        return self.drafts.shape[1]

    @property
    def whole(self) -> torch.Tensor:
        """(B,) rows that accepted every draft (their next token is the bonus token)."""
        return self.n_accepted == self.g


def decode_block(
    policy: DeferralPolicy,
    alpha: float,
    drafter_cache: CachedModel,
    verifier_cache: CachedModel,
    layout: Layout,
    opts: DecodeOptions,
    gen: torch.Generator | None,
    g: int,
    stats: Stats,
    carry: LagCarry | None = None,
) -> tuple[Block, torch.Tensor]:
    """One block of at most g drafts; returns it (drafts, distributions, pi, n_accepted) and the token
    after the kept drafts (B,): the residual's at a rejection, else the bonus token. A lag policy's
    `carry` (router/window/lag.py) moves on by the positions the block emitted."""
    greedy = opts.temperature == 0
    block = draft(drafter_cache, layout, g, opts, gen, keep_logits="logits" in policy.needs, carry=carry)
    verify(verifier_cache, layout, block, opts)
    stats.block_drafts += block.g
    with stats.policy_time(drafter_cache):
        view = block_view(block, policy.needs.follow, carry)
        block.pi = decide(policy, alpha, view, greedy)  # (B, g, V)
    block.n_accepted = accept_drafts(block.drafts, block.q, block.pi, gen)  # (B,)
    with stats.policy_time(drafter_cache):
        if carry is not None:  # the block's position features, where the policy computed them already
            carry.advance(block.q_raw, block.p_raw, block.n_accepted, view.computed_features)
        q_n, pi_n = block_end(policy, alpha, drafter_cache, layout, block, opts)  # (B, V) each
    return block, next_after(q_n, pi_n, ~block.whole, gen)


def draft(
    drafter: CachedModel,
    layout: Layout,
    g: int,
    opts: DecodeOptions,
    gen: torch.Generator | None,
    keep_logits: bool = False,
    carry: LagCarry | None = None,
) -> Block:
    """Up to g drafts with their drafter distributions. The last draft is left pending (not yet fed): its
    forward only pays off when some row accepts every draft (`block_end`). With opts.draft_stop the block
    ends early once the drafter's raw probability of its own draft is below it in every row; drafts are
    still drawn from q, so the sampled law does not change. A lag policy's `carry` gets the drafter's
    logits at the previous block's bonus position from the first forward, which feeds that block's last
    draft with the bonus token anyway."""
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
        if opts.draft_stop is not None and bool((raw.gather(-1, x[:, None]) < opts.draft_stop).all()):
            break
    stack = torch.stack
    return Block(
        stack(tokens, 1),
        stack(raws, 1),
        stack(scaled, 1),
        stack(logits, 1) if keep_logits else None,
        stack(hidden, 1) if hidden else None,
    )


def verify(verifier: CachedModel, layout: Layout, block: Block, opts: DecodeOptions) -> None:
    """One verifier forward scores every draft and the bonus position."""
    block.p_logits = verifier.feed(layout, layout.length, keep=block.g + 1)  # (B, g+1, V)
    block.p_raw, block.p = opts.probs(block.p_logits)
    block.verifier_hidden = verifier.last_hidden if verifier.want_hidden else None


def block_view(block: Block, follow: int = 0, carry: LagCarry | None = None) -> BlockView:
    """The view a policy decides the block's g drafts from. A judge reads what the verification forward
    computed after each draft d_j (the hidden state at d_j's column and p_{j+1}, its lookahead); a window
    policy the verifier's scores of the `follow` drafts after it (router/window/follow.py, computed only if
    read); a lag policy the features of the positions before the block (router/window/lag.py). Hidden states
    and logits are there when the models were asked for them (the policy's needs)."""
    g, vh = block.g, block.verifier_hidden  # vh (B, g+1, H) or None
    return BlockView(
        block.q,
        block.p[:, :g],
        block.q_raw,
        block.p_raw[:, :g],
        drafts=block.drafts,
        next_p_raw=lambda: block.p_raw[:, 1 : g + 1],
        q_logits=block.q_logits,
        p_logits=None if block.q_logits is None else block.p_logits[:, :g],
        next_p_logits=None if block.q_logits is None else block.p_logits[:, 1 : g + 1],
        hidden_drafter=block.drafter_hidden,
        hidden_verifier=None if vh is None else vh[:, :g],
        hidden_after=None if vh is None else vh[:, 1 : g + 1],
        follow=(lambda: block_window(block.drafts, block.p_raw[:, :g], follow)) if follow else None,
        lag=None if carry is None else carry.snapshot(),
    )


def decide(policy: DeferralPolicy, alpha: float, view: BlockView, greedy: bool) -> torch.Tensor:
    """pi (..., V) from the policy. Greedy decoding (temperature 0: q and p are one-hot) of a policy whose
    pi mixes the two (`greedy_mode`, e.g. `mixture`) takes the mode of its pi over the raw distributions,
    which is what greedy decoding of that mixture means (and what transformers does for
    assistant_ensemble_weight); every other policy's pi is already one-hot there."""
    if greedy and policy.greedy_mode:
        mixed = policy.decide(view.raw(), alpha)  # (..., V)
        return torch.zeros_like(mixed).scatter_(-1, fast_argmax(mixed)[..., None], 1.0)
    return policy.decide(view, alpha)


def block_end(
    policy: DeferralPolicy, alpha: float, drafter: CachedModel, layout: Layout, block: Block, opts: DecodeOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, pi) (B, V) where each row's block ends: its first rejected draft, or the bonus position.

    The bonus position needs q there (one more drafter forward) only when some row accepted every draft
    and the policy reads it there (`bonus_q` in its needs; lossless and judges take p there); with
    bonus_from="verifier" pi = p at that one position (not for an `exact_bonus` policy such as the
    drafter-only reference) and the forward is skipped (the last draft is then fed with the next token,
    at no extra cost). q at a bonus position only matters for rejected rows, so p stands in for it there."""
    g, rows = block.g, torch.arange(block.q.shape[0], device=block.q.device)
    stop = block.n_accepted.clamp_max(g - 1)
    q_n, pi_n = block.q[rows, stop], block.pi[rows, stop]  # (B, V)
    if not bool(block.whole.any()):
        return q_n, pi_n
    if "bonus_q" not in policy.needs or (opts.bonus_from == "verifier" and not policy.exact_bonus):
        bonus_q = bonus_pi = block.p[:, g]
    else:
        bq_logits = drafter.feed(layout, layout.length, keep=1)  # (B, 1, V)
        bq_raw, bq = opts.probs(bq_logits)
        vh = block.verifier_hidden
        view = BlockView(
            bq,
            block.p[:, g:],
            bq_raw,
            block.p_raw[:, g:],
            q_logits=bq_logits,
            p_logits=block.p_logits[:, g:],
            hidden_drafter=drafter.last_hidden if drafter.want_hidden else None,
            hidden_verifier=None if vh is None else vh[:, g:],
        )  # one column: (B, 1, ...)
        bonus_pi, bonus_q = decide(policy, alpha, view, opts.temperature == 0)[:, 0], bq[:, 0]
    whole = block.whole[:, None]
    return torch.where(whole, bonus_q, q_n), torch.where(whole, bonus_pi, pi_n)


def emit(stats: Stats, rows: Rows, active: list[int], block: Block, nxt: torch.Tensor, judge: bool) -> list[int]:
    """Give each row its accepted drafts and next token, count acceptances, rejections and deferrals;
    return the drafts each row kept.

    TV(q, pi) (B, g) is the rejection probability at each drafted position; a position "defers" when pi
    differs from q there. Both are counted over the drafts the sampler evaluated. A `judge` (a policy whose
    pi depends on the draft) has the rejection probability of the draft actually made,
    1 - min(1, pi(d) / q(d)), and it "defers" where it did not keep the draft."""
    g = block.g
    if judge:
        d = block.drafts[..., None]
        ratio = block.pi.gather(-1, d) / block.q.gather(-1, d).clamp_min(1e-30)
        rejection_prob = (1 - ratio.clamp_max(1)).squeeze(-1)  # (B, g)
        deferred = block.pi.gather(-1, d).squeeze(-1) < 1  # pi is the one-hot draft where kept
    else:
        rejection_prob = tv_distance(block.q, block.pi)  # (B, g)
        deferred = rejection_prob > PI_EQUALS_Q_TOL
    stats.blocks += 1
    # the verifier's log-probability of every emitted token: the accepted drafts and the next token sit
    # at positions 0..n of this block's verification forward
    emitted = torch.cat([block.drafts, nxt[:, None]], 1)  # (B, g+1); row i's next token moved to n below
    emitted[torch.arange(len(nxt)), block.n_accepted] = nxt
    logp = block.p_raw.gather(-1, emitted[..., None]).squeeze(-1).clamp_min(1e-30).log()  # (B, g+1)
    # two host transfers per block (a GPU syncs on each), not one per quantity
    ints = torch.cat([block.n_accepted[:, None], nxt[:, None], block.drafts], 1).tolist()  # (B, 2 + g)
    floats = torch.cat([deferred.float(), rejection_prob.float(), logp.float()], 1).tolist()  # (B, 3g + 1)
    kept = [r[0] for r in ints]
    for i, b in enumerate(active):
        n, nxt_i, drafts_i = kept[i], ints[i][1], ints[i][2:]
        stats.count_row(n, g, floats[i][g : 2 * g], floats[i][:g])
        rows.emit(b, drafts_i[:n] + [nxt_i], [FROM_DRAFTER] * n + [FROM_VERIFIER], floats[i][2 * g :][: n + 1])
    return kept
