"""The accept/resample step of a speculative cascade on vLLM's batch, pure torch (no vLLM import).

vLLM hands over, per request, the drafts it made, the drafter's logits at each (captured by the plugin's
drafting hook), the verifier's logits there and the bonus token it sampled
from the verifier at the position after the last draft. This module does what one block of specroute's
loop does after verification (router/loop/block.py): scale q and p as `router.sampling.process_logits`
does, take the policy's pi from a `BlockView`, accept a prefix by speculative sampling toward pi
(`router.sampling.accept_drafts`), and end with the residual's token at the first rejection or vLLM's
bonus token (pi = p there: bonus_from="verifier"). Requests have different numbers of drafts: they are
padded to the longest (B, K) and a request never keeps more drafts than it has.

A step whose requests all decode greedily, with a policy that declares its greedy decision (router/greedy.py:
every built-in rule but mixture and fly, cascade and token routers), takes the sparse path: pi is one-hot on the
draft or on the verifier's argmax, so the step reads that verdict per draft and never forms a (B, K, V) pi; the
tokens and counts are the full path's (tests/router/vllm_plugin/test_vllm_acceptance.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from router.greedy import GreedyView, greedy_choice, greedy_keeps
from router.loop.block import PI_EQUALS_Q_TOL, decide
from router.policy import DeferralPolicy, judges_the_draft
from router.reduce import fast_argmax
from router.sampling import MIN_TEMPERATURE, process_logits
from router.targets import DENOM_FLOOR, safe_normalize, trusted_inputs, tv_distance
from router.view import BlockView

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: an output slot a request did not fill


@dataclass
class Sampling:
    """Each request's sampling settings (B,) as vLLM holds them: temperature 0 is greedy; top_k 0 (or
    vLLM's vocabulary-size default) keeps every token; top_p 1 keeps every token."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    generators: list  # a torch.Generator per request that has a seed, else None

    def greedy(self) -> torch.Tensor:
        return self.temperature < MIN_TEMPERATURE  # (B,) as router.sampling.process_logits reads it


def scale(logits: torch.Tensor, rows: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, scaled) distributions (N, V) from logits (N, V) whose request is rows (N,): process_logits with
    each request's temperature and top_p, after its top_k (vLLM's order). Rows sharing settings go together."""
    settings = torch.stack([sampling.temperature[rows], sampling.top_k[rows].float(), sampling.top_p[rows]], -1)
    distinct = settings.unique(dim=0)
    if len(distinct) == 1:  # every row alike (the common case): no (N, V) copies in and out of a mask
        raw, scaled = _scaled(logits.float(), distinct[0])
    else:
        raw = torch.empty_like(logits, dtype=torch.float32)
        scaled = torch.empty_like(raw)
        for setting in distinct:
            where = (settings == setting).all(-1)  # (N,)
            raw[where], scaled[where] = _scaled(logits[where].float(), setting)
    k = settings[:, 1]
    if bool(((k > 0) & (k < logits.shape[-1])).any()):  # top_k masked some logits: raw is the unmasked softmax
        raw = logits.float().softmax(-1)
    return raw, scaled


def _scaled(logits: torch.Tensor, setting: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, scaled) (n, V) of rows sharing one (temperature, top_k, top_p) setting."""
    t, k, p = float(setting[0]), int(setting[1]), float(setting[2])
    if 0 < k < logits.shape[-1]:
        kth = logits.topk(k, -1).values[..., -1:]  # (n, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return process_logits(logits, t, p)


def drafter_scaled(q_logits: torch.Tensor, rows: torch.Tensor, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_raw, q) (N, V): the drafter's temperature-1 distribution and the one drafts are drawn from, from its
    logits (N, V). Drafting and acceptance both call this on the same logits, so the q acceptance divides by is
    exactly the one drafts were sampled from."""
    return scale(q_logits, rows, sampling)


@dataclass
class Drafted:
    """One verification step of B requests, padded to K drafts (shapes in the comments)."""

    drafts: torch.Tensor  # (B, K) long, padding arbitrary
    n_drafts: torch.Tensor  # (B,) long, drafts each request made (0..K)
    q_logits: torch.Tensor  # (B, K, V) the drafter's logits at each draft
    target_logits: torch.Tensor  # (B, K, V) the verifier's logits at each draft (after vLLM's penalties)
    bonus_logits: torch.Tensor | None  # (B, V) the verifier's at the position after the last draft, when read
    bonus: torch.Tensor  # (B,) the token vLLM sampled from the verifier there
    sampling: Sampling
    # what drafts were drawn with, where it is not `sampling` (Model Runner V2 drafts from softmax(q / T): no top-k
    # or top-p); None: `sampling` (V1, where the plugin's own drafting hook applies the request's settings)
    draft_sampling: Sampling | None = None

    def drafted_with(self) -> Sampling:
        return self.sampling if self.draft_sampling is None else self.draft_sampling


def sampling_rows(s: Sampling, mask: torch.Tensor) -> Sampling:
    """The settings of the requests in `mask` (B,)."""
    picked = [g for g, m in zip(s.generators, mask.tolist()) if m]
    return Sampling(s.temperature[mask], s.top_k[mask], s.top_p[mask], picked)


def rows_of(step: Drafted, mask: torch.Tensor) -> Drafted:
    """The requests in `mask` (B,) as a step of their own (requests deciding with another policy)."""
    sampling = sampling_rows(step.sampling, mask)
    drafted = None if step.draft_sampling is None else sampling_rows(step.draft_sampling, mask)
    bonus_logits = None if step.bonus_logits is None else step.bonus_logits[mask]
    return Drafted(
        step.drafts[mask],
        step.n_drafts[mask],
        step.q_logits[mask],
        step.target_logits[mask],
        bonus_logits,
        step.bonus[mask],
        sampling,
        drafted,
    )


def padded_rows(start: torch.Tensor, n: torch.Tensor, k: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat index (B, K), inside (B, K)): where each request's j-th row lies in a flat (size, ...) tensor whose request
    rows start at start (B,) and number n (B,) <= K; rows past a request's n point at a valid row (padding, never kept)."""
    j = torch.arange(k, device=n.device)
    flat = (start[:, None] + j[None]).clamp(0, max(size - 1, 0))  # (B, K)
    return flat, j[None] < n[:, None]


@dataclass
class Accepted:
    """What the step emitted: tokens (B, K + 1) (PLACEHOLDER after each request's last) and its counts."""

    tokens: torch.Tensor
    n_accepted: torch.Tensor  # (B,) drafts kept
    deferred: torch.Tensor  # (B,) evaluated drafts where pi differs from q (a judge: where it did not keep)
    evaluated: torch.Tensor  # (B,) drafts the sampler evaluated: min(kept + 1, drafts)


def accept(policy: DeferralPolicy, alpha: float, step: Drafted, sparse: bool = True) -> Accepted:
    """Decide every request's drafts with `policy` at `alpha` and accept a prefix toward its pi (`sparse`: by
    the greedy verdicts where every request decodes greedily and the policy declares them)."""
    if sparse and bool(step.sampling.greedy().all()):
        done = accept_greedy(policy, alpha, step)
        if done is not None:
            return done
    with trusted_inputs():  # q and p come from softmax here: not re-checked (as router.decoding's loop)
        q, pi = targets(policy, alpha, step)
    n_accepted = _accepted(step, q, pi).minimum(step.n_drafts)  # (B,)
    tokens = _emit(step, q, pi, n_accepted)
    deferred, evaluated = _deferrals(policy, step, q, pi, n_accepted)
    return Accepted(tokens, n_accepted, deferred, evaluated)


def accept_greedy(policy: DeferralPolicy, alpha: float, step: Drafted) -> Accepted | None:
    """The sparse path of an all-greedy step: pi is one-hot on the token `greedy_choice` names, so a draft is kept
    where it is that token, the first rejection emits it, and a draft is deferred where it is not (TV(q, pi) = 1).
    None where the policy declares no greedy decision."""
    view = GreedyView(step.drafts, step.q_logits, step.target_logits)
    keep = greedy_keeps(policy, alpha, view)  # (B, K)
    if keep is None:
        return None
    choice = greedy_choice(keep, view)  # (B, K)
    b, k = step.drafts.shape
    n_accepted = (choice == step.drafts).long().cumprod(-1).sum(-1).minimum(step.n_drafts)  # (B,)
    rows = torch.arange(b, device=n_accepted.device)
    nxt = torch.where(n_accepted < step.n_drafts, choice[rows, n_accepted.clamp_max(k - 1)], step.bonus)  # (B,)
    evaluated, inside = _evaluated(step, n_accepted)
    deferred = ((choice != step.drafts) & inside).sum(-1)
    return Accepted(_tokens(step.drafts, n_accepted, nxt), n_accepted, deferred, evaluated)


def _evaluated(step: Drafted, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts the sampler evaluated (B,): min(kept + 1, drafts), and where they are (B, K)) for n (B,) kept."""
    evaluated = (n + 1).minimum(step.n_drafts)  # (B,)
    inside = torch.arange(step.drafts.shape[1], device=n.device)[None] < evaluated[:, None]  # (B, K)
    return evaluated, inside


def _tokens(drafts: torch.Tensor, n: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
    """(B, K + 1) int32: each request's n (B,) kept drafts (B, K), then its next token nxt (B,), PLACEHOLDER after."""
    b, k = drafts.shape
    tokens = torch.full((b, k + 1), PLACEHOLDER, dtype=torch.int32, device=n.device)
    keep = torch.arange(k, device=n.device)[None] < n[:, None]  # (B, K)
    tokens[:, :k] = torch.where(keep, drafts.int(), tokens[:, :k])
    tokens[torch.arange(b, device=n.device), n] = nxt.int()
    return tokens


def targets(policy: DeferralPolicy, alpha: float, step: Drafted) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, pi) (B, K, V): the scaled drafter distribution drafts were drawn from, and the policy's target."""
    b, k = step.drafts.shape
    rows = torch.arange(b, device=step.drafts.device)[:, None].expand(b, k).reshape(-1)  # (B*K,)
    v = step.q_logits.shape[-1]
    q_raw, q = (x.view(b, k, v) for x in drafter_scaled(step.q_logits.reshape(-1, v), rows, step.drafted_with()))
    p_raw, p = (x.view(b, k, v) for x in scale(step.target_logits.reshape(-1, v), rows, step.sampling))
    greedy = step.sampling.greedy()
    if bool((greedy == greedy[0]).all()):  # one mode for every row: no (B, K, V) copies through a mask
        return q, decide(policy, alpha, _view(policy, step, (q_raw, q), (p_raw, p), None), bool(greedy[0]))
    pi = torch.empty_like(q)
    for mode in (True, False):  # decide() takes greedy_mode policies' mode only where rows decode greedily
        part = greedy == mode
        pi[part] = decide(policy, alpha, _view(policy, step, (q_raw, q), (p_raw, p), part), mode)
    return q, pi


def _view(policy, step: Drafted, qs: tuple, ps: tuple, part: torch.Tensor | None) -> BlockView:
    """The view of the requests in `part` (a mask over B; None: all): distributions and logits at each draft, and the
    lookahead a judge reads, the verifier after each draft (the next draft's position, or the bonus position
    after the last). qs, ps: (raw, scaled) (B, K, V) each."""
    (q_raw, q), (p_raw, p) = qs, ps

    def rows(x: torch.Tensor) -> torch.Tensor:  # part None: every request, without copying (B, K, V) tensors
        return x if part is None else x[part]

    next_p_raw = next_p_logits = None
    if "lookahead" in policy.needs:
        next_p_logits = rows(_after_each(step.target_logits, step.bonus_logits.float(), step.n_drafts))
        next_p_raw = next_p_logits.softmax(-1)
    return BlockView(
        rows(q),
        rows(p),
        rows(q_raw),
        rows(p_raw),
        drafts=rows(step.drafts),
        next_p_raw=next_p_raw,
        q_logits=rows(step.q_logits).float(),
        p_logits=rows(step.target_logits).float(),
        next_p_logits=next_p_logits,
    )


def _after_each(logits: torch.Tensor, bonus: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(B, K, V): the verifier's logits after each draft: at the next draft, and at the bonus position after a
    request's last draft."""
    shifted = torch.cat([logits[:, 1:].float(), bonus[:, None]], 1)  # (B, K, V)
    last = (n - 1).clamp_min(0)
    shifted[torch.arange(len(n)), last] = bonus
    return shifted


def next_token(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(B,) the verifier's token at one position per request from its logits there (B, V): the argmax for a greedy
    request, else a draw from its scaled distribution (its own generator where it has one). Model Runner V2 samples
    the bonus token inside its acceptance, so the plugin draws it here."""
    rows = torch.arange(len(logits), device=logits.device)
    _, p = scale(logits, rows, sampling)  # (B, V)
    out = fast_argmax(p)  # (B,) greedy rows: p is the one-hot argmax
    for i in (~sampling.greedy()).nonzero().flatten().tolist():
        out[i] = torch.multinomial(p[i], 1, generator=sampling.generators[i]).squeeze(-1)
    return out


def _uniforms(step: Drafted) -> torch.Tensor:
    """(B, K) uniform draws, from a request's own generator where it has a seed (vLLM's per-request seeds)."""
    b, k = step.drafts.shape
    u = torch.rand((b, k), device=step.drafts.device)
    for i, gen in enumerate(step.sampling.generators):
        if gen is not None:
            u[i] = torch.rand(k, generator=gen, device=gen.device)
    return u


def _accepted(step: Drafted, q: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """Length of each request's accepted prefix (B,): u < min(1, pi(x) / q(x)), as router.sampling.accept_drafts."""
    x = step.drafts[..., None]
    ratio = (pi.gather(-1, x) / q.gather(-1, x).clamp_min(DENOM_FLOOR)).squeeze(-1).clamp_max(1)  # (B, K)
    return (_uniforms(step) < ratio).long().cumprod(-1).sum(-1)


def _emit(step: Drafted, q: torch.Tensor, pi: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(B, K + 1) tokens: the kept drafts, then the residual's token at the first rejection (normalize(max(0,
    pi - q)), as router.sampling.next_after) or vLLM's bonus token; PLACEHOLDER after."""
    b, k = step.drafts.shape
    rows = torch.arange(b, device=n.device)
    at = n.clamp_max(k - 1)
    residual = safe_normalize((pi[rows, at] - q[rows, at]).clamp_min(0), pi[rows, at])  # (B, V)
    rejected = n < step.n_drafts
    nxt = step.bonus.clone()
    greedy = step.sampling.greedy()
    for i in rejected.nonzero().flatten().tolist():
        gen = step.sampling.generators[i]
        if bool(greedy[i]) or bool(residual[i].max() >= 1):
            nxt[i] = fast_argmax(residual[i])
        else:
            nxt[i] = torch.multinomial(residual[i], 1, generator=gen).squeeze(-1)
    return _tokens(step.drafts, n, nxt)


def _deferrals(policy, step: Drafted, q, pi, n) -> tuple[torch.Tensor, torch.Tensor]:
    """Deferred and evaluated drafts per request, counted as router.loop.block.emit counts them."""
    pi_of_draft = pi.gather(-1, step.drafts[..., None]).squeeze(-1)  # (B, K)
    if judges_the_draft(policy):
        deferred = pi_of_draft < 1  # (B, K) pi is the one-hot draft where kept
    else:
        greedy = step.sampling.greedy()  # (B,)
        # where q is the one-hot draft (greedy rows), TV(q, pi) = 1 - pi(draft): a gather instead of a pass over V
        tv = 1 - pi_of_draft  # (B, K)
        if not bool(greedy.all()):
            tv = torch.where(greedy[:, None], tv, tv_distance(q, pi))
        deferred = tv > PI_EQUALS_Q_TOL
    evaluated, inside = _evaluated(step, n)
    return (deferred & inside).sum(-1), evaluated
