"""The plugin's hooks into vLLM's Model Runner V2 (vllm 0.32-0.34 wherever Triton is present: every GPU build; the
only runner from 0.34). One of the two runner modules behind the same small interface (`NAME`, `HOOK_POINTS`,
`install`); the acceptance itself is router/vllm/step.py's and acceptance.py's.

V2 decides acceptance in `RejectionSampler._verify` (v1/worker/gpu/spec_decode/rejection_sampler.py), whose first
ten arguments are the same in 0.32, 0.33 and 0.34. The plugin replaces it, and hooks nothing else of V2's but
`Sampler.add_request` (each request slot's extra arguments: a request's own policy) and, as the guard,
`GPUModelRunner.sample` (a speculative step it completes without the acceptance deciding stops the engine):
- the verifier's logits: vLLM's own logits processors (penalties, bad words, logit bias, ...) applied by vLLM's
  `Sampler.apply_sampling_params` with its temperature and min_p stages muted and top-k/top-p skipped: p_raw as
  V1's hooks see it; the processed logits vLLM's logprobs and sampling mask read are returned as vLLM's are;
- the drafter's: V2 caches the drafter's pre-temperature logits per request slot when
  `draft_sample_method="probabilistic"` (router/vllm/compat.py sets it), and draws drafts from softmax(q / T) with
  no top-k or top-p, so the acceptance divides by that q (`Drafted.draft_sampling`);
- V2 samples the token after the last kept draft inside its acceptance: the plugin draws it from the verifier's
  scaled distribution at that row (router.vllm.acceptance.next_token);
- randomness: a request with a seed draws from a generator seeded by (its seed, the step's first position), so a
  seeded request decodes the same way every time, as V2's stateless (seed, position) streams do; others from
  torch's default generator.
A draft vLLM marks -1 (a placeholder, a stale cache row) ends that request's drafts, as V2's kernels reject it.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from router.vllm.acceptance import PLACEHOLDER, Drafted, Sampling, next_token, padded_rows
from router.vllm.runner_v1 import external_id
from router.vllm.step import Engine, HookPoint, choices_of, decide_step, guarded, needs_lookahead

NAME = "Model Runner V2"
VERIFY_ARGS = (  # RejectionSampler._verify's first ten parameters after self, the same in 0.32-0.34
    "logits",
    "draft_logits",
    "draft_sampled",
    "pos",
    "cu_num_logits",
    "idx_mapping",
    "idx_mapping_np",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "seq_lens_upper_bound_np",
)
_SAMPLING = "vllm.v1.worker.gpu.sample"
_STAGE = ("self", "logits", "expanded_idx_mapping", "idx_mapping_np")  # SamplingStates' temperature, min_p, top-k/p
HOOK_POINTS = (
    HookPoint(
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "RejectionSampler._verify",
        ("self", *VERIFY_ARGS),
        calls=("apply_sampling_params", "rejection_sample"),
    ),
    HookPoint(  # reads _verify's processed logits only for processed logprobs and the sampling mask
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "RejectionSampler._verify_in_chunks",
        calls=("_verify", "_get_logprobs_tensors"),
    ),
    HookPoint(
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "RejectionSampler.__init__",
        ("self", "sampler", "spec_config", "device"),
        assigns=("sampler", "num_speculative_steps"),
    ),
    HookPoint(f"{_SAMPLING}.sampler", "Sampler.add_request", ("self", "req_idx", "sampling_params")),
    HookPoint(
        f"{_SAMPLING}.sampler",
        "Sampler.apply_sampling_params",
        ("self", "logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos", "input_ids")
        + ("expanded_local_pos", "seq_lens_upper_bound_np", "skip_top_k_top_p"),
        calls=("apply_temperature", "apply_min_p", "apply_top_k_top_p"),
    ),
    HookPoint(f"{_SAMPLING}.sampler", "Sampler.__init__", assigns=("sampling_states", "req_states")),
    HookPoint(f"{_SAMPLING}.states", "SamplingStates.apply_temperature", _STAGE),
    HookPoint(f"{_SAMPLING}.states", "SamplingStates.apply_min_p", _STAGE),
    HookPoint(f"{_SAMPLING}.states", "SamplingStates.apply_top_k_top_p", _STAGE),
    HookPoint(f"{_SAMPLING}.states", "SamplingStates.__init__", assigns=("temperature", "top_k", "top_p", "seeds")),
    HookPoint("vllm.v1.worker.gpu.states", "RequestState.__init__", assigns=("index_to_req_id",)),
    HookPoint(
        "vllm.v1.worker.gpu.model_runner",
        "GPUModelRunner.sample",
        ("self", "hidden_states", "input_batch"),
        calls=("rejection_sampler",),
    ),
)
EXTRA_ARGS = "_specroute_extra_args"  # a Sampler's {slot: the request's extra_args}


def install(engine: Engine) -> None:
    """Put the hooks in (in vLLM's engine process)."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    original_add = Sampler.add_request
    original_sample = GPUModelRunner.sample

    def add_request(self, req_idx, sampling_params):
        self.__dict__.setdefault(EXTRA_ARGS, {})[int(req_idx)] = getattr(sampling_params, "extra_args", None)
        return original_add(self, req_idx, sampling_params)

    @functools.wraps(RejectionSampler._verify)  # its signature stays vLLM's: compat's check reads it
    def verify(self, *args, **kwargs):
        return verify_step(engine, self, *args, **kwargs)

    def sample(self, hidden_states, input_batch, *args, **kwargs):
        speculative = getattr(input_batch, "num_draft_tokens", 0) > 0 and getattr(input_batch, "num_reqs", 0) > 0
        run = lambda: original_sample(self, hidden_states, input_batch, *args, **kwargs)  # noqa: E731
        return guarded(engine, NAME, speculative, run)

    Sampler.add_request = add_request
    RejectionSampler._verify = verify
    GPUModelRunner.sample = sample


def verify_step(engine: Engine, rejection_sampler, *args, **kwargs) -> tuple:
    """RejectionSampler._verify with the plugin deciding: (processed logits, sampled (R, K + 1) int64, num_sampled
    (R,) int32), as vLLM's returns them."""
    named = dict(zip(VERIFY_ARGS, args))
    named.update({k: v for k, v in kwargs.items() if k in VERIFY_ARGS})
    # 0.32/0.33: the drafts to verify may differ from the ones the processors read (invalid drafts masked to -1)
    drafts = kwargs.get("verify_draft_sampled", args[10] if len(args) > 10 else None)
    drafts = named["draft_sampled"] if drafts is None else drafts
    sampler = rejection_sampler.sampler
    unscaled, processed = verifier_logits(sampler, named)
    slots = [int(s) for s in np.asarray(named["idx_mapping_np"]).tolist()]
    choices = choices_of(engine, [sampler.__dict__.get(EXTRA_ARGS, {}).get(s) for s in slots])
    ids = [external_id(sampler.req_states.index_to_req_id.get(s, str(s))) for s in slots]
    step = v2_step(
        unscaled,
        named["draft_logits"],
        drafts,
        named["cu_num_logits"],
        named["idx_mapping"],
        named["pos"],
        settings_of(sampler, slots, named["pos"], named["cu_num_logits"]),
        needs_lookahead(choices),
    )
    width = rejection_sampler.num_speculative_steps + 1
    tokens = decide_step(engine, step, choices, ids, width)  # (R, K + 1) int32
    sampled = tokens.to(torch.int64)
    num_sampled = (tokens != PLACEHOLDER).sum(-1).to(torch.int32)
    return processed, sampled, num_sampled


def verifier_logits(sampler, named: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(unscaled, processed) (N, V): the verifier's logits after vLLM's logits processors at temperature 1 (what the
    acceptance reads), and after its temperature, min_p and top-k/top-p too (what vLLM's logprobs and sampling mask
    read). Both through vLLM's own Sampler, so every processor a request enables applies as vLLM applies it."""
    logits = named["logits"]
    call = (
        logits,
        named["expanded_idx_mapping"],
        named["idx_mapping"],
        named["idx_mapping_np"],
        named["pos"],
        named["draft_sampled"],
        named["expanded_local_pos"],
        named["seq_lens_upper_bound_np"],
    )
    states = sampler.sampling_states
    muted = {"apply_temperature": _unchanged, "apply_min_p": _unchanged}
    states.__dict__.update(muted)  # instance attributes shadow the methods for this one call
    try:
        unscaled = sampler.apply_sampling_params(*call, skip_top_k_top_p=True)
    finally:
        for name in muted:
            states.__dict__.pop(name, None)
    if unscaled is logits:  # no request needed processing: vLLM's processed logits are its raw ones
        return logits, logits
    if not reads_processed(sampler):  # nothing after _verify reads them: no (N, V) copy, no top-k/top-p pass
        return unscaled, unscaled
    eidx, idx_np = named["expanded_idx_mapping"], named["idx_mapping_np"]
    processed = unscaled.clone()
    states.apply_temperature(processed, eidx, idx_np)
    states.apply_min_p(processed, eidx, idx_np)
    return unscaled, states.apply_top_k_top_p(processed, eidx, idx_np)


def reads_processed(sampler) -> bool:
    """Whether vLLM reads _verify's processed logits after it (RejectionSampler._verify_in_chunks, 0.32-0.34): for
    logprobs in a processed logprobs mode, and for the sampling mask."""
    mode = str(getattr(sampler, "logprobs_mode", ""))
    return mode.startswith("processed") or bool(getattr(sampler, "return_sampling_mask", False))


def _unchanged(*_args, **_kwargs) -> None:
    return None


def settings_of(sampler, slots: list[int], pos: torch.Tensor, cu: torch.Tensor) -> Sampling:
    """Each request's temperature, top_k and top_p (R,) from V2's per-slot sampling states, with a generator for a
    request that has its own seed (seeded by the seed and the step's first position)."""
    states = sampler.sampling_states
    device = pos.device
    index = np.asarray(slots, dtype=np.int64)
    temperature = torch.as_tensor(states.temperature.np[index], dtype=torch.float32, device=device)
    top_k = torch.as_tensor(states.top_k.np[index], dtype=torch.long, device=device)
    top_p = torch.as_tensor(states.top_p.np[index], dtype=torch.float32, device=device)
    seeded = getattr(states, "seeds_set", np.ones(len(states.seeds.np), dtype=bool))
    starts = pos[cu[:-1].long()].tolist()  # each request's first row's position
    generators = [
        _generator(int(states.seeds.np[s]), int(p), device) if bool(seeded[s]) else None for s, p in zip(slots, starts)
    ]
    return Sampling(temperature, top_k, top_p, generators)


def _generator(seed: int, position: int, device) -> torch.Generator:
    """A generator for one request's step: a function of (seed, position) only, as V2's random streams are."""
    mixed = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % (1 << 63)
    return torch.Generator(device=device).manual_seed(mixed)


def v2_step(
    unscaled: torch.Tensor,
    draft_logits,
    drafts: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    pos: torch.Tensor,
    sampling: Sampling,
    lookahead: bool,
) -> Drafted:
    """V2's flat step (request r owns logits rows cu[r]..cu[r+1]-1: its drafts' rows, then the row after its last
    draft; draft i's token is drafts[cu[r] + i + 1]) as padded (R, K, ...) rows of requests."""
    cu = cu_num_logits.long()
    start, rows = cu[:-1], cu[1:] - cu[:-1]  # (R,)
    k = max(int(rows.max()) - 1, 1) if len(rows) else 1
    n_logits, v = unscaled.shape
    flat, inside = padded_rows(start, rows - 1, k, n_logits)  # (R, K): draft i's logits row
    tokens = drafts.long()[(flat + 1).clamp_max(len(drafts) - 1)]  # (R, K)
    valid = inside & (tokens >= 0)
    cache_rows = _cache_rows(draft_logits, idx_mapping)  # (R,) -1: no cached drafts
    valid &= (cache_rows >= 0)[:, None]
    n = valid.long().cumprod(-1).sum(-1)  # (R,) drafts before the first invalid one
    q_logits = _cached_q(draft_logits, cache_rows, k, v)  # (R, K, V)
    logits = unscaled[flat].float()  # (R, K, V)
    after = unscaled[start + n].float()  # (R, V): the row after each request's last draft
    drafted_with = Sampling(  # V2 draws drafts from softmax(q / T): the request's temperature, no top-k or top-p
        sampling.temperature, torch.zeros_like(sampling.top_k), torch.ones_like(sampling.top_p), sampling.generators
    )
    return Drafted(
        torch.where(valid, tokens, 0),
        n,
        q_logits,
        logits,
        after if lookahead else None,
        next_token(after, sampling),
        sampling,
        drafted_with,
    )


def _cache_rows(draft_logits, idx_mapping: torch.Tensor) -> torch.Tensor:
    """Each request's row in V2's draft-logits cache (R,): its slot, or the cache's row mapping (0.34, a
    batch-sharded cache); -1 where none (its drafts are then not verified)."""
    if draft_logits is None:
        raise RuntimeError(
            "specroute vLLM plugin: Model Runner V2 cached no drafter logits for this step: the engine must run with "
            "speculative_config draft_sample_method='probabilistic' (the plugin sets it at start-up)"
        )
    mapping = getattr(draft_logits, "row_mapping", None)
    slots = idx_mapping.long()
    return slots if mapping is None else mapping.long()[slots]


def _cached_q(draft_logits, cache_rows: torch.Tensor, k: int, v: int) -> torch.Tensor:
    """The drafter's pre-temperature logits (R, K, V) at each request's drafts (zeros where it has no row)."""
    # 0.32/0.33: the tensor itself; 0.34: a DraftLogitsCache holding it (a tensor's own .values is a method)
    values = draft_logits if isinstance(draft_logits, torch.Tensor) else draft_logits.values
    q = values[cache_rows.clamp_min(0), :k, :v].float()  # (R, K, V)
    return torch.where((cache_rows >= 0)[:, None, None], q, torch.zeros((), device=q.device))
