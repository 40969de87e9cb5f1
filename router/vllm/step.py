"""One speculative step decided by the plugin, whatever vLLM's model runner: each request's (policy, alpha), the
shared acceptance (router/vllm/acceptance.py) per group of requests deciding alike, the counts, and the guard that
stops the engine when a speculative step completes without the plugin having decided it.

Each runner's hooks (router/vllm/runner_v1.py, runner_v2.py) turn vLLM's tensors into a `Drafted` step, call
`decide_step`, and turn its tokens back into vLLM's layout; they call `guarded` around the runner's sampling entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from router.vllm.acceptance import PLACEHOLDER, Drafted, accept, rows_of
from router.vllm.counts import Counts
from router.vllm.settings import PluginSettings, request_choice


class HookPoint(NamedTuple):
    """A vLLM symbol a runner's hooks replace or read: where it is, the leading parameters the hooks rely on (None: a
    class, or not called by the hooks), the functions it must call by name, the `self.` attributes it must set.
    router/vllm/compat.py checks module, name and parameters at start-up; tests/vllm_contract.py all of it against
    each supported release's files."""

    module: str
    qualname: str
    params: tuple[str, ...] | None = None
    calls: tuple[str, ...] = ()
    assigns: tuple[str, ...] = ()


@dataclass
class Engine:
    """What the hooks of one engine process decide with: the settings, the counts, and how many steps the
    acceptance decided (the guard's witness)."""

    settings: PluginSettings
    counts: Counts
    decided: int = 0


class PluginBypassed(RuntimeError):
    """A speculative step completed without the plugin's acceptance deciding it (vLLM took a path the hooks do not
    cover): the engine stops rather than serve vLLM's own acceptance under the plugin's name."""


def choices_of(engine: Engine, extra_args: list) -> list[tuple]:
    """Each request's (policy, alpha): its own extra arguments over the server's (checked when it was made)."""
    return [request_choice(e, engine.settings) for e in extra_args]


def decide_step(
    engine: Engine, step: Drafted, choices: list[tuple], request_ids: list[str], width: int
) -> torch.Tensor:
    """Tokens (B, width) int32 (PLACEHOLDER after each request's last) of one step: every request decides with its
    (policy, alpha) of `choices` (choices_of); counts are added per request."""
    b = step.drafts.shape[0]
    tokens = torch.full((b, width), PLACEHOLDER, dtype=torch.int32, device=step.drafts.device)
    for (policy, alpha), mask in _groups(choices, step.drafts.device):
        done = accept(policy, alpha, step if bool(mask.all()) else rows_of(step, mask))
        tokens[mask, : done.tokens.shape[1]] = done.tokens
        rows = mask.nonzero().flatten().tolist()
        engine.counts.add(
            [request_ids[i] for i in rows],
            step.n_drafts[mask].tolist(),
            done.n_accepted.tolist(),
            done.deferred.tolist(),
            done.evaluated.tolist(),
        )
    engine.decided += 1
    return tokens


def needs_lookahead(choices: list[tuple]) -> bool:
    """Whether any request's policy reads the verifier after each draft (the bonus position's logits)."""
    return any("lookahead" in policy.needs for policy, _ in choices)


def _groups(choices: list[tuple], device) -> list[tuple]:
    """((policy, alpha), mask (B,)) for each distinct choice, in order of first appearance."""
    keys: dict = {}
    for i, (policy, alpha) in enumerate(choices):
        keys.setdefault((id(policy), alpha), ((policy, alpha), []))[1].append(i)
    out = []
    for choice, rows in keys.values():
        mask = torch.zeros(len(choices), dtype=torch.bool, device=device)
        mask[rows] = True
        out.append((choice, mask))
    return out


def guarded(engine: Engine, runner: str, speculative: bool, run):
    """Run a model runner's sampling entry (`run()`); a speculative step it completes without `decide_step` having
    run is a path the hooks do not cover: PluginBypassed, one line naming the runner and vLLM's version."""
    before = engine.decided
    out = run()
    if speculative and engine.decided == before:
        raise PluginBypassed(bypass_line(runner, engine.settings.policy.name))
    return out


def bypass_line(runner: str, policy: str) -> str:
    return (
        f"specroute vLLM plugin: error: a speculative step under {runner} (vLLM {vllm_version()}) completed without "
        f"specroute's acceptance deciding it (vLLM took a path the plugin does not hook): the engine stops rather "
        f"than serve vLLM's own acceptance as SPECROUTE_POLICY={policy}; unset SPECROUTE_POLICY to run "
        f"vLLM without specroute, or use a vLLM the plugin supports (docs/usage.md, 'Serve with vLLM')"
    )


def vllm_version() -> str:
    try:
        import vllm
    except ImportError:  # the hooks run only inside vLLM; a unit test drives them without it
        return "not installed"
    return vllm.__version__
