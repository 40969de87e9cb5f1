"""The online grid: which (method, alpha) points `specroute eval` decodes, checked before any model
is loaded.

Methods are plug-in rules (router/rules.py), trained routers (by folder name) and the baselines;
each method's alphas come from the config, else from matching its offline curve to target rejection
rates (fractions of the verifier's own), else from DEFAULT_ALPHAS.
"""

from __future__ import annotations

import numpy as np

from router.backends import bridge, get_engine
from router.infra.config import ConfigError
from router.rules import get_rule, online_rules, rule_names

BASELINES = ("verifier", "drafter", "token_cascade", "sequence_cascade")
# methods without an offline curve to match alphas on (verifier/drafter/lossless take no alpha)
DEFAULT_ALPHAS = {
    "token_cascade": [0.1, 0.3, 0.5],
    "sequence_cascade": [0.1, 0.3, 0.5],
    "lossy": [0.3, 0.6, 0.9],
    "mixture": [0.9, 0.7, 0.5],
    "fly": [0.3, 0.6, 0.9],  # FLy's entropy_thre 0.3, then gates closed at more positions
}


def known_method(name: str, routers: dict) -> bool:
    return name in rule_names() or name in BASELINES or name in routers


def alphas_at_rejection(
    thresholds: np.ndarray, rejections: np.ndarray, targets: list[float], alpha_range: tuple | None
) -> list[float]:
    """Alphas whose offline points come closest to each target rejection rate (matched operating
    points across methods), clipped into the rule's range, distinct, finite."""
    picked = []
    finite = np.isfinite(thresholds)
    for target in targets:
        i = int(np.argmin(np.where(finite, np.abs(rejections - target), np.inf)))
        alpha = float(thresholds[i])
        if alpha_range is not None:
            lo, hi = sorted(alpha_range)
            alpha = min(max(alpha, lo), hi)
        picked.append(round(alpha, 4))
    return sorted(set(picked))


def online_methods(cfg, routers: dict) -> list[str]:
    """The configured online methods (default: every plug-in rule, every router, the cascades),
    every name and every `alphas`/`paired_with` entry checked."""
    decodable = [name for name, r in routers.items() if not r.offline_only]
    if not cfg.online_methods and len(decodable) < len(routers):
        print(f"[specroute] online: leaving out the offline-only routers {sorted(set(routers) - set(decodable))} (gru)")
    methods = cfg.online_methods or [*_fitting_rules(cfg), *decodable, "token_cascade", "sequence_cascade"]
    if not get_engine(cfg.engine).loop:  # a served engine decodes what its own loop can
        methods = bridge(cfg.engine).methods(methods, bool(cfg.online_methods), routers)
    short = [m for m in methods if m in rule_names() and not _block_fits(cfg, m)]
    if short:
        raise ConfigError(
            f"{short[0]} needs blocks of at least {get_rule(short[0]).min_gamma} drafts (it reads the drafts after "
            f"each draft), gamma is {cfg.gamma}: set gammas: {{{short[0]}: {max(get_rule(short[0]).min_gamma, 15)}}}"
        )
    offline_only = [routers[m].offline_only for m in methods if m in routers and routers[m].offline_only]
    if offline_only:
        raise ConfigError(f"{offline_only[0]}; drop it from online_methods (it is still scored offline)")
    unknown = [m for m in methods if not known_method(m, routers)]
    if unknown:
        raise ConfigError(
            f"unknown online methods {unknown}: use rule names {list(rule_names())}, router folder names "
            f"{list(routers)} or baselines {list(BASELINES)}"
        )
    stray_gammas = sorted(set(cfg.gammas) - set(methods))
    if stray_gammas:
        raise ConfigError(f"gammas are set for {stray_gammas}, which are not among the online methods {methods}")
    stray = sorted(set(cfg.alphas) - set(methods))
    if stray:
        raise ConfigError(
            f"alphas are set for {stray}, which are not among the online methods {methods}: "
            f"add them to online_methods or drop their alphas"
        )
    unpaired = [m for m in cfg.paired_with if m not in (*methods, "verifier", "drafter")]
    if unpaired:
        raise ConfigError(
            f"paired_with names {unpaired}, which are not decoded online (online methods: {methods}, "
            f"plus verifier and drafter): add them to online_methods or drop them from paired_with"
        )
    return methods


def _block_fits(cfg, rule: str) -> bool:
    """A rule can decode at its block size (a window rule needs min_gamma drafts per block)."""
    gamma = cfg.gammas.get(rule, cfg.gamma)
    return gamma != "auto" and gamma >= get_rule(rule).min_gamma or get_rule(rule).min_gamma <= 1


def _fitting_rules(cfg) -> list[str]:
    """The default grid's rules: every online rule that can decode at its block size (others noted)."""
    left_out = [r for r in online_rules() if not _block_fits(cfg, r)]
    if left_out:
        print(
            f"[specroute] online: leaving out {left_out} (they need longer blocks than gamma {cfg.gamma}: see gammas)"
        )
    return [r for r in online_rules() if r not in left_out]


def method_alphas(method: str, cfg, curves: dict, targets: list[float]) -> list[float]:
    """One method's online alphas: configured, none (lossless), matched to its offline curve, or the
    default grid; a rule's alphas checked against its range."""
    if method in cfg.alphas:
        alphas = list(cfg.alphas[method])
    elif method in rule_names() and get_rule(method).alpha_range is None:  # lossless: alpha unused
        alphas = [0.0]
    elif method in curves:  # matched to the offline rejection targets
        rule = get_rule(method) if method in rule_names() else None
        # a window rule's offline sweep runs over -alpha (fly: defer where -entropy > -alpha, router/window/fly.py)
        sign = -1.0 if rule is not None and rule.form == "window" else 1.0
        rng = rule.alpha_range if rule is not None else None
        alphas = alphas_at_rejection(sign * curves[method].threshold, curves[method].rejection, targets, rng)
    elif method in DEFAULT_ALPHAS:
        alphas = DEFAULT_ALPHAS[method]
    else:
        raise ConfigError(
            f"{method}'s online alpha is matched to its offline curve on the records' {cfg.match_split} split, "
            f"which holds no rows: record more examples, set match_split=test, or give it alphas by hand "
            f"(alphas: {{{method}: [..]}})"
        )
    if method in rule_names():
        for a in alphas:  # refuse before any model call, not halfway through the grid
            get_rule(method).check_alpha(float(a))
    return [float(a) for a in alphas]


def online_grid(cfg, curves: dict, verifier_rejection: float, routers: dict) -> list[tuple[str, float]]:
    """Every (method, alpha) point, the verifier and drafter references first."""
    targets = [f * verifier_rejection for f in cfg.online_rejection_targets]
    grid = [("verifier", 0.0), ("drafter", 0.0)]  # the references, measured first
    for m in online_methods(cfg, routers):
        if m not in ("verifier", "drafter"):
            grid += [(m, a) for a in method_alphas(m, cfg, curves, targets)]
    return grid
