"""The plugin's configuration, read from the environment (vLLM starts its engine core as another process,
which inherits it) and checked in one place: each problem is one line naming the variable and the fix.

    SPECROUTE_POLICY   a rule name (`specroute rules`) or a router folder; unset or empty: the plugin is off
    SPECROUTE_ALPHA    the policy's trade-off (required unless the rule takes none, e.g. lossless)
    SPECROUTE_STATS    a JSON file the engine keeps current with accepted, rejected and deferred drafts
                       per request and in total (optional)
    SPECROUTE_CHECK_PAIR  0 skips the check that a router decodes the models it was trained on (default 1)
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
# what vLLM's batch gives a policy: the drafts, and the verifier's distribution after each (a judge's lookahead);
# q at the bonus position is not computed (the bonus token is the verifier's, bonus_from="verifier")
SUPPORTED_INPUTS = frozenset({"drafts", "lookahead", "bonus_q"})
WHY_NOT = {
    "hidden_drafter": "vLLM does not hand the drafter's hidden states to the acceptance step",
    "hidden_verifier": "vLLM does not hand the verifier's hidden states to the acceptance step",
    "hidden_after": "vLLM does not hand the verifier's hidden states to the acceptance step",
    "logits": "the drafting hook keeps the drafter's distribution, not its logits",
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
    return PluginSettings(policy, alpha, stats, check in ("1", "true"))


def load_policy(spec: str) -> DeferralPolicy:
    """A registered rule by name, else a router folder (router/model.py's load_router)."""
    from router.model import RouterError, load_router
    from router.rules import get_rule, rule_names

    if spec in rule_names():
        return get_rule(spec)
    folder = Path(spec).expanduser()
    if not folder.exists():
        raise PluginSettingError(
            f"{ENV_POLICY}={spec} is neither a rule ({', '.join(rule_names())}) nor a router folder: "
            f"name one (`specroute rules` lists the rules; `specroute train` writes router folders)"
        )
    try:
        router = load_router(folder)
    except (RouterError, OSError, ValueError) as err:
        raise PluginSettingError(f"{ENV_POLICY}={spec}: {err}") from None
    return router


def check_supported(policy: DeferralPolicy) -> None:
    """Refuse a policy whose inputs vLLM cannot give, or that needs what the plugin does not do."""
    if policy.offline_only:
        raise PluginSettingError(f"{ENV_POLICY}: {policy.offline_only}")
    needs = policy.needs
    for name in (*sorted(needs.inputs - SUPPORTED_INPUTS), *(["follow"] if needs.follow else [])):
        need = name if name in WHY_NOT else ("lag" if name in ("lag", "running") else name)
        raise PluginSettingError(
            f"{ENV_POLICY}={policy.name} reads {name}, which the vLLM plugin cannot give it ({WHY_NOT.get(need, 'not exposed')}): "
            f"decode it with `specroute generate`, or choose a policy without it"
        )
    if needs.lag or needs.running:
        raise PluginSettingError(
            f"{ENV_POLICY}={policy.name} reads {'running sums' if needs.running else 'a lag history'}, which the vLLM "
            f"plugin cannot give it ({WHY_NOT['lag']}): decode it with `specroute generate`"
        )
    if policy.exact_bonus:
        raise PluginSettingError(
            f"{ENV_POLICY}={policy.name} takes its bonus token from pi, which needs the drafter at the bonus position: "
            f"vLLM's bonus token is the verifier's (choose another policy; `drafter` is vLLM's drafter alone)"
        )


def _alpha(policy: DeferralPolicy, text: str | None) -> float:
    if text is None or not text.strip():
        if getattr(policy, "alpha_range", ()) is None:
            return 0.0
        raise PluginSettingError(
            f"{ENV_ALPHA} is not set: {policy.name} needs its trade-off (`specroute rules` lists each rule's range; "
            f"eval's report.md lists a router's alphas matched to rejection rates)"
        )
    try:
        alpha = float(text)
    except ValueError:
        raise PluginSettingError(f"{ENV_ALPHA}={text!r} is not a number") from None
    if math.isnan(alpha):
        raise PluginSettingError(f"{ENV_ALPHA} is NaN: give a number")
    try:
        return policy.check_alpha(alpha)
    except ValueError as err:
        raise PluginSettingError(f"{ENV_ALPHA}: {err}") from None
