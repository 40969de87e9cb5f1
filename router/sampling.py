"""Generic speculative sampling towards a target `pi` (docs/method.md, The decoding loop).

Draft tokens are accepted with probability min(1, pi/q); at the first rejection the replacement
comes from normalize(max(0, pi - q)); if every draft passes, a bonus token comes from
pi[gamma]. Every emitted token is then distributed exactly as `pi` at its position.
Also: temperature / top-p processing of logits into the (raw, scaled) pair the rules need.
"""

from __future__ import annotations

import torch

from router.reduce import fast_argmax, fast_max
from router.targets import DENOM_FLOOR, safe_normalize


def speculative_block(
    draft_tokens: torch.Tensor, q: torch.Tensor, pi: torch.Tensor, generator: torch.Generator | None
) -> tuple:
    """One block: (n_accepted in 0..gamma, next token) for draft_tokens (gamma,), q and pi (gamma+1, V),
    as ints; or, with a leading batch dimension, draft_tokens (B, gamma), q and pi (B, gamma+1, V) ->
    n_accepted (B,), next (B,) as tensors. `next` is the resampled token at the first rejection, or the
    bonus token from pi[gamma] when all drafts pass. The decoding loop runs the same two steps
    (`accept_drafts`, `next_after`) in router/loop/block.py, with pi at the bonus position formed
    only when some row needs it."""
    one = draft_tokens.dim() == 1
    drafts, q_b, pi_b = (draft_tokens[None], q[None], pi[None]) if one else (draft_tokens, q, pi)
    gamma = drafts.shape[-1]
    if q_b.shape != pi_b.shape or q_b.dim() != 3 or q_b.shape[:2] != (drafts.shape[0], gamma + 1):
        raise ValueError(
            f"speculative_block needs draft_tokens (gamma,), q and pi (gamma+1, V), or (B, gamma) and "
            f"(B, gamma+1, V); got draft_tokens {tuple(draft_tokens.shape)}, q {tuple(q.shape)}, pi {tuple(pi.shape)}"
        )
    n_accepted = accept_drafts(drafts, q_b[:, :gamma], pi_b[:, :gamma], generator)  # (B,)
    rows = torch.arange(drafts.shape[0], device=q.device)
    next_token = next_after(q_b[rows, n_accepted], pi_b[rows, n_accepted], n_accepted < gamma, generator)
    return (int(n_accepted[0]), int(next_token[0])) if one else (n_accepted, next_token)


def accept_drafts(
    draft_tokens: torch.Tensor, q: torch.Tensor, pi: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Length of the accepted prefix (B,) for drafts (B, gamma) with q, pi (B, gamma, V)."""
    batch, gamma = draft_tokens.shape
    q_x = q.gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, gamma)
    pi_x = pi.gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, gamma)
    accept_prob = (pi_x / q_x.clamp_min(DENOM_FLOOR)).clamp_max(1)
    u = torch.rand((batch, gamma), generator=generator, device=q.device)
    accepted = u < accept_prob  # u in [0, 1): probability 1 always passes, 0 never does
    return accepted.long().cumprod(-1).sum(-1)


def next_after(
    q_n: torch.Tensor, pi_n: torch.Tensor, rejected: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """The token that ends a block (B,): from normalize(max(0, pi - q)) where a draft was
    rejected, else the bonus token from pi. q_n, pi_n (B, V) at that position; rejected (B,)."""
    residual = safe_normalize((pi_n - q_n).clamp_min(0), pi_n)
    return sample(torch.where(rejected[:, None], residual, pi_n), generator)


def sample(dist: torch.Tensor, generator: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
    """One token per row of dist (B, V); a one-hot row returns its argmax without drawing. greedy: every
    row is known to be one-hot (temperature 0), so the argmax is taken without checking (no host sync)."""
    if greedy:
        return fast_argmax(dist)
    top, arg = fast_max(dist)
    if bool((top >= 1.0).all()):
        return arg
    drawn = torch.multinomial(dist.float(), 1, generator=generator).squeeze(-1)
    return torch.where(top >= 1.0, arg, drawn)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches top_p, renormalised; probs (..., V)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    sorted_p = torch.where(mass_before < top_p, sorted_p, torch.zeros_like(sorted_p))  # top-1 always kept
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return filtered / filtered.sum(-1, keepdim=True)


MIN_TEMPERATURE = 1e-4  # below it the scaled distribution is the argmax's one-hot: what sampling would approach


def process_logits(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, scaled) probabilities from logits (..., V).

    raw is the temperature-1 softmax used for deferral decisions; scaled applies temperature
    (0, or below MIN_TEMPERATURE = one-hot at the argmax) and then top-p, and is what drafts, targets and acceptance use.
    """
    logits = logits.float()
    raw = logits.softmax(-1)
    if temperature < MIN_TEMPERATURE:  # greedy, or too small to scale by (1e-300 overflows to inf - inf = NaN)
        scaled = torch.zeros_like(raw).scatter_(-1, fast_argmax(logits)[..., None], 1.0)
        return raw, scaled
    scaled = raw if temperature == 1.0 else (logits / temperature).softmax(-1)
    return raw, top_p_filter(scaled, top_p)
