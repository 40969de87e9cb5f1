"""The plugin's Model Runner V2 tests run vLLM's own V2 acceptance under Triton's interpreter (tests/vllm_v2/interp.py),
in .venv-vllm-v2 (scripts/setup_vllm_v2.sh), once per supported release: scripts/test.sh puts a release's files first
on PYTHONPATH. The main environment does not collect them (tests/conftest.py)."""

from __future__ import annotations

import interp  # (first: the interpreter's environment before triton and vllm load)
import pytest

HOOKED = (  # (module, class) whose attributes the plugin's V2 hooks replace: restored after each test
    ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler"),
    ("vllm.v1.worker.gpu.sample.sampler", "Sampler"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
)


@pytest.fixture(scope="session", autouse=True)
def bridged():
    return interp.bridge()


@pytest.fixture
def restore_vllm():
    """Undo hooks a test installs into vLLM's V2 classes."""
    import importlib

    saved = []
    for module, name in HOOKED:
        cls = getattr(importlib.import_module(module), name)
        saved.append((cls, dict(vars(cls))))
    yield
    for cls, attrs in saved:
        for key in set(vars(cls)) - set(attrs):
            delattr(cls, key)
        for key, value in attrs.items():
            if key not in ("__dict__", "__weakref__") and vars(cls).get(key) is not value:
                setattr(cls, key, value)
