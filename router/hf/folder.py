"""An exported router folder is also a Hugging Face `custom_generate` folder.

    verifier.generate(**inputs, assistant_model=drafter, custom_generate="runs/demo/routers/mlp",
                      trust_remote_code=True, alpha=0.2, max_new_tokens=64)

`router.export.custom_generate` adds `custom_generate/generate.py` (and a requirements.txt naming
specroute) to every export. transformers copies that file into its modules cache and calls its `generate` with
every argument of the call but `custom_generate` itself, so the function does not know where its
weights are. It finds them where transformers keeps the value: the `custom_generate` argument of the
`generate` call it was loaded from (a local folder, or a Hub id resolved through huggingface_hub's
cache). `router=<folder or loaded router>` given in the call overrides that. Then the call goes back
through transformers with `router.hf.cascade_generate`, so both routes share one implementation.
"""

from __future__ import annotations

import os
from pathlib import Path

from router.hf.settings import GenerationSettingError, generate_calls, refuse_arguments


def folder_generate(
    model,
    *args,
    router=None,
    assistant_model=None,
    stop_strings=None,
    tokenizer=None,
    streamer=None,
    negative_prompt_ids=None,
    negative_prompt_attention_mask=None,
    **kwargs,
):
    """What an exported folder's generate.py runs: the router of this call, then cascade_generate."""
    from router.hf.generate import cascade_generate, resolve_policy

    if assistant_model is None:
        raise GenerationSettingError(
            "a specroute router decodes a drafter/verifier pair: pass assistant_model=<the drafter> to "
            "verifier.generate(..., custom_generate=<router folder>, trust_remote_code=True)"
        )
    refuse_arguments(
        {
            "streamer": streamer,
            "negative_prompt_ids": negative_prompt_ids,
            "negative_prompt_attention_mask": negative_prompt_attention_mask,
        }
    )
    # top_k and the other settings it does not apply are refused by cascade_generate, from the lists both
    # routes share (router/hf/settings.py)
    policy = resolve_policy(router if router is not None else router_folder())
    stop = None
    if stop_strings:
        from router.tasks.prompts import StopStrings

        if tokenizer is None:
            raise GenerationSettingError("stop_strings needs tokenizer=<the tokenizer>, as in transformers")
        stop = StopStrings.build(tokenizer, [stop_strings] if isinstance(stop_strings, str) else list(stop_strings))
    return model.generate(
        *args,
        custom_generate=cascade_generate,
        assistant_model=assistant_model,
        rule=policy,
        stop_strings=stop,
        **kwargs,
    )


def router_folder() -> Path:
    """The router folder of the `generate(..., custom_generate=X)` call on the stack: X itself when it
    is a local folder, else the Hub snapshot of X (huggingface_hub's cache; no download when cached)."""
    for call in generate_calls():
        if isinstance(call["custom_generate"], (str, os.PathLike)):
            from router.export.hub import local_folder

            return local_folder(str(call["custom_generate"]))
    raise GenerationSettingError(
        "could not tell which router folder this custom_generate call came from (a transformers version "
        "whose generate() no longer names it custom_generate?): pass router=<the router folder> as well"
    )
