"""The plugin's contract with the vLLM release under test (scripts/test.sh runs this folder once per release: 0.32,
0.33, 0.34), from its Python files and as imported: a release that moves a hook point fails here, not for a user."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import vllm
from vllm_contract import release_problems

from router.vllm.compat import LAST_WITH_V1, check_release, installable, missing_hook_points, release, runner_of


def test_the_releases_files_honour_every_hook_point():
    assert release_problems(Path(vllm.__file__).parents[1], vllm.__version__) == []


def test_the_runners_hook_points_are_found_where_the_plugin_looks_at_start_up():
    check_release(vllm.__version__)
    assert missing_hook_points("v2") == []
    has_v1 = release(vllm.__version__) <= LAST_WITH_V1
    assert (missing_hook_points("v1") == []) == has_v1
    assert installable() == (["v1", "v2"] if has_v1 else ["v2"])


def test_the_runner_the_plugin_expects_is_the_one_vllm_chooses():
    from vllm.config import VllmConfig

    chooses = hasattr(VllmConfig, "use_v2_model_runner")
    assert chooses == (release(vllm.__version__) <= LAST_WITH_V1)  # 0.34: V2 only
    assert runner_of(SimpleNamespace()) == "v2"
    assert runner_of(SimpleNamespace(use_v2_model_runner=False)) == "v1"
