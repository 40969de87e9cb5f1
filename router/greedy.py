"""Greedy (temperature 0) decisions from a few numbers per draft: the sparse path of a deferral policy.

At temperature 0 the scaled q and p are one-hot, on the draft d (the drafter's argmax) and on the verifier's
argmax a, so a policy's pi is one-hot too: on d where the policy keeps the draft, on a where it does not
(cascade: pi = q or p; token form: d in the keep set or not; a judge: its verdict on d). Acceptance then needs
only that verdict per draft, and the verdict reads a handful of statistics of the raw (temperature-1)
distributions at each draft (max q, max p, q and p at d, KL, entropy), not pi over the vocabulary.

A policy may declare `greedy_keep(view: GreedyView, alpha) -> (...) bool` (rules: `Rule.greedy`; learned routers:
`LearnedRouter.greedy_keep`). It must equal "pi's mode is the draft" of its own `decide` on the same position
(tests/router/test_greedy.py checks every declared one against decide). `greedy_keeps` returns None for a
policy without one (a custom policy, a judge, one mixing q and p greedily): the caller takes the full path.
GreedyView computes what is asked from the logits, once: a logsumexp and a max per model instead of softmaxes,
one-hots and the (..., V) passes of pi, so a verdict costs a few passes over the logits.
"""

from __future__ import annotations

import functools
import torch

from router.features import LOG_EPS, position_stats, scratch
from router.reduce import fast_max


class GreedyView:
    """Per-draft statistics at temperature 0, computed on first read from the logits at each draft.

    drafts (...) long: the drafted tokens (each the drafter's argmax); q_logits, p_logits (..., V): the drafter's
    and the verifier's logits there (the raw distributions are their softmax)."""

    def __init__(self, drafts: torch.Tensor, q_logits: torch.Tensor, p_logits: torch.Tensor):
        self.drafts = drafts.long()
        self.q_logits, self.p_logits = q_logits.float(), p_logits.float()

    @functools.cached_property
    def _q_top(self) -> tuple[torch.Tensor, torch.Tensor]:
        return fast_max(self.q_logits)  # (max logit, argmax) (...) each

    @functools.cached_property
    def _p_top(self) -> tuple[torch.Tensor, torch.Tensor]:
        return fast_max(self.p_logits)

    @functools.cached_property
    def q_lse(self) -> torch.Tensor:
        return _logsumexp(self.q_logits, self._q_top[0])  # (...)

    @functools.cached_property
    def p_lse(self) -> torch.Tensor:
        return _logsumexp(self.p_logits, self._p_top[0])  # (...)

    @functools.cached_property
    def verifier_argmax(self) -> torch.Tensor:
        """a (...): the token p (scaled, one-hot) puts its mass on."""
        return self._p_top[1]

    @property
    def differs(self) -> torch.Tensor:
        """(...) bool: d != a, i.e. TV(p, q) of the scaled one-hots is 1 (else 0)."""
        return self.drafts != self.verifier_argmax

    @functools.cached_property
    def q_max(self) -> torch.Tensor:
        return (self._q_top[0] - self.q_lse).exp()  # (...) max q_raw

    @functools.cached_property
    def p_max(self) -> torch.Tensor:
        return (self._p_top[0] - self.p_lse).exp()  # (...) max p_raw

    @functools.cached_property
    def q_at_draft(self) -> torch.Tensor:
        return (self.q_logits.gather(-1, self.drafts[..., None])[..., 0] - self.q_lse).exp()  # (...) q_raw(d)

    @functools.cached_property
    def p_at_draft(self) -> torch.Tensor:
        return (self.p_logits.gather(-1, self.drafts[..., None])[..., 0] - self.p_lse).exp()  # (...) p_raw(d)

    @functools.cached_property
    def _information(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(KL(p_raw || q_raw), H(p_raw)) (...) in nats, logs floored at EPS (as router.targets.kl_pq and
        p_certainty floor probabilities): log-probabilities are the logits less their logsumexp (no log over
        the vocabulary), in three reused buffers (router.features.scratch)."""
        log_q, log_p, p_raw = scratch(self.p_logits, 3)
        torch.sub(self.p_logits, self.p_lse[..., None], out=log_p)
        torch.exp(log_p, out=p_raw)
        log_p.clamp_min_(LOG_EPS)
        entropy = -torch.linalg.vecdot(p_raw, log_p)
        torch.sub(self.q_logits, self.q_lse[..., None], out=log_q).clamp_min_(LOG_EPS)
        kl = torch.linalg.vecdot(p_raw, torch.sub(log_p, log_q, out=log_q))
        return kl, entropy

    @property
    def kl_pq(self) -> torch.Tensor:
        """KL(p_raw || q_raw) (...) in nats."""
        return self._information[0]

    @property
    def p_entropy(self) -> torch.Tensor:
        """H(p_raw) (...) in nats."""
        return self._information[1]

    @functools.cached_property
    def q_raw(self) -> torch.Tensor:
        return self.q_logits.softmax(-1)  # (..., V)

    @functools.cached_property
    def p_raw(self) -> torch.Tensor:
        return self.p_logits.softmax(-1)  # (..., V)

    @functools.cached_property
    def position_stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features (..., F), q's argmax, p's argmax): router.features.position_stats, the routers' inputs."""
        return position_stats(self.q_raw, self.p_raw, self.q_logits, self.p_logits)


def _logsumexp(logits: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """log sum exp over the last axis (...) of logits (..., V) whose max is top (...): the max is known already,
    and the exponentials go to a reused buffer (torch.logsumexp takes the max again and allocates two)."""
    work = scratch(logits, 1)[0]
    return top + torch.sub(logits, top[..., None], out=work).exp_().sum(-1).log()


def greedy_keeps(policy, alpha: float, view: GreedyView) -> torch.Tensor | None:
    """(...) bool: where the policy keeps each draft at temperature 0, or None where it declares no greedy path
    (the caller then decides with the full pi)."""
    if getattr(policy, "greedy_mode", False):  # pi mixes q and p: its greedy mode is not d or a
        return None
    keep = getattr(policy, "greedy_keep", None)
    return None if keep is None else keep(view, alpha)


def greedy_choice(keep: torch.Tensor, view: GreedyView) -> torch.Tensor:
    """(...) long: the token pi puts its mass on, the draft where kept, else the verifier's argmax."""
    return torch.where(keep, view.drafts, view.verifier_argmax)
