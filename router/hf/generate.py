"""`cascade_generate`: specroute's speculative cascade loop as a Hugging Face custom generation method.

    out = verifier.generate(**inputs, custom_generate=cascade_generate, assistant_model=drafter,
                            rule="token_v2", alpha=0.2, max_new_tokens=64)

transformers prepares the call first (the generation config merged with the model's, the logits
processors, the length limit) and then hands the prompt to this function, which decodes it with
`router.decoding.generate` (batches, left padding, hidden-state and judge routers, gamma auto, stop
strings) and returns what transformers would: the sequences, or a `CascadeGenerateOutput` (a
`GenerateDecoderOnlyOutput` with specroute's stats) with `return_dict_in_generate=True`. The call is spelled
as transformers spells it (`assistant_model=`, `stop_strings=`): transformers keeps `assistant_model` to
itself, so it is read from the `generate` call's frame (`router.hf.settings.caller_arguments`). It also keeps
`tokenizer=` from a custom generation function, so in process `stop_strings` is a `StopStrings` built with
the tokenizer (`StopStrings.build(tokenizer, [...])`); the folder route builds it itself. The remote-code
route (an exported router folder as `custom_generate=DIR`) is `router.hf.folder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from router.loop.options import DecodeOptions
from router.hf.settings import (
    GenerationSettingError,
    caller_arguments,
    decode_settings,
    refuse_arguments,
    refuse_other_spellings,
    refuse_settings,
)


@dataclass
class CascadeGenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' decoder-only output (sequences (B, prompt + new); scores and the rest None) with
    specroute's stats (`router.decoding.generate`'s), the source of every new token (B, new: 0 kept
    drafter token, 1 verifier step, -1 padding) and the verifier's log-probabilities of them."""

    stats: dict | None = None
    sources: torch.Tensor | None = None
    verifier_logprobs: list | None = None


def cascade_generate(
    model,
    input_ids: torch.Tensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    rule="opt",
    alpha: float | None = None,
    gamma: int | str = DecodeOptions.gamma,
    seed: int | None = None,
    check_pair: bool = True,
    bonus_from: str = DecodeOptions.bonus_from,
    draft_stop: float | None = DecodeOptions.draft_stop,
    stop_strings=None,
    drafter=None,
    stop=None,
    stop_tokenizer=None,
    **model_kwargs,
):
    """Decode input_ids (B, T) with `model` as the verifier and `drafter` as the drafter.

    rule: a plug-in rule name, a router folder (or a loaded router), or any deferral policy; alpha:
    its trade-off (required unless the rule takes none, e.g. lossless). The drafter is the call's
    `assistant_model`. Sampling (do_sample, temperature, top_p) and the length (max_new_tokens) come from the
    generation config; seed: the loop's sampler seed (default: drawn from torch's global generator, so
    torch.manual_seed makes a call reproducible as it does for transformers' own sampling). stop_strings:
    a `router.tasks.prompts.StopStrings` (transformers does not pass `tokenizer=` to this function). gamma,
    bonus_from, draft_stop and check_pair as in `router.decoding.generate`. `drafter=`, `stop=` and
    `stop_tokenizer=` (specroute's former spellings) are refused with transformers' names."""
    from router.decoding import generate

    refuse_other_spellings({"drafter": drafter, "stop": stop, "stop_tokenizer": stop_tokenizer})
    if model_kwargs.get("inputs_embeds") is not None:
        raise GenerationSettingError(
            "inputs_embeds= is not read by specroute's loop, which drafts and verifies token ids: pass input_ids"
        )
    drafter = _checked_call(generation_config)
    policy = resolve_policy(rule)
    attention_mask = _attention_mask(model_kwargs, input_ids)
    settings = decode_settings(generation_config, logits_processor, stopping_criteria, input_ids.shape[1])
    _check_eos(model, generation_config)
    out = generate(
        drafter,
        model,
        input_ids,
        rule=policy,
        alpha=_alpha(policy, alpha),
        gamma=gamma,
        seed=_seed(seed),
        attention_mask=attention_mask,
        bonus_from=bonus_from,
        stop=_stop_strings(stop_strings),
        draft_stop=draft_stop,
        check_pair=check_pair,
        **settings,
    )
    sequences = out.sequences.to(input_ids.device)
    if not generation_config.return_dict_in_generate:
        return sequences
    return CascadeGenerateOutput(
        sequences=sequences, stats=out.stats, sources=out.sources, verifier_logprobs=out.verifier_logprobs
    )


def _checked_call(generation_config):
    """The call's drafter (`assistant_model`, which transformers keeps to itself), after refusing what the
    loop cannot honour among the arguments and settings transformers handled without us."""
    if generation_config is None:
        raise GenerationSettingError(
            "cascade_generate is called by transformers: model.generate(**inputs, custom_generate=cascade_generate, "
            "assistant_model=drafter, rule=..., alpha=...); to call specroute's loop directly use "
            "router.decoding.generate"
        )
    call = caller_arguments()  # what transformers kept to itself: the drafter, a streamer, negative prompts
    refuse_arguments(call)
    refuse_settings(generation_config, call)
    if call.get("assistant_model") is None:
        raise GenerationSettingError(
            "cascade_generate decodes a drafter/verifier pair: pass assistant_model=<the drafter> to "
            "verifier.generate(..., custom_generate=cascade_generate)"
        )
    return call["assistant_model"]


def resolve_policy(rule):
    """A rule name, a router folder (str or Path), a loaded router or any deferral policy."""
    from router.model import load_router
    from router.rules import rule_names

    if isinstance(rule, (str, Path)) and str(rule) not in rule_names() and Path(rule).is_dir():
        return load_router(rule)
    if isinstance(rule, Path) or (isinstance(rule, str) and rule not in rule_names() and _looks_like_path(rule)):
        raise GenerationSettingError(
            f"no router folder {rule} (and it is not a rule name): pass an exported router folder "
            f"(config.json + model.safetensors) or one of the rules {', '.join(rule_names())}"
        )
    return rule


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.startswith((".", "~")) or text.endswith((".json", ".safetensors"))


def _alpha(policy, alpha: float | None) -> float:
    from router.rules import resolve_rule

    policy = resolve_rule(policy)
    if alpha is not None:
        return policy.check_alpha(alpha)
    if getattr(policy, "alpha_range", ()) is None:  # a fixed target (lossless): alpha unused
        return 0.0
    raise GenerationSettingError(
        f"{policy.name} needs alpha=... (its trade-off knob: `specroute rules` lists each rule's range; a router's "
        f"alpha is a threshold on its predicted gap, eval's report.md lists those matched to rejection rates)"
    )


def _seed(seed: int | None) -> int:
    """The sampler's seed: given, or drawn from torch's global generator (torch.manual_seed governs it)."""
    if seed is None:
        return int(torch.randint(0, 2**62, ()).item())
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise GenerationSettingError(
            f"seed must be an integer in [0, 2**63), got {seed!r}: pass seed=0 (or leave it out)"
        )
    return seed


def _attention_mask(model_kwargs: dict, input_ids: torch.Tensor) -> torch.Tensor | None:
    """The prompt's attention mask (transformers drops an all-ones mask: None then); a prefilled
    cache is refused (the loop prefills its own, both models' caches in step)."""
    cache = model_kwargs.get("cache") or model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise GenerationSettingError(
            "a prefilled KV cache cannot be continued: specroute keeps the drafter's and the verifier's caches "
            "in step itself; pass the whole prompt (for a shared prefix see router.loop.prefix.SharedPrefix)"
        )
    mask = model_kwargs.get("attention_mask")
    return None if mask is None else mask.to(input_ids.device).long()


def _check_eos(model, generation_config) -> None:
    """The loop stops at the model's EOS ids; a call asking for other ones is refused."""
    from router.loop.common import eos_ids

    asked = generation_config.eos_token_id
    asked = set(asked if isinstance(asked, (list, tuple)) else [] if asked is None else [asked])
    if asked and asked != eos_ids(model):
        raise GenerationSettingError(
            f"eos_token_id={sorted(asked)} differs from the model's {sorted(eos_ids(model))}: specroute stops at the "
            f"model's own end tokens (set model.generation_config.eos_token_id and the drafter's alike)"
        )


def _stop_strings(stop_strings):
    from router.tasks.prompts import StopStrings

    if stop_strings is None or isinstance(stop_strings, StopStrings):
        return stop_strings
    raise GenerationSettingError(
        "in process, transformers does not hand tokenizer= to a custom generation function, so give the stop "
        "strings built with it: stop_strings=router.tasks.prompts.StopStrings.build(tokenizer, [...]) (an exported "
        "router folder as custom_generate takes stop_strings=[...] with tokenizer=, as transformers does)"
    )
