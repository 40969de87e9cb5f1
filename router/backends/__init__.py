"""The engines that run the models, behind one protocol (protocol.py), and the one registry of engines (`ENGINES`).

The loop (router/loop/) and recording never name an engine: where models differ they ask `backend_of(model)` and
call the answer. Each engine is declared once, below; the command line's choices, the presets, pair loading,
config checks and reports read this registry. vLLM is registered as a *served* engine: specroute's policies run
inside vLLM's own loop through the plugin (router/vllm/), so it evaluates and serves but is no backend of
specroute's loop and records nothing. Adding an engine: a module with a Backend (protocol.py), one `Engine` here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    """One engine: everything the rest of the code may ask of it."""

    name: str  # what configs and flags say: engine=NAME
    label: str  # how reports and messages name it
    module: str | None  # the Python module it needs installed (None: always there)
    setup: str  # how a user installs it
    backend: str | None  # "module:attribute" of its Backend; None: a served engine with its own loop
    cpu_only: bool = False  # runs on the CPU alone (no device, no device map)
    own_weights: bool = False  # runs the model files' own weight types: dtype settings do not apply
    threads: bool = False  # takes a `threads` setting (threads per model; 0: chosen from the machine)
    bridge: str | None = None  # a served engine's module for specroute's commands (eval's grid, the demo's costs)

    @property
    def loop(self) -> bool:
        """True for a backend of specroute's own loop (records, generate, eval); False for a served engine."""
        return self.backend is not None


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("torch", "torch", None, "bash scripts/setup.sh", "router.backends.torch_models:TORCH"),
        Engine(
            "llamacpp",
            "llama.cpp",
            "llama_cpp",
            "bash scripts/setup.sh llamacpp",
            "router.backends.llamacpp_backend:LLAMACPP",
            cpu_only=True,
            own_weights=True,
            threads=True,
        ),
        Engine("vllm", "vLLM", "vllm", "bash scripts/setup.sh vllm", None, bridge="router.vllm.grid"),
    )
}
DEFAULT_ENGINE = "torch"


def engine_names(loop_only: bool = False) -> tuple[str, ...]:
    """The registered engines' names (loop_only: the backends of specroute's own loop)."""
    return tuple(name for name, e in ENGINES.items() if e.loop or not loop_only)


def get_engine(name: str, loop_only: bool = False) -> Engine:
    """The engine called `name`, or a ValueError naming the choices."""
    if name not in engine_names(loop_only):
        raise ValueError(f"engine must be one of {', '.join(engine_names(loop_only))}, got {name!r}")
    return ENGINES[name]


def installed(name: str) -> bool:
    """True when the engine's module imports here (a module found but broken, e.g. built for another torch,
    is not an engine that can run)."""
    module = ENGINES[name].module
    if module is None:
        return True
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def backend_named(name: str):
    """The Backend of a loop engine (router.backends.protocol), imported on first use."""
    module, _, attribute = get_engine(name, loop_only=True).backend.partition(":")
    return getattr(importlib.import_module(module), attribute)


def backend_of(obj):
    """The Backend running a model or cache of specroute's loop: its `engine` attribute names the engine (a
    transformers model has none: the default)."""
    return backend_named(getattr(obj, "engine", DEFAULT_ENGINE))


def bridge(name: str):
    """A served engine's bridge module (its grid decoding and costs for specroute's commands)."""
    engine = get_engine(name)
    if engine.bridge is None:
        raise ValueError(f"engine {name} runs specroute's own loop: it has no served bridge")
    return importlib.import_module(engine.bridge)
