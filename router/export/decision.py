"""The stateless decision of a router head, from the two models' logits: what an engine port runs.

`Decision(router)` is a torch module over exactly the code the decoding loop runs (the features of
`router.features`, the router's own scoring methods), so its outputs are the loop's decisions at
temperature 1 without top-p. It is what golden vectors record and what `specroute export-onnx`
exports. Inputs, per scored position n (all float32 but the draft ids):
  q_logits, p_logits (N, V)   the drafter's and the verifier's logits at the position
  alpha ()                    the trade-off
  drafts (N,) int64, next_p_logits (N, V)   judge only: the drafted token, the verifier's logits after it
  follow_values (N, W, C), follow_valid (N, W)   window judge only: the DRAFT_SCALARS of the W drafts after
                              it (router/window/follow.py) and 1/0 whether each exists in the block
  lag_values (N, L, F), lag_valid (N, L)   lag judge only: the position features (FEATURE_NAMES) of the L
                              positions before it on the emitted trajectory, most recent first, and 1/0 whether
                              each exists (router/window/lag.py: the engine carries them across blocks)
  running_sums (N, R), running_count (N,)   running judge only: the sums of RUNNING_SOURCES over every position
                              before it in the answer, and how many there are (router/window/running.py)
  <an input's own>            an input registered with router.inputs.register_input, its `export_names`
  hidden_<role> (N, H)        the hidden states the router reads (`hidden_inputs` order)
Outputs: cascade: score (N,), tv (N,), defer (N,) = score > alpha * tv; token: candidates (N, K) (the
drafter's top K), score (N, K), keep (N, K) = score <= alpha; judge: score (N,), keep (N,) = score <= alpha.
docs/router-format.md says how a decision becomes the target pi.
"""

from __future__ import annotations

import torch
from torch import nn

from router.features import FEATURE_NAMES
from router.inputs import judge_inputs
from router.view import BlockView

TV = FEATURE_NAMES.index("tv")
OUTPUTS = {"cascade": ("score", "tv", "defer"), "token": ("candidates", "score", "keep"), "judge": ("score", "keep")}


def input_names(cfg) -> list[str]:
    """The decision's inputs, in call order, for a RouterConfig."""
    judge = ["drafts", "next_p_logits"] if cfg.head == "judge" else []
    judge += [name for spec in judge_inputs(cfg) for name in spec.export_names(cfg)]  # router/inputs.py
    return ["q_logits", "p_logits", "alpha", *judge, *(f"hidden_{role}" for role in cfg.hidden_inputs)]


def output_names(cfg) -> tuple[str, ...]:
    return OUTPUTS[cfg.head]


class Decision(nn.Module):
    """A router's decision from logits (see the module docstring); gru routers have none (offline-only)."""

    def __init__(self, router):
        super().__init__()
        if router.offline_only:
            raise ValueError(router.offline_only)
        self.router = router
        self.net = router.net  # registered, so exporters see its parameters
        self.cfg = router.cfg

    def forward(self, q_logits: torch.Tensor, p_logits: torch.Tensor, alpha: torch.Tensor, *rest: torch.Tensor):
        view = self._view(q_logits.float(), p_logits.float(), list(rest))
        if self.cfg.head == "judge":
            score = self.router.judge_scores(view)  # (N,)
            return score, score <= alpha
        stats, q_arg, p_arg = self.router._stats(view)  # (N, F), (N,), (N,)
        feats = self.router._inputs(stats, view)  # (N, D)
        if self.cfg.head == "cascade":
            score = self.router.score_positions(feats)  # (N,)
            tv = stats[..., TV]
            return score, tv, score > alpha * tv
        q_raw = view.q_raw
        candidates, score = self.router.candidate_scores(q_raw, q_raw, view.p_raw, feats, q_arg, p_arg)  # (N, K) each
        return candidates, score, score <= alpha

    def _view(self, q_logits: torch.Tensor, p_logits: torch.Tensor, rest: list) -> BlockView:
        """The BlockView of the N scored positions, from the inputs in `input_names` order after alpha."""
        q_raw, p_raw = q_logits.softmax(-1), p_logits.softmax(-1)  # (N, V) each
        inputs = dict(q_logits=q_logits, p_logits=p_logits)
        if self.cfg.head == "judge":
            drafts, next_p_logits, *rest = rest
            next_p_logits = next_p_logits.float()
            inputs.update(drafts=drafts, next_p_raw=next_p_logits.softmax(-1), next_p_logits=next_p_logits)
            for spec in judge_inputs(self.cfg):  # each extra input's tensors, in input_names order
                n = len(spec.export_names(self.cfg))
                if n:
                    spec.export_view(rest[:n], self.cfg, inputs)
                    rest = rest[n:]
        hidden = {f"hidden_{role}": h for role, h in zip(self.cfg.hidden_inputs, rest)}
        return BlockView.unchecked(q_raw, p_raw, q_raw, p_raw, **inputs, **hidden)
