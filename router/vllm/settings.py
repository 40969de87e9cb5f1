"""The plugin's configuration, read from the environment (vLLM starts its engine core as another process,
which inherits it) and checked in one place: each problem is one line naming the variable and the fix.

    SPECROUTE_POLICY   a rule name (`specroute rules`) or a router folder; unset or empty: the plugin is off
    SPECROUTE_ALPHA    the policy's trade-off (required unless the rule takes none, e.g. lossless)
    SPECROUTE_STATS    a JSON file the engine keeps current with accepted, rejected and deferred drafts
                       per request and in total (optional); SPECROUTE_STATS_EVERY: at most every that many
                       seconds (default 1; 0: after every step)
    SPECROUTE_CHECK_PAIR  0 skips the check that a router decodes the models it was trained on (default 1)

A request may choose another policy or alpha for itself with vLLM's per-request extra arguments:
`SamplingParams(extra_args={"specroute_policy": "opt", "specroute_alpha": 0.3})`, or over the OpenAI API
`extra_body={"vllm_xargs": {"specroute_policy": "opt", "specroute_alpha": 0.3}}`; both are checked when the
request is made (a bad one is refused with vLLM's validation error, HTTP 400 from the server).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from router.policy import DeferralPolicy

ENV_POLICY, ENV_ALPHA, ENV_STATS, ENV_CHECK_PAIR = (
    "SPECROUTE_POLICY",
    "SPECROUTE_ALPHA",
    "SPECROUTE_STATS",
    "SPECROUTE_CHECK_PAIR",
)
ENV_STATS_EVERY = "SPECROUTE_STATS_EVERY"
SETTINGS_ENV = (ENV_POLICY, ENV_ALPHA, ENV_STATS, ENV_CHECK_PAIR, ENV_STATS_EVERY)  # every variable read_settings reads
# what vLLM's batch gives a policy: the drafts, both models' logits, and the verifier's distribution after each
# (a judge's lookahead);
# q at the bonus position is not computed (the bonus token is the verifier's, bonus_from="verifier")
SUPPORTED_INPUTS = frozenset({"drafts", "lookahead", "logits", "bonus_q"})
WHY_NOT = {
    "hidden_drafter": "vLLM does not hand the drafter's hidden states to the acceptance step",
    "hidden_verifier": "vLLM does not hand the verifier's hidden states to the acceptance step",
    "hidden_after": "vLLM does not hand the verifier's hidden states to the acceptance step",
    "follow": "a follow window reads drafts across blocks that vLLM's step does not keep",
    "lag": "a lag history (or running sums) spans earlier steps, which vLLM's step does not keep",
}


class PluginSettingError(ValueError):
    """A plugin setting that cannot be used, with the fix."""


@dataclass(frozen=True)
class PluginSettings:
    """The policy the plugin decides with, its alpha, and where its counts go."""

    policy: DeferralPolicy
    alpha: float
    stats: Path | None
    check_pair: bool
    stats_every: float = 1.0


def read_settings(environ=None) -> PluginSettings | None:
    """The plugin's settings, or None when SPECROUTE_POLICY is unset or empty (the plugin stays off)."""
    env = os.environ if environ is None else environ
    spec = env.get(ENV_POLICY, "").strip()
    if not spec:
        return None
    policy = load_policy(spec)
    check_supported(policy)
    alpha = _alpha(policy, env.get(ENV_ALPHA))
    stats = Path(env[ENV_STATS]) if env.get(ENV_STATS, "").strip() else None
    if stats is not None and stats.is_dir():
        raise PluginSettingError(f"{ENV_STATS}={stats} is a folder: name the JSON file the counts go to")
    check = env.get(ENV_CHECK_PAIR, "1").strip().lower()
    if check not in ("0", "1", "false", "true"):
        raise PluginSettingError(f"{ENV_CHECK_PAIR} is 1 (check the pair, the default) or 0, got {check!r}")
    every = env.get(ENV_STATS_EVERY, "1").strip()
    try:
        every_s = float(every)
    except ValueError:
        every_s = -1.0
    if not every_s >= 0:
        raise PluginSettingError(f"{ENV_STATS_EVERY} is seconds between writes of the counts (>= 0), got {every!r}")
    return PluginSettings(policy, alpha, stats, check in ("1", "true"), every_s)


REQUEST_POLICY, REQUEST_ALPHA = "specroute_policy", "specroute_alpha"
_REQUEST_POLICIES: dict = {}  # spec -> loaded policy: a router folder is read once per process


def request_choice(extra_args: dict | None, default: PluginSettings) -> tuple[DeferralPolicy, float]:
    """The (policy, alpha) a request decides with: its own extra arguments over the server's settings."""
    extra = extra_args or {}
    if REQUEST_POLICY not in extra and REQUEST_ALPHA not in extra:
        return default.policy, default.alpha
    policy = default.policy
    if REQUEST_POLICY in extra:
        spec = extra[REQUEST_POLICY]
        if not isinstance(spec, str) or not spec.strip():
            raise PluginSettingError(f"{REQUEST_POLICY} is a rule name or a router folder, got {spec!r}")
        if spec not in _REQUEST_POLICIES:
            loaded = load_policy(spec, REQUEST_POLICY)
            check_supported(loaded, REQUEST_POLICY)
            _REQUEST_POLICIES[spec] = loaded
        policy = _REQUEST_POLICIES[spec]
    value = extra.get(REQUEST_ALPHA)
    if value is None:
        return policy, (default.alpha if policy is default.policy else _alpha(policy, None, REQUEST_ALPHA))
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PluginSettingError(f"{REQUEST_ALPHA} must be a number, got {value!r}")
    return policy, _alpha(policy, str(value), REQUEST_ALPHA)


def load_policy(spec: str, name: str = ENV_POLICY) -> DeferralPolicy:
    """A registered rule by name, else a router folder (router/model.py's load_router)."""
    from router.model import RouterError, load_router
    from router.rules import get_rule, rule_names

    if spec in rule_names():
        return get_rule(spec)
    folder = Path(spec).expanduser()
    if not folder.exists():
        raise PluginSettingError(
            f"{name}={spec} is neither a rule ({', '.join(rule_names())}) nor a router folder: "
            f"name one (`specroute rules` lists the rules; `specroute train` writes router folders)"
        )
    try:
        router = load_router(folder)
    except (RouterError, OSError, ValueError) as err:
        raise PluginSettingError(f"{name}={spec}: {err}") from None
    return router


def check_supported(policy: DeferralPolicy, name: str = ENV_POLICY) -> None:
    """Refuse a policy whose inputs vLLM cannot give, or that needs what the plugin does not do."""
    if policy.offline_only:
        raise PluginSettingError(f"{name}={policy.name}: {policy.offline_only}")
    needs = policy.needs
    missing = sorted(needs.inputs - SUPPORTED_INPUTS) + (["follow"] if needs.follow else [])
    missing += ["lag"] if needs.lag or needs.running else []
    if missing:
        what = missing[0]
        reads = "running sums" if what == "lag" and needs.running else what
        raise PluginSettingError(
            f"{name}={policy.name} reads {reads}, which the vLLM plugin cannot give it ({WHY_NOT.get(what, 'not exposed')}): "
            f"decode it with `specroute generate`, or choose a policy without it"
        )
    if policy.exact_bonus:
        raise PluginSettingError(
            f"{name}={policy.name} takes its bonus token from pi, which needs the drafter at the bonus position: "
            f"vLLM's bonus token is the verifier's (choose another policy)"
        )


def unsupported(policy: DeferralPolicy, name: str = ENV_POLICY) -> str | None:
    """Why the plugin cannot decide with `policy` (check_supported's line), or None where it can."""
    try:
        check_supported(policy, name)
    except PluginSettingError as err:
        return str(err)
    return None


def _alpha(policy: DeferralPolicy, text: str | None, name: str = ENV_ALPHA) -> float:
    if text is None or not text.strip():
        if getattr(policy, "alpha_range", ()) is None:
            return 0.0
        raise PluginSettingError(
            f"{name} is not set: {policy.name} needs its trade-off (`specroute rules` lists each rule's range; "
            f"eval's report.md lists a router's alphas matched to rejection rates)"
        )
    try:
        alpha = float(text)
    except ValueError:
        raise PluginSettingError(f"{name}={text!r} is not a number") from None
    if math.isnan(alpha):
        raise PluginSettingError(f"{name} is NaN: give a number")
    try:
        return policy.check_alpha(alpha)
    except ValueError as err:
        raise PluginSettingError(f"{name}: {err}") from None
