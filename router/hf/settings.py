"""Hugging Face generation settings -> specroute's DecodeOptions, refusing what the loop cannot do.

transformers merges a call's keywords, the model's `generation_config` and its global defaults into
one GenerationConfig and builds the logits processors and stopping criteria from it before it calls a
custom generation function. specroute's loop samples from the temperature / top-p distribution and
stops at EOS, the length limit or stop strings; anything else (beam search, repetition penalties,
min_new_tokens, an explicit top_k, output_scores, a streamer, ...) would be silently ignored, so it
is refused here with the setting that asked for it and the fix.
"""

from __future__ import annotations

from transformers import GenerationConfig

# transformers applies top_k=50 to every sampled call where neither the call nor the model sets it
# (GenerationConfig._get_default_generation_params); specroute does not truncate to top-k, and an
# implicit default is not a request, so it alone is let through
DEFAULT_TOP_K = GenerationConfig._get_default_generation_params()["top_k"]
ALLOWED_PROCESSORS = ("TemperatureLogitsWarper", "TopPLogitsWarper")  # read from the config instead
ALLOWED_STOPPING = ("MaxLengthCriteria", "EosTokenCriteria")  # the loop's own EOS and length limit
# the setting behind a processor or criterion, for the error message
SETTING_OF = {
    "TopKLogitsWarper": "top_k",
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "MinLengthLogitsProcessor": "min_length / min_new_tokens",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "MinPLogitsWarper": "min_p",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "MaxTimeCriteria": "max_time",
    "StopStringCriteria": "stop_strings",
}
NEUTRAL = {"top_k": "0", "repetition_penalty": "1.0", "min_length / min_new_tokens": "0", "no_repeat_ngram_size": "0"}
UNSUPPORTED_FLAGS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


class GenerationSettingError(ValueError):
    """A generation setting specroute's loop cannot honour, with the fix."""


# Arguments of `generate` that transformers handles itself and never hands to a custom generation function:
# the loop would ignore them. Both routes (cascade_generate in process, an exported folder's generate.py)
# refuse them from this one list.
REFUSED_ARGUMENTS = {
    "streamer": "specroute returns whole sequences (a streamer would show only the prompt); decode "
    "out.sequences, or watch tokens arrive with `specroute generate`",
    "negative_prompt_ids": "classifier-free guidance is not part of a speculative cascade",
    "negative_prompt_attention_mask": "classifier-free guidance is not part of a speculative cascade",
}
# transformers' own assisted generation and guidance settings: specroute's rule, alpha and gamma replace them
REFUSED_SETTINGS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "assistant_early_exit",
    "assistant_lookbehind",
    "target_lookbehind",
    "prompt_lookup_num_tokens",
    "max_matching_ngram_size",
    "guidance_scale",
)
# transformers' other generation modes, chosen by a setting: the loop would decode them greedily or by plain
# sampling without a word, so each is refused by the setting that asks for it
MODE_SETTINGS = {
    "penalty_alpha": "contrastive search",
    "dola_layers": "DoLa decoding",
    "num_beam_groups": "group beam search",
    "diversity_penalty": "group beam search",
    "watermarking_config": "watermarking",
}


def refuse_arguments(values: dict) -> None:
    """Refuse any of REFUSED_ARGUMENTS given (not None) in `values`, naming it and the fix."""
    for name, why in REFUSED_ARGUMENTS.items():
        if values.get(name) is not None:
            raise GenerationSettingError(f"{name} is not supported by specroute's decoding loop ({why}): drop {name}")


def refuse_settings(generation_config, call: dict | None = None) -> None:
    """Refuse assisted-generation, guidance and other generation-mode settings the call (or the model's
    generation_config) set to anything but transformers' own defaults (which it merges into every call, asked
    for or not), and a top_k the call or a generation config asked for (`call`: the generate call's arguments)."""
    defaults = GenerationConfig._get_default_generation_params()  # merged into every call: not a request
    for name, mode in MODE_SETTINGS.items():
        value = getattr(generation_config, name, None)
        if value not in (None, defaults.get(name), 0, 1, 0.0) or (name == "dola_layers" and value is not None):
            raise GenerationSettingError(
                f"{name}={value!r} asks for {mode}, which specroute's loop does not do (it decodes greedily or by "
                f"sampling): drop {name} (it may come from the model's generation_config)"
            )
    top_k = explicit_top_k(call or {}, bool(generation_config.do_sample))
    if top_k:
        raise GenerationSettingError(
            f"top_k={top_k} is not applied by specroute's loop, which samples from the temperature / top-p "
            f"distribution: drop top_k or pass its neutral value (top_k=0); it may come from the model's "
            f"generation_config"
        )
    for name in REFUSED_SETTINGS:
        value = getattr(generation_config, name, None)
        if value is not None and value != defaults.get(name) and not (name == "guidance_scale" and value == 1):
            raise GenerationSettingError(
                f"{name}={value!r} configures transformers' own assisted generation or guidance, which specroute's "
                f"loop replaces (rule, alpha, gamma): drop {name} (it may come from the model's generation_config)"
            )


def generate_calls():
    """The arguments of each transformers `generate(..., custom_generate=...)` call on the stack, innermost
    first: transformers keeps some to itself (the drafter, a streamer) or does not say them (the folder a
    custom_generate file was loaded from), so a custom generation function reads them from the call's frame."""
    import inspect

    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "generate" and "custom_generate" in frame.f_locals:
            yield frame.f_locals
        frame = frame.f_back


def caller_arguments() -> dict:
    """REFUSED_ARGUMENTS, `assistant_model` and the keyword arguments as
    given to the transformers `generate` call this custom function runs under (with the model as `self`)."""
    call = next(generate_calls(), {})
    names = (*REFUSED_ARGUMENTS, "assistant_model", "kwargs", "self")
    return {name: call.get(name) for name in names}


def explicit_top_k(call: dict, sampling: bool) -> int | None:
    """A top_k someone asked for: in the call's keywords (always), or in the model's own generation_config when
    sampling (a greedy call reads none of it). transformers' implicit default of 50 is neither; by the time a
    custom function runs the call's `generation_config` is the merged one, so a top_k other than 50 set
    there is refused by its TopKLogitsWarper instead."""
    model = call.get("self")
    sources = [
        (call.get("kwargs") or {}).get("top_k"),
        getattr(getattr(model, "generation_config", None), "top_k", None) if sampling else None,
    ]
    asked = [k for k in sources if k not in (None, 0)]
    return asked[0] if asked else None


# specroute's own spellings of what transformers already names: refused with transformers' name, so one call
# reads the same on both routes and in transformers' own assisted generation
OTHER_SPELLINGS = {
    "drafter": "assistant_model=<the drafter>",
    "stop": "stop_strings=[...] (with tokenizer=<the tokenizer>)",
    "stop_tokenizer": "tokenizer=<the tokenizer> beside stop_strings=[...]",
}


def refuse_other_spellings(values: dict) -> None:
    for name, instead in OTHER_SPELLINGS.items():
        if values.get(name) is not None:
            raise GenerationSettingError(
                f"{name}= is not transformers' name: pass {instead}, as transformers spells it"
            )


def decode_settings(generation_config, logits_processor, stopping_criteria, prompt_len: int) -> dict:
    """temperature, top_p and max_new_tokens for `router.decoding.generate` from what transformers
    prepared; a GenerationSettingError names any setting the loop would otherwise ignore."""
    gc = generation_config
    if (gc.num_beams or 1) > 1 or getattr(gc, "constraints", None) or getattr(gc, "force_words_ids", None):
        raise GenerationSettingError(
            f"beam search (num_beams={gc.num_beams}) and constrained decoding are not speculative cascades: "
            f"specroute decodes greedily (do_sample=False) or by sampling (do_sample=True, temperature, top_p)"
        )
    asked = [flag for flag in UNSUPPORTED_FLAGS if getattr(gc, flag, False)]
    if asked:
        raise GenerationSettingError(
            f"{asked[0]}=True is not available from specroute's loop: it returns sequences (and, with "
            f"return_dict_in_generate=True, its stats, the source of every token and the verifier's "
            f"log-probabilities of them); drop {asked[0]}"
        )
    for step in [*(logits_processor or []), *(stopping_criteria or [])]:
        _check_step(step)
    sampling = bool(gc.do_sample)
    max_new = int(gc.max_length) - prompt_len
    if max_new < 1:
        raise GenerationSettingError(
            f"max_length={gc.max_length} leaves no room after the prompt ({prompt_len} tokens): set max_new_tokens"
        )
    return {
        "temperature": float(gc.temperature) if sampling else 0.0,
        "top_p": float(gc.top_p if gc.top_p is not None else 1.0) if sampling else 1.0,
        "max_new_tokens": max_new,
    }


def _check_step(step) -> None:
    """Refuse a logits processor or stopping criterion the loop does not implement."""
    kind = type(step).__name__
    if kind in ALLOWED_PROCESSORS or kind in ALLOWED_STOPPING:
        return
    if kind == "TopKLogitsWarper" and step.top_k == DEFAULT_TOP_K:
        return
    setting = SETTING_OF.get(kind)
    if setting == "stop_strings":
        fix = "pass stop_strings to the generate call itself (specroute checks stop strings itself)"
    elif setting in NEUTRAL:
        fix = f"drop {setting} or pass its neutral value ({setting.split(' ')[0]}={NEUTRAL[setting]})"
    elif setting:
        fix = f"drop {setting}"
    else:
        fix = "drop the custom logits_processor / stopping_criteria"
    raise GenerationSettingError(
        f"{kind}{f' (from {setting})' if setting else ''} is not supported by specroute's decoding loop, "
        f"which samples from the temperature / top-p distribution and stops at EOS, max_new_tokens or stop "
        f"strings: {fix}; the setting may come from the model's generation_config"
    )
