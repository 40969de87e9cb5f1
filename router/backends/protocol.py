"""What specroute's loop and recording ask of an engine's backend, in one place (docs/design.md, "Engines").

Every place where engines differ calls one of these methods on `router.backends.backend_of(model)` instead of
naming an engine. The three placed-token hooks are optional: None means the engine takes a tree-shaped attention
mask, and the recording code builds one itself (torch); an engine that masks by sequence forks them instead.
"""

from __future__ import annotations

from typing import Callable, Protocol

from router.loading import Pair


class Backend(Protocol):
    name: str  # the engine's registered name (router.backends.ENGINES)

    def load_pair(self, drafter: str, verifier: str, dtype, device: str, device_map, threads: int) -> Pair:
        """Both models and the shared tokenizer, from model specs (router.loading.resolve_model_path)."""

    def machine(self, model) -> tuple[str, str]:
        """(machine, dtype) a model runs on, as figures are labelled with (router.machine.calibrate)."""

    def setting(self, model) -> str:
        """One line for summaries and headers: what the model runs in (a dtype, or kernels and threads)."""

    def note(self, model) -> dict | None:
        """What a manifest or report records of the engine in place of torch's dtype note (None: the dtype's)."""

    def forward_tail(self, model, layout, keep: int, vocab: int, hidden: bool, cache: bool, prefix):
        """Logits (B, keep, V) of the layout's last `keep` columns, their hidden states if asked, and the model's
        cache over every column if asked (router.loop.teacher.forward_tail)."""

    def warm_prefix(self, prefix, model) -> None:
        """Make the model's state over a shared prompt prefix now (router.loop.prefix.SharedPrefix.ready)."""

    def adopt_identity(self, models, specs: tuple[str, str], manifest) -> bool:
        """Give models loaded from the files another engine's records were converted from those records'
        fingerprints (True when it did): the same weights, run by another engine."""

    placed_tokens: Callable | None  # (cache, layout, cols, tokens) -> (hidden, logits): data_gen/judge.py
    chain_scalars: Callable | None  # (caches, layout, part, width) -> per-row scalars: data_gen/window.py
    continuation_run: type | None  # a run over one sequence with forked continuations: data_gen/horizon.py
