"""Per-position features of the drafter (q) and verifier (p) distributions.

One function, `token_features` (and `candidate_features` for token-form routers), is used both when recording (data_gen) and when decoding (a
learned router inside `router.decoding.generate`), so a router sees the same features offline and
online. Features use the raw (temperature-1) distributions only: they do not change with the
decoding temperature, and both models' distributions exist at decision time because the verifier
scores the whole block in parallel.
"""

from __future__ import annotations

import torch

FEATURE_NAMES: tuple[str, ...] = (
    "q_max", "p_max",                  # confidence of each model
    "q_entropy", "p_entropy",          # nats
    "tv",                              # TV(p, q)
    "kl_pq",                           # KL(p || q), nats
    "q_margin", "p_margin",            # top-1 minus top-2 probability
    "q_at_p_argmax", "p_at_q_argmax",  # each model's probability of the other's favourite
    "argmax_agree",                    # 1 if the two argmaxes coincide
    "log_q_max", "log_p_max",
    "p_max_minus_q_max",
)
EPS = 1e-12
# token-form routers score each drafter candidate v with the position's features plus these
CANDIDATE_FEATURE_NAMES: tuple[str, ...] = ("cand_q", "cand_p", "cand_log_ratio", "cand_is_p_argmax",
                                            "cand_is_q_argmax")


def entropy(x: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last axis, (...)."""
    return -(x * x.clamp_min(EPS).log()).sum(-1)


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats over the last axis, (...)."""
    return (p * (p.clamp_min(EPS).log() - q.clamp_min(EPS).log())).sum(-1)


def token_features(q_raw: torch.Tensor, p_raw: torch.Tensor) -> torch.Tensor:
    """Features (..., F) from raw drafter/verifier probabilities (..., V); F = len(FEATURE_NAMES)."""
    q_raw, p_raw = q_raw.float(), p_raw.float()
    q_top, q_idx = q_raw.topk(2, dim=-1)  # (..., 2)
    p_top, p_idx = p_raw.topk(2, dim=-1)
    q_max, p_max = q_top[..., 0], p_top[..., 0]
    log_q, log_p = q_raw.clamp_min(EPS).log(), p_raw.clamp_min(EPS).log()  # once each: V-sized passes dominate
    feats = {
        "q_max": q_max,
        "p_max": p_max,
        "q_entropy": -(q_raw * log_q).sum(-1),
        "p_entropy": -(p_raw * log_p).sum(-1),
        "tv": (p_raw - q_raw).clamp_min(0).sum(-1),
        "kl_pq": (p_raw * (log_p - log_q)).sum(-1),
        "q_margin": q_top[..., 0] - q_top[..., 1],
        "p_margin": p_top[..., 0] - p_top[..., 1],
        "q_at_p_argmax": q_raw.gather(-1, p_idx[..., :1]).squeeze(-1),
        "p_at_q_argmax": p_raw.gather(-1, q_idx[..., :1]).squeeze(-1),
        "argmax_agree": (q_idx[..., 0] == p_idx[..., 0]).float(),
        "log_q_max": q_max.clamp_min(EPS).log(),
        "log_p_max": p_max.clamp_min(EPS).log(),
        "p_max_minus_q_max": p_max - q_max,
    }
    return torch.stack([feats[name] for name in FEATURE_NAMES], -1)


def candidate_features(cand_q: torch.Tensor, cand_p: torch.Tensor, is_p_argmax: torch.Tensor,
                       is_q_argmax: torch.Tensor) -> torch.Tensor:
    """Per-candidate features (..., K, 5) from each candidate's raw q and p (..., K) and whether it is
    either model's argmax (..., K); the same call serves records (top-k columns) and decoding."""
    ratio = cand_q.clamp_min(EPS).log() - cand_p.clamp_min(EPS).log()
    return torch.stack([cand_q, cand_p, ratio, is_p_argmax.float(), is_q_argmax.float()], -1)
