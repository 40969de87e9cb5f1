"""FLy's rule (Li et al., ICLR 2026, arXiv 2511.22972): an entropy gate plus a deferred window.

Read from the authors' code, AMD-AGI/FLy at commit 6667ae8477d087732eb71d7bdaa0d1cb94462a60,
`fly/models/FLy.py`, `generate_chunks` (lines 1094-1122) and `rej_by_entropy` (lines 403-415), with
the defaults of `fly_config/FLy_Llama3_70b.json` (spd_k 15, win_len 6, entropy_thre 0.3). A drafted
token d_j that is not the verifier's argmax (a mismatch) is kept when

- the gate is open: the verifier's top-3 entropy there, -sum over its 3 most likely tokens of
  p log p, is at least `entropy_thre` (a confident verifier, below it, is always followed), and
- the deferred window agrees: the next win_len - 1 drafts are each the verifier's argmax (FLy's
  pattern [False, True x (win_len - 1)] over its acceptance mask), and
- the window is not cut by the block's end: as in FLy's code (`updated_accept[:, -win_len:] &=
  accepted[:, -win_len:]`), a mismatch among the block's last win_len drafts is never kept, so at
  least win_len drafts must follow it; the rule then falls back to verification.

Every other draft is verified losslessly (docs/method.md, window policies): at temperature 0 a draft
equal to the verifier's argmax is kept and a refused mismatch is replaced by the verifier's argmax,
which is FLy's greedy decoding. At temperature > 0 FLy's window reads its sampled acceptances; here
"agrees" is always "is the verifier's argmax", so the keep decision is a function of the block and
the sampler's law is the one docs/method.md states. alpha is entropy_thre: 1.1 (above ln 3, the
largest top-3 entropy) keeps no mismatch (lossless); 0 opens the gate everywhere, and the window
alone decides. A block needs gamma >= win_len + 1 drafts for any mismatch to be kept.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from router.policy import Needs, Rule
from router.targets import keep_drafts
from router.window.follow import FollowWindow

FLY_WIN_LEN = 6  # fly_config/FLy_Llama3_70b.json
FLY_ENTROPY_THRE = 0.3
FLY_GAMMA = 15  # its spd_k
LOSSLESS_END = 1.1  # above ln 3 = 1.0986, the largest top-3 entropy: every mismatch is refused


def fly_keep(follow: FollowWindow, entropy_thre: float, win_len: int) -> torch.Tensor:
    """Which drafted positions (...) FLy keeps although they are mismatches (see module docstring)."""
    mismatch = follow.own("agree") == 0
    gate_open = follow.own("top3_entropy") >= entropy_thre
    uncut = follow.valid[..., :win_len].all(-1)  # win_len drafts follow inside the block
    window_agrees = (follow.scalar("agree")[..., : win_len - 1] > 0).all(-1)
    return mismatch & gate_open & uncut & window_agrees


def fly_offline_score(window: FollowWindow, win_len: int) -> np.ndarray:
    """Greedy-view defer score (N,) from recorded windows: -(top-3 entropy) where FLy could keep the
    mismatch (its window agrees and is uncut), +inf where it never does; FLy at alpha defers where the
    score exceeds -alpha, so the offline sweep's threshold is -alpha."""
    possible = fly_keep(window, -math.inf, win_len)  # every condition but the gate
    return np.where(possible.numpy(), -window.own("top3_entropy").double().numpy(), np.inf)


def fly_rule(win_len: int = FLY_WIN_LEN, name: str = "fly") -> Rule:
    """FLy's rule with window length `win_len` (the mismatch and the win_len - 1 drafts after it);
    register another length with `router.rules.register_rule(fly_rule(3, "fly_w3"))`."""
    if isinstance(win_len, bool) or not isinstance(win_len, int) or win_len < 1:
        raise ValueError(f"fly's win_len must be an integer >= 1 (FLy uses {FLY_WIN_LEN}), got {win_len!r}")

    def pi(q, p, alpha, q_raw, p_raw, drafts, follow):
        return keep_drafts(p, drafts, fly_keep(follow, alpha, win_len))

    return Rule(
        name,
        "window",
        (LOSSLESS_END, 0.0),
        f"keep a mismatch iff top-3 entropy(p_raw) >= alpha and the next {win_len - 1} drafts are the verifier's "
        f"argmax, {win_len} drafts following it in the block (FLy, arXiv 2511.22972)",
        pi,
        lambda window: fly_offline_score(window, win_len),
        needs=Needs(follow=win_len),  # no bonus_q: pi = p at the bonus position (no draft there)
        min_gamma=win_len + 1,
    )


FLY = fly_rule()
