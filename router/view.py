"""`BlockView`: the one read-only view of a block a deferral policy decides from.

The decoding loop, the exported decision (router/export/decision.py) and a user calling a policy by hand
all build a view and make one call, `policy.decide(view, alpha) -> pi (..., V)`. The view always holds
q, p (scaled, what pi mixes) and q_raw, p_raw (temperature 1, what decisions read), leading shape `(...)`
(a block: (B, g)); everything else is an input a policy declares in its `needs` (`router.policy.Needs`)
and the loop fills only then. An input may be given as a zero-argument function: it is computed on its
first read and kept (a follow window costs a pass over the block; a policy that never reads it never
pays). Reading an input the view does not hold is a clear error naming the need to declare. The position
features of the raw distributions (router/features.py) are computed once per view (`position_stats`): a router
and the loop's lag carry (router/window/lag.py) read the same pass.
"""

from __future__ import annotations

import torch

from router.features import position_stats
from router.targets import validate_inputs

# each input a view may hold -> the need (router.policy.NEED_NAMES) that makes the loop fill it
INPUT_NEEDS = {
    "drafts": "drafts",  # (...) the drafted tokens
    "next_p_raw": "lookahead",  # (..., V) the verifier's raw distribution after each draft (a judge)
    "q_logits": "logits",  # (..., V) the logits q_raw is the softmax of (cheaper features, same values)
    "p_logits": "logits",
    "next_p_logits": "logits",  # with lookahead: the logits next_p_raw is the softmax of
    "hidden_drafter": "hidden_drafter",  # (..., H) the drafter's last hidden state where q was computed
    "hidden_verifier": "hidden_verifier",  # (..., H) the verifier's, where p was computed
    "hidden_after": "hidden_after",  # (..., H) the verifier's, after reading each draft
    "follow": "follow",  # router.window.follow.FollowWindow of the drafts after each draft
    "lag": "lag",  # router.window.lag.LagBefore (a block) or LagHistory (each position) before it
}


class BlockView:
    """What a policy may read at the scored positions (see the module docstring)."""

    __slots__ = ("q", "p", "q_raw", "p_raw", "_inputs", "_stats")

    def __init__(
        self,
        q: torch.Tensor,
        p: torch.Tensor,
        q_raw: torch.Tensor | None = None,
        p_raw: torch.Tensor | None = None,
        **inputs,
    ):
        unknown = sorted(set(inputs) - set(INPUT_NEEDS))
        if unknown:
            raise TypeError(
                f"BlockView has no input {unknown[0]!r}; its inputs: q, p, q_raw, p_raw, {', '.join(INPUT_NEEDS)}"
            )
        self.q, self.p = q, p  # (..., V) scaled
        self.q_raw, self.p_raw = validate_inputs(q, p, q_raw, p_raw)  # (..., V) temperature 1
        self._inputs = {k: v for k, v in inputs.items() if v is not None}
        self._stats = None

    @classmethod
    def unchecked(
        cls, q: torch.Tensor, p: torch.Tensor, q_raw: torch.Tensor, p_raw: torch.Tensor, **inputs
    ) -> "BlockView":
        """A view of inputs known to be well formed (softmax outputs of one shape), built without checks: inside
        an exported graph (router/export/decision.py) a shape check would compare symbolic sizes."""
        view = cls.__new__(cls)
        view.q, view.p, view.q_raw, view.p_raw = q, p, q_raw, p_raw
        view._inputs = {k: v for k, v in inputs.items() if v is not None}
        view._stats = None
        return view

    def get(self, name: str):
        """The input `name`, or None where the view does not hold it (for inputs a policy can do without)."""
        value = self._inputs.get(name)
        if callable(value) and not isinstance(value, torch.Tensor):  # computed once, on first read
            value = self._inputs[name] = value()
        return value

    def read(self, name: str, reader: str = "this policy", error: type[Exception] = ValueError):
        """The input `name`; a clear error (of type `error`) where the view does not hold it."""
        value = self.get(name)
        if value is None:
            need = INPUT_NEEDS.get(name, name)
            raise error(
                f"{reader} reads {name!r}, which this view does not hold: declare {need!r} in the policy's needs "
                f"(router.policy.Needs) so the loop fills it, or pass BlockView(..., {name}=...) yourself"
            )
        return value

    def position_stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(position features (..., F), q's argmax (...), p's argmax (...)) of q_raw and p_raw (from their logits
        where the view holds them: cheaper, same values), computed on the first call and kept."""
        if self._stats is None:
            self._stats = position_stats(self.q_raw, self.p_raw, self.get("q_logits"), self.get("p_logits"))
        return self._stats

    @property
    def computed_features(self) -> torch.Tensor | None:
        """The position features (..., F) if a policy has asked for them (position_stats), else None."""
        return None if self._stats is None else self._stats[0]

    def raw(self) -> "BlockView":
        """The same view with q, p replaced by the raw distributions (greedy decoding of a mixing policy)."""
        return BlockView.unchecked(self.q_raw, self.p_raw, self.q_raw, self.p_raw, **self._inputs)

    @property
    def drafts(self) -> torch.Tensor:
        return self.read("drafts")

    @property
    def next_p_raw(self) -> torch.Tensor:
        return self.read("next_p_raw")

    @property
    def follow(self):
        return self.read("follow")
