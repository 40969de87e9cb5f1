"""vLLM's bridge to specroute's commands (router.backends.ENGINES names it): `specroute eval engine=vllm` decodes
its online grid here, with the plugin deciding each speculative method's acceptance (router/vllm/served.py), so
routers and rules are compared in the engine they will be served in, with vLLM's batching behind each decoding
call (`batch_size` concurrent requests); the demo prices its evaluation with `measure_costs`.

The torch pair is loaded as for the other engines: it checks the records' pair, tokenizes, and scores the
outputs' verifier log-probabilities afterwards (one teacher-forced pass, the same for every engine). vLLM
decodes: the verifier and the drafter alone, and every rule and router through one speculative engine, each
request naming its policy. What vLLM's loop cannot do is refused here, one line each, before a model loads.
"""

from __future__ import annotations

from pathlib import Path

import torch

from router.infra.config import ConfigError
from router.loading import Pair, resolve_model_path

# specroute-loop baselines with no counterpart in vLLM's loop (a cascade per token or per sequence, no drafts)
NOT_SERVED = ("token_cascade", "sequence_cascade")
MAX_MODEL_LEN = 8192  # tokens of prompt and output vLLM reserves room for per request


class PairServedByVllm(Pair):
    """The torch pair, plus `served` (router.vllm.served.ServedPair) and `router_folders` {name: folder}."""


def check_options(cfg) -> None:
    """vLLM installed here, and the decoding options its loop with the plugin runs: a fixed block size, the
    verifier's bonus token."""
    from router.vllm.served import vllm_missing

    if vllm_missing():
        raise ConfigError(vllm_missing())
    if cfg.gamma == "auto":
        raise ConfigError(
            "engine vllm drafts a fixed num_speculative_tokens per step: set gamma to a number (e.g. gamma=4)"
        )
    other = {m: g for m, g in cfg.gammas.items() if g != cfg.gamma}
    if other:
        raise ConfigError(
            f"engine vllm decodes every speculative method with one block size (gamma {cfg.gamma}); gammas sets "
            f"{other}: drop them, or evaluate those methods in a run of their own with gamma set to theirs"
        )
    if cfg.bonus_from != "verifier":
        raise ConfigError("engine vllm's bonus token is the verifier's: set bonus_from=verifier")
    if cfg.draft_stop is not None:
        raise ConfigError("engine vllm drafts whole blocks: leave draft_stop unset (null)")


def methods(names: list[str], explicit: bool, routers: dict) -> list[str]:
    """The online methods vLLM decodes. The default grid leaves out what it cannot (said once); a method named
    in online_methods that it cannot decode is refused, naming the reason."""
    from router.rules import get_rule, rule_names
    from router.vllm.settings import unsupported

    reasons = {}
    for m in names:
        if m in NOT_SERVED:
            reasons[m] = "a specroute-loop baseline vLLM's loop has no counterpart of"
        elif m in rule_names() or m in routers:
            reasons[m] = unsupported(get_rule(m) if m in rule_names() else routers[m], "policy")
    reasons = {m: why for m, why in reasons.items() if why}
    if reasons and explicit:
        m = next(iter(reasons))
        raise ConfigError(f"engine vllm cannot decode online method {m} ({reasons[m]}): drop it from online_methods")
    if reasons:
        print(f"[specroute] online (engine vllm): leaving out {sorted(reasons)} (vLLM's loop cannot decode them)")
    return [m for m in names if m not in reasons]


def serve_pair(pair: Pair, cfg, drafter: str, verifier: str, dtype: torch.dtype) -> PairServedByVllm:
    """The loaded torch pair with vLLM engines on the same Hugging Face folders (started on first use)."""
    from router.tasks.prompts import context_length
    from router.vllm.served import ServedPair

    folders = [_hf_folder(spec, dtype) for spec in (drafter, verifier)]
    served = PairServedByVllm(*pair)
    served.served = ServedPair(
        *folders,
        dtype=str(dtype).removeprefix("torch."),
        gamma=int(cfg.gamma),
        max_model_len=min(context_length(pair.drafter, pair.verifier), MAX_MODEL_LEN),
    )
    served.router_folders = {Path(f).name: str(Path(f).resolve()) for f in cfg.routers}
    return served


def _hf_folder(spec: str, dtype: torch.dtype) -> Path:
    path, extra = resolve_model_path(spec, dtype)
    if extra or not Path(path).is_dir():
        raise ConfigError(
            f"engine vllm loads Hugging Face model folders; {spec} is {'a GGUF file' if extra else 'not a folder'} "
            f"here: give the folder (embedded:drafter|verifier, or a local folder)"
        )
    return Path(path)


def decode(pair: PairServedByVllm, method: str, alpha: float, rows: list[list[int]], cfg, stops: list, prefix=None):
    """One batch of prompts (token ids) decoded by vLLM for one grid point; `prefix` (router.loop.prefix's
    SharedPrefix, or None): the prompt prefix every prompt shares, found cached as on the other engines."""
    sampling = {**cfg.sampling_kwargs(), "stop": stops}
    shared = prefix.ids if prefix is not None else None
    if method in ("verifier", "drafter"):
        return pair.served.decode(method, rows, sampling, shared=shared)
    policy = pair.router_folders.get(method, method)  # a router by its folder, a rule by its name
    return pair.served.decode("speculative", rows, sampling, (policy, alpha), shared=shared)


def note(pair: PairServedByVllm) -> dict:
    """What eval's report says of the engine beside every figure (router.vllm.served.engine_note)."""
    from router.vllm.served import engine_note

    return engine_note(pair.served)


def decodes(policy) -> bool:
    """True when the plugin can decide with this rule or router inside vLLM's loop."""
    from router.vllm.settings import unsupported

    return unsupported(policy) is None


def measure_costs(drafter: Path, verifier: Path, dtype: str, gamma: int, prompt: list[int], batch: int) -> dict:
    """Seconds per decoding step in vLLM of the verifier, the drafter and lossless speculative decoding through
    the plugin, at `batch` concurrent requests on `prompt` (router.vllm.served.measure_served_costs)."""
    from router.vllm.served import ServedPair, measure_served_costs

    return measure_served_costs(ServedPair(drafter, verifier, dtype, gamma=gamma), prompt, batch)
