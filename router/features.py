"""Per-position features of the drafter (q) and verifier (p) distributions.

One function, `token_features` (and `candidate_features` for token-form routers), is used both
when recording (data_gen) and when decoding (a learned router inside `router.decoding.generate`),
so a router sees the same features offline and online. Features use the raw (temperature-1)
distributions only: they do not change with the decoding temperature, and both models'
distributions exist at decision time because the verifier scores the whole block in parallel.
"""

from __future__ import annotations

import math
import threading

import torch

from router.reduce import fast_argmax, fast_max, top2

FEATURE_NAMES: tuple[str, ...] = (
    "q_max",
    "p_max",  # confidence of each model
    "q_entropy",
    "p_entropy",  # nats
    "tv",  # TV(p, q)
    "kl_pq",  # KL(p || q), nats
    "q_margin",
    "p_margin",  # top-1 minus top-2 probability
    "q_at_p_argmax",
    "p_at_q_argmax",  # each model's probability of the other's favourite
    "argmax_agree",  # 1 if the two argmaxes coincide
    "log_q_max",
    "log_p_max",
    "p_max_minus_q_max",
)
EPS = 1e-12
LOG_EPS = math.log(EPS)
# token-form routers score each drafter candidate v with the position's features plus these
CANDIDATE_FEATURE_NAMES: tuple[str, ...] = (
    "cand_q",
    "cand_p",
    "cand_log_ratio",
    "cand_is_p_argmax",
    "cand_is_q_argmax",
)


_SCRATCH = threading.local()


def scratch(like: torch.Tensor, n: int = 2) -> list[torch.Tensor]:
    """n reusable buffers shaped like `like` (dtype, device), per thread, kept for the last shape and made only as
    many as asked. A fresh 3.6 MB tensor costs more in page faults than the pass that fills it: reusing them halves
    the features' cost (and KL's in router/greedy.py). Callers use them within one call and keep only reductions."""
    if torch.compiler.is_exporting():  # a traced graph (ONNX export) gets its own tensors, never cached ones
        return [torch.empty_like(like) for _ in range(n)]
    key = (tuple(like.shape), like.dtype, like.device, torch.is_inference_mode_enabled())
    cached = getattr(_SCRATCH, "bufs", None)
    if cached is None or cached[0] != key:
        cached = (key, [])
        _SCRATCH.bufs = cached
    bufs = cached[1]
    while len(bufs) < n:
        bufs.append(torch.empty_like(like))
    return bufs[:n]


def _check_logits(probs: torch.Tensor, logits: torch.Tensor | None, name: str) -> None:
    if logits is not None and logits.shape != probs.shape:
        raise ValueError(
            f"{name} has shape {tuple(logits.shape)} but its probabilities have {tuple(probs.shape)}: "
            f"pass the logits the raw (temperature-1) probabilities are the softmax of"
        )


def log_probs_into(
    out: torch.Tensor, probs: torch.Tensor, logits: torch.Tensor | None, top: torch.Tensor, arg: torch.Tensor
) -> torch.Tensor:
    """log(max(probs, EPS)) (..., V) written into `out`; top, arg (...) are probs' max and argmax.

    With the logits z that probs is the softmax of, log softmax(z) = z - lse and lse = z[argmax] -
    log(max prob): a subtraction and a clamp replace a log over the vocabulary (the log is
    compute-bound, ~6x the cost of the subtraction on a CPU), and the values agree to float rounding."""
    if logits is None:
        return torch.clamp_min(probs, EPS, out=out).log_()
    logits = logits.float()
    lse = logits.gather(-1, arg[..., None]) - top.clamp_min(EPS).log()[..., None]  # (..., 1)
    return torch.sub(logits, lse, out=out).clamp_min_(LOG_EPS)


@torch.no_grad()
def position_stats(
    q_raw: torch.Tensor, p_raw: torch.Tensor, q_logits: torch.Tensor | None = None, p_logits: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features (..., F), drafter argmax (...), verifier argmax (...)) from raw probabilities (..., V):
    `token_features` and the two argmaxes, which token and judge routers read too (one pass, not two).
    The logits (..., V) that q_raw and p_raw are the softmax of, when the caller has them (the
    decoding loop, the recorder), make it cheaper and give the same values (`log_probs_into`)."""
    _check_logits(q_raw, q_logits, "q_logits")
    _check_logits(p_raw, p_logits, "p_logits")
    q_raw, p_raw = q_raw.float(), p_raw.float()
    # This runs once per decoding block on (B, gamma, V): each V-sized pass counts, so it makes
    # five (two logs, or two subtractions from the logits, two dot products, one min) into two reused
    # buffers, plus two blocked top-2s; the dot products read without writing a V-sized product.
    logs, work = scratch(q_raw)
    q_max, q_arg, q_second = top2(q_raw)
    p_max, p_arg, p_second = top2(p_raw)
    log_probs_into(logs, q_raw, q_logits, q_max, q_arg)  # log q
    q_entropy = -torch.linalg.vecdot(q_raw, logs)
    p_cross_q = torch.linalg.vecdot(p_raw, logs)  # sum p log q
    log_probs_into(logs, p_raw, p_logits, p_max, p_arg)  # log p
    p_entropy = -torch.linalg.vecdot(p_raw, logs)
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
    return torch.stack([feats[name] for name in FEATURE_NAMES], -1), q_arg, p_arg


def token_features(
    q_raw: torch.Tensor, p_raw: torch.Tensor, q_logits: torch.Tensor | None = None, p_logits: torch.Tensor | None = None
) -> torch.Tensor:
    """Features (..., F) from raw drafter/verifier probabilities (..., V); F = len(FEATURE_NAMES).
    The logits they are the softmax of, when at hand, make it cheaper (same values)."""
    return position_stats(q_raw, p_raw, q_logits, p_logits)[0]


def candidate_features(
    cand_q: torch.Tensor, cand_p: torch.Tensor, is_p_argmax: torch.Tensor, is_q_argmax: torch.Tensor
) -> torch.Tensor:
    """Per-candidate features (..., K, 5) from each candidate's raw q and p (..., K) and whether it is
    either model's argmax (..., K); the same call serves records (top-k columns) and decoding."""
    ratio = cand_q.clamp_min(EPS).log() - cand_p.clamp_min(EPS).log()
    return torch.stack([cand_q, cand_p, ratio, is_p_argmax.float(), is_q_argmax.float()], -1)


# ---- the verifier's view of the drafted token (judge routers) --------------------------------------
# After the verifier reads a drafted token d it holds a state (its last hidden state at d's input
# column) and a distribution over the next token. The loop computes both anyway: the verification
# forward over [last, d_1..d_g] gives, at d_j's column, the state after d_j and p_{j+1}.
LOOKAHEAD_NAMES: tuple[str, ...] = ("next_p_max", "next_p_entropy")
# Token classes of the drafted token, bit i of `token_class_table`: digits, punctuation, newlines and
# leading spaces mark where a slip changes an answer (numbers) or only the layout.
TOKEN_CLASS_NAMES: tuple[str, ...] = ("special", "newline", "digit", "punctuation", "letter", "leading_space")


@torch.no_grad()
def lookahead_features(next_p_raw: torch.Tensor, next_p_logits: torch.Tensor | None = None) -> torch.Tensor:
    """(..., 2) max and entropy (nats) of the verifier's next-token distribution (..., V) after d
    (from its logits too when given: see `log_probs_into`)."""
    _check_logits(next_p_raw, next_p_logits, "next_p_logits")
    p = next_p_raw.float()
    top, arg = fast_max(p)
    entropy = -torch.linalg.vecdot(p, log_probs_into(torch.empty_like(p), p, next_p_logits, top, arg))
    return torch.stack([top, entropy], -1)


def _token_class(text: str, special: bool) -> int:
    bits = 1 << TOKEN_CLASS_NAMES.index("leading_space") if text[:1] in (" ", "\t") else 0
    body = text.strip(" \t")
    if special:
        kind = "special"
    elif "\n" in text or "\r" in text:
        kind = "newline"
    elif any(ch.isdigit() for ch in body):
        kind = "digit"
    elif any(ch.isalpha() for ch in body):
        kind = "letter"
    else:
        kind = "punctuation"  # punctuation, symbols, or whitespace alone
    return bits | 1 << TOKEN_CLASS_NAMES.index(kind)


def token_class_table(tokenizer, vocab: int):
    """np.uint8 (vocab,) class bits per token id (TOKEN_CLASS_NAMES), from the tokenizer's own text."""
    import numpy as np

    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})  # chat markers, fill-in-the-middle...
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            special.add(getattr(tokenizer, name))
    table = np.zeros(vocab, dtype=np.uint8)
    for i in range(vocab):
        try:
            text = tokenizer.decode([i])
        except Exception:  # ids past the tokenizer's table (vocab padding) decode to nothing
            text = ""
        table[i] = _token_class(text, i in special or not text)
    return table


def class_bits(table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(..., 6) float class indicators of token ids (...), from a class table (V,) of bits."""
    bits = table.long()[tokens.long()]  # (...)
    # bit i as (bits // 2^i) % 2: the same values as shifts and masks, in ops ONNX has for integers
    powers = 2 ** torch.arange(len(TOKEN_CLASS_NAMES), device=bits.device)  # (6,)
    return ((bits[..., None] // powers) % 2).float()


# A judge router reads, for the drafted token d: the position's features, d's own candidate
# features, the verifier's lookahead after d and d's token class (then the hidden states it uses).
JUDGE_FEATURE_NAMES: tuple[str, ...] = (
    *FEATURE_NAMES,
    *CANDIDATE_FEATURE_NAMES,
    *LOOKAHEAD_NAMES,
    *(f"class_{name}" for name in TOKEN_CLASS_NAMES),
)


def judge_features(
    position: torch.Tensor,
    d_q: torch.Tensor,
    d_p: torch.Tensor,
    d_is_p_argmax: torch.Tensor,
    d_is_q_argmax: torch.Tensor,
    lookahead: torch.Tensor,
    classes: torch.Tensor,
) -> torch.Tensor:
    """(..., len(JUDGE_FEATURE_NAMES)) from position features (..., F), the drafted token's raw q and p
    and whether it is either model's argmax (...), the lookahead (..., 2) and class bits (..., 6).
    Records (router.offline.inputs) and decoding (router.model.LearnedRouter) both build inputs here."""
    cand = candidate_features(d_q, d_p, d_is_p_argmax, d_is_q_argmax)  # (..., 5)
    return torch.cat([position.float(), cand.float(), lookahead.float(), classes.float()], -1)


def candidates_of(
    q_raw: torch.Tensor,
    p_raw: torch.Tensor,
    cand: torch.Tensor,
    q_arg: torch.Tensor | None = None,
    p_arg: torch.Tensor | None = None,
) -> torch.Tensor:
    """Candidate features (..., K, 5) of ids cand (..., K) from full raw distributions (..., V); the
    models' argmaxes (...) when already known (position_stats computes them)."""
    q_arg = fast_argmax(q_raw) if q_arg is None else q_arg
    p_arg = fast_argmax(p_raw) if p_arg is None else p_arg
    return candidate_features(
        q_raw.gather(-1, cand), p_raw.gather(-1, cand), cand == p_arg[..., None], cand == q_arg[..., None]
    )


def shifted_lookahead(
    p_raw: torch.Tensor, next_p_raw: torch.Tensor, position: torch.Tensor, next_p_logits: torch.Tensor | None = None
) -> torch.Tensor:
    """Lookahead features (..., 2) of next_p_raw (..., V). In the decoding loop next_p_raw is p_raw
    moved on by one position (two views of one verification forward): the position features already
    hold max and entropy of all but its last row, so only that row is computed (same values)."""
    shifted = (
        not torch.compiler.is_exporting()  # a traced graph has no data pointers to compare
        and p_raw.dim() >= 2
        and next_p_raw.shape == p_raw.shape
        and p_raw.shape[-2] > 1
        and next_p_raw.stride() == p_raw.stride()
        and next_p_raw.data_ptr() == p_raw[..., 1, :].data_ptr()
        and p_raw.dtype == torch.float32
    )
    if not shifted:
        return lookahead_features(next_p_raw, next_p_logits)
    known = position[..., 1:, [FEATURE_NAMES.index("p_max"), FEATURE_NAMES.index("p_entropy")]]  # (..., T-1, 2)
    last_logits = None if next_p_logits is None else next_p_logits[..., -1:, :]
    return torch.cat([known, lookahead_features(next_p_raw[..., -1:, :], last_logits)], -2)


def recorded_candidate_features(cand) -> torch.Tensor:
    """Candidate features (N, K, 5) of recorded top-k candidates (a `router.offline.tradeoff.Candidates`,
    column 0 = the drafter's argmax): the records-side twin of `candidates_of`."""
    is_q = torch.zeros(cand.q.shape, dtype=torch.bool)
    is_q[:, 0] = True
    return candidate_features(
        torch.from_numpy(cand.q).float(), torch.from_numpy(cand.p).float(), torch.from_numpy(cand.is_p_argmax), is_q
    )
