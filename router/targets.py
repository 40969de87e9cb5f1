"""The plug-in rules' pure functions: each rule's target `pi = T(q, p)` in torch and its offline
score in numpy.

A target takes the scaled distributions q, p (..., V), the rule's alpha and the raw (temperature 1)
ones its decision reads, and returns pi (..., V); an offline score maps recorded per-position scalars
(`cols`) or candidate-token arrays (`cand`) to the value the offline curves sweep alpha over
(router/offline/tradeoff.py). router/rules.py registers them by name; formulas: docs/method.md.
`validate_inputs` is the check of q, p every target call goes through (skipped for contents inside
`trusted_inputs`, where the loop formed them with softmax itself).
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
import torch

DENOM_FLOOR = 1e-10  # docs/method.md: acceptance denominators are floored here
TV_FLOOR = 1e-12  # positions where p == q cost nothing to defer; their ratio scores become +inf/-inf
SUM_TOLERANCE = 1e-3  # bf16 softmax rows can drift ~1e-3 from 1 after casting


def _check_dist(name: str, x: torch.Tensor) -> None:
    """Raise a ValueError that names the problem when `x` is not a stack of distributions."""
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor of probabilities, got {type(x).__name__}"
            f"{'' if not torch.is_tensor(x) else ' of ' + str(x.dtype)}"
        )
    if x.dim() == 0 or x.shape[-1] < 2:
        raise ValueError(f"{name} must have shape (..., V) with V >= 2, got {tuple(x.shape)}")
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN: check the logits that produced it")
    if (x < 0).any():
        raise ValueError(f"{name} has negative entries: pass probabilities (softmax), not logits")
    sums = x.sum(-1, dtype=torch.float64)
    worst = (sums - 1).abs().max().item()
    if worst > SUM_TOLERANCE:
        raise ValueError(
            f"{name} rows must sum to 1 (worst row is off by {worst:.3g}): "
            f"pass normalised probabilities, e.g. logits.softmax(-1)"
        )


_TRUSTED = contextvars.ContextVar("specroute_trusted_inputs", default=False)


@contextlib.contextmanager
def trusted_inputs():
    """Within this block, rules skip the content checks (NaN, sign, row sums) of their inputs.

    The decoding loop forms q and p with softmax itself; re-checking four V-sized tensors every
    block cost ~8% of a verifier forward on the embedded pair. Shapes are still checked.
    """
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def validate_inputs(q, p, q_raw, p_raw) -> tuple[torch.Tensor, torch.Tensor]:
    """Check shapes and contents of a rule's inputs; return (q_raw, p_raw) with defaults filled."""
    q_raw = q if q_raw is None else q_raw
    p_raw = p if p_raw is None else p_raw
    if not _TRUSTED.get():
        for name, x in (("q", q), ("p", p), ("q_raw", q_raw), ("p_raw", p_raw)):
            _check_dist(name, x)
    shapes = {tuple(x.shape) for x in (q, p, q_raw, p_raw)}
    if len(shapes) != 1:
        raise ValueError(
            f"q, p, q_raw, p_raw must share one shape (..., V); got "
            f"q {tuple(q.shape)}, p {tuple(p.shape)}, q_raw {tuple(q_raw.shape)}, "
            f"p_raw {tuple(p_raw.shape)}"
        )
    return q_raw, p_raw


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = sum_v max(0, p(v) - q(v)); shape (...)."""
    return (p - q).clamp_min(0).sum(-1)


def safe_normalize(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Normalise rows of a non-negative tensor; an all-zero row becomes the fallback row.

    An all-zero residual only happens where it carries zero probability mass, so the fallback
    never changes the result, it only keeps NaN out.
    """
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / total.clamp_min(1e-30), fallback)


# ---- cascade form: one decision r per position, pi = (1 - r) q + r p -----------------------


def cascade_mix(q: torch.Tensor, p: torch.Tensor, defer: torch.Tensor) -> torch.Tensor:
    """pi = (1 - r) q + r p for a boolean decision r of shape (...)."""
    return torch.where(defer.unsqueeze(-1), p, q)


def keep_drafts(p: torch.Tensor, drafts: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """pi (..., V) of a policy that decides drafted tokens (...): one-hot on the draft where it keeps
    it, else p (verified losslessly); the sampler's law is in docs/method.md (judges)."""
    pi = p * (~keep)[..., None]  # rows that keep the draft: zero, then one-hot on it
    return pi.scatter_add_(-1, drafts.long()[..., None], keep[..., None].to(p.dtype))


def chow_defers(q_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """Chow's rule from max q_raw (...): defer iff max q_raw < 1 - alpha (needs only the drafter)."""
    return q_max < 1 - alpha


def chow_defer(q_raw: torch.Tensor, alpha: float) -> torch.Tensor:
    """Chow's rule on q_raw (..., V)."""
    return chow_defers(q_raw.amax(-1), alpha)


def diff_defers(q_max: torch.Tensor, p_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return q_max < p_max - alpha


def opt_defers(q_max: torch.Tensor, p_max: torch.Tensor, tv: torch.Tensor, alpha: float) -> torch.Tensor:
    # alpha may be +-inf: where TV = 0 the two choices coincide, so the product is taken as 0
    margin = torch.where(tv > 0, alpha * tv, torch.zeros_like(tv))
    return q_max < p_max - margin


def chow_target(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, chow_defer(q_raw, alpha))


def diff_target(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, diff_defers(q_raw.amax(-1), p_raw.amax(-1), alpha))


def opt_target(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, opt_defers(q_raw.amax(-1), p_raw.amax(-1), tv_distance(p, q), alpha))


# ---- token-specific form: pi(v) = q(v) 1[v in A] + p(v) * sum_{u not in A} q(u) ------------


def token_mix(q: torch.Tensor, p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Token-specific target for a boolean keep set A (..., V)."""
    kept_q = torch.where(keep, q, torch.zeros_like(q))
    eta = (q - kept_q).sum(-1, keepdim=True)  # drafter mass outside A goes to the verifier
    return kept_q + p * eta


# each token rule's keep set from the raw q(v), p(v) of tokens v (..., V or ...) and max p_raw (..., 1 or ...)
def token_v1_keeps(q_v: torch.Tensor, p_v: torch.Tensor, p_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return q_v >= p_max - alpha


def token_v2_keeps(q_v: torch.Tensor, p_v: torch.Tensor, p_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return p_v >= p_max - alpha


def token_v3_keeps(q_v: torch.Tensor, p_v: torch.Tensor, p_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return p_v >= (1 - alpha) * p_max


def token_v1_target(q, p, alpha, q_raw, p_raw):
    return token_mix(q, p, token_v1_keeps(q_raw, p_raw, p_raw.amax(-1, keepdim=True), alpha))


def token_v2_target(q, p, alpha, q_raw, p_raw):
    return token_mix(q, p, token_v2_keeps(q_raw, p_raw, p_raw.amax(-1, keepdim=True), alpha))


def token_v3_target(q, p, alpha, q_raw, p_raw):
    return token_mix(q, p, token_v3_keeps(q_raw, p_raw, p_raw.amax(-1, keepdim=True), alpha))


# ---- training-free gates from the literature (cascade form) ------------------------------------

KL_GATE_CONFIDENT = 0.9  # where max p exceeds this, the KL gate verifies as lossless (its confidence mask)


def kl_pq(q_raw: torch.Tensor, p_raw: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats, (...)."""
    p32, q32 = p_raw.float(), q_raw.float()
    return (p32 * (p32.clamp_min(1e-12).log() - q32.clamp_min(1e-12).log())).sum(-1)


def kl_gate_defers(kl: torch.Tensor, p_max: torch.Tensor, alpha: float) -> torch.Tensor:
    # Sun et al. 2026 (arXiv 2601.04766): a learned linear judge reduces to a KL test; keep the draft
    # where KL(p || q) <= alpha, unless the verifier is confident (its top-1 > 0.9): verify there
    return (kl > alpha) | (p_max > KL_GATE_CONFIDENT)


def kl_gate_target(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, kl_gate_defers(kl_pq(q_raw, p_raw), p_raw.amax(-1), alpha))


def p_certainty(p_raw: torch.Tensor) -> torch.Tensor:
    """exp(-H(p)) in (0, 1]: 1 when the verifier is certain, small when many tokens are plausible."""
    p32 = p_raw.float()
    return torch.exp((p32 * p32.clamp_min(1e-12).log()).sum(-1))


def entropy_gate_defers(certainty: torch.Tensor, alpha: float) -> torch.Tensor:
    # FLy's entropy-level gate (Li et al. 2025, arXiv 2511.22972): where the verifier is nearly
    # deterministic (entropy below -ln alpha) verify exactly, elsewhere keep the draft. FLy's
    # deferred window (a later check of the verifier's self-correction) is not part of this rule.
    return certainty > alpha


def entropy_gate_target(q, p, alpha, q_raw, p_raw):
    return cascade_mix(q, p, entropy_gate_defers(p_certainty(p_raw), alpha))


# ---- the same decisions at temperature 0, from a router.greedy.GreedyView (keep the draft: (...) bool) -------


def chow_greedy(g, alpha):
    return ~chow_defers(g.q_max, alpha)


def diff_greedy(g, alpha):
    return ~diff_defers(g.q_max, g.p_max, alpha)


def opt_greedy(g, alpha):
    return ~opt_defers(g.q_max, g.p_max, g.differs.float(), alpha)  # TV of the one-hot scaled q, p


def token_v1_greedy(g, alpha):
    return token_v1_keeps(g.q_at_draft, None, g.p_max, alpha)


def token_v2_greedy(g, alpha):
    return token_v2_keeps(None, g.p_at_draft, g.p_max, alpha)


def token_v3_greedy(g, alpha):
    return token_v3_keeps(None, g.p_at_draft, g.p_max, alpha)


def kl_gate_greedy(g, alpha):
    return ~kl_gate_defers(g.kl_pq, g.p_max, alpha)


def entropy_gate_greedy(g, alpha):
    return ~entropy_gate_defers(torch.exp(-g.p_entropy), alpha)


def lossy_greedy(g, alpha):
    # q one-hot on d: d is accepted with min(1, p(d) / (1 - alpha)), 1 at alpha = 1 (pi = q), else 1[d = a]
    return torch.full_like(g.drafts, alpha >= 1, dtype=torch.bool)


def lossless_greedy(g, alpha):
    return torch.zeros_like(g.drafts, dtype=torch.bool)


def drafter_greedy(g, alpha):
    return torch.ones_like(g.drafts, dtype=torch.bool)


# ---- lossy speculative decoding and the two fixed targets ------------------------------------


def lossy_target(q, p, alpha, q_raw, p_raw):
    # in float32 at least: the 1e-10 floor of the acceptance denominator underflows in float16 (NaN)
    q32, p32 = q.float(), p.float()
    denom = (1 - alpha) * q32
    # a zero denominator accepts: at alpha = 1 every draft is kept (pi = q exactly, even where p = 0);
    # below it a zero q(v) is never drafted, so its acceptance does not matter
    accept = torch.where(denom > 0, p32 / denom.clamp_min(DENOM_FLOOR), torch.ones_like(p32)).clamp_max(1)
    kept = q32 * accept
    rejected_mass = (1 - kept.sum(-1, keepdim=True)).clamp_min(0)
    return (kept + rejected_mass * safe_normalize((p32 - q32).clamp_min(0), p32)).to(q.dtype)


def mixture_target(q, p, alpha, q_raw, p_raw):
    # DIVERSE's static ensemble verification (arXiv 2604.07622; transformers' assistant_ensemble_weight):
    # verify against pi = w p + (1 - w) q with w = alpha, so a draft d is kept with probability
    # 1 - w + w p(d) / q(d) (capped at 1), and a rejection resamples from normalize(max(0, p - q))
    return alpha * p + (1 - alpha) * q


def lossless_target(q, p, alpha, q_raw, p_raw):
    return p.clone()


def drafter_target(q, p, alpha, q_raw, p_raw):
    return q.clone()


# ---- offline scores (numpy, from recorded scalars and candidates; see router/offline/tradeoff.py) --------


def ratio_score(numerator: np.ndarray, tv: np.ndarray) -> np.ndarray:
    """numerator / TV, with TV = 0 mapped to +-inf by the numerator's sign (defer for free or never)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 where both are 0: never defer, below
        out = np.where(tv > TV_FLOOR, numerator / np.maximum(tv, TV_FLOOR), np.sign(numerator) * np.inf)
    return np.nan_to_num(out, nan=-np.inf)


def chow_score(cols, cand):
    return 1.0 - np.asarray(cols["q_max"])


def diff_score(cols, cand):
    return np.asarray(cols["p_max"]) - np.asarray(cols["q_max"])


def opt_score(cols, cand):
    return ratio_score(np.asarray(cols["p_max"]) - np.asarray(cols["q_max"]), np.asarray(cols["tv"]))


def kl_gate_score(cols, cand):
    # confident positions always defer: above every alpha the rule accepts (its range ends at 1e6)
    kl = np.asarray(cols["kl"], np.float64)
    return np.where(np.asarray(cols["p_max"]) > KL_GATE_CONFIDENT, 2e6, kl)


def entropy_gate_score(cols, cand):
    return np.exp(-np.asarray(cols["p_entropy"], np.float64))


def token_v1_score(cols, cand):
    return cand.p_max[:, None] - cand.q


def token_v2_score(cols, cand):
    return cand.p_max[:, None] - cand.p


def token_v3_score(cols, cand):
    return 1.0 - cand.p / np.maximum(cand.p_max[:, None], TV_FLOOR)
