"""Shared fixtures (helpers the tests import live in tests/helpers.py): the tiny pair built once per
session, and the sandbox mode code-task tests run under."""

from __future__ import annotations

import os
import tempfile

# before transformers is imported: the modules it copies for custom_generate=<folder> go into a
# temporary folder, not the user's ~/.cache (transformers reads the variable once, at import)
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="specroute-test-hf-modules-")

import pytest  # noqa: E402

from router.tasks import sandbox as executor  # noqa: E402

if not (
    executor.bwrap_works() or executor.unshare_works()
):  # code-task tests still run (the escape tests skip, saying why)
    os.environ.setdefault("SPECROUTE_SANDBOX", "python")


@pytest.fixture(scope="session")
def tiny():
    """The tiny pair (router.engine.tiny: two random Qwen2 models and their tokenizer), built once per
    session; tests must not change its weights."""
    from router.engine.tiny import tiny_pair

    return tiny_pair()
