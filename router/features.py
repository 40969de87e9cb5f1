"""Per-position features of the drafter (q) and verifier (p) distributions.

One function, `token_features` (and `candidate_features` for token-form routers), is used both
when recording (data_gen) and when decoding (a learned router inside `router.decoding.generate`),
so a router sees the same features offline and online. Features use the raw (temperature-1)
distributions only: they do not change with the decoding temperature, and both models'
distributions exist at decision time because the verifier scores the whole block in parallel.
"""

from __future__ import annotations

import threading

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


_SCRATCH = threading.local()


def _scratch(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two reusable V-sized buffers shaped like `like`, per thread. A fresh 3.6 MB tensor costs
    more in page faults than the pass that fills it: reusing them halves the features' cost."""
    key = (tuple(like.shape), like.dtype, like.device, torch.is_inference_mode_enabled())
    cached = getattr(_SCRATCH, "bufs", None)
    if cached is None or cached[0] != key:
        cached = (key, torch.empty_like(like), torch.empty_like(like))
        _SCRATCH.bufs = cached
    return cached[1], cached[2]


def _top2(x: torch.Tensor, scratch: torch.Tensor):
    """(max, argmax, second largest) over the last axis, (...) each; cheaper than topk(2)."""
    top, idx = x.max(-1, keepdim=True)
    second = scratch.copy_(x).scatter_(-1, idx, -1.0).amax(-1)
    return top.squeeze(-1), idx.squeeze(-1), second


@torch.no_grad()
def token_features(q_raw: torch.Tensor, p_raw: torch.Tensor) -> torch.Tensor:
    """Features (..., F) from raw drafter/verifier probabilities (..., V); F = len(FEATURE_NAMES)."""
    q_raw, p_raw = q_raw.float(), p_raw.float()
    # This runs once per decoding block on (B, gamma, V): each V-sized pass counts, so it makes
    # eleven (two max, two second-max, two logs, four products, one min) into two reused buffers.
    logs, work = _scratch(q_raw)
    q_max, q_arg, q_second = _top2(q_raw, work)
    p_max, p_arg, p_second = _top2(p_raw, work)
    torch.clamp_min(q_raw, EPS, out=logs).log_()  # log q
    q_entropy = -torch.mul(q_raw, logs, out=work).sum(-1)
    p_cross_q = torch.mul(p_raw, logs, out=work).sum(-1)  # sum p log q
    torch.clamp_min(p_raw, EPS, out=logs).log_()  # log p
    p_entropy = -torch.mul(p_raw, logs, out=work).sum(-1)
    overlap = torch.minimum(p_raw, q_raw, out=work).sum(-1)  # sum min(p, q) = 1 - TV
    feats = {
        "q_max": q_max,
        "p_max": p_max,
        "q_entropy": q_entropy,
        "p_entropy": p_entropy,
        "tv": (1.0 - overlap).clamp_min(0),
        "kl_pq": -p_entropy - p_cross_q,
        "q_margin": q_max - q_second,
        "p_margin": p_max - p_second,
        "q_at_p_argmax": q_raw.gather(-1, p_arg[..., None]).squeeze(-1),
        "p_at_q_argmax": p_raw.gather(-1, q_arg[..., None]).squeeze(-1),
        "argmax_agree": (q_arg == p_arg).float(),
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
