"""The demo's presets (how big each stage is) and the routers it trains."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from router.backends import DEFAULT_ENGINE, ENGINES, engine_names, get_engine, installed

ROUTERS = {
    "mlp": {"arch": "mlp"},
    "gru": {"arch": "gru", "window": 4},
    "token": {"arch": "mlp", "head": "token", "target": "token_label"},
    # the verifier's view of the drafted token (its state after reading it and its lookahead)
    "judge": {"arch": "mlp", "head": "judge", "target": "greedy_01_gap", "hidden_inputs": ["after"]},
}


@dataclass
class Preset:
    """How big each stage is."""

    models: dict  # gen config values choosing the pair, dtype and device
    tasks: list
    gold_examples: int  # per task, split 70/15/15 into train/validation/test by id
    rollout_examples: int
    rollout_tokens: int
    max_continuation_tokens: int
    train_epochs: int
    prompts: int  # online prompts per task (held-out test examples)
    new_tokens: int
    online_batch: int  # prompts per decoding call online (every method alike)
    gen_batch: int = 4
    eval_extra: dict = field(default_factory=dict)  # eval config values (decoding options among them)


# gamma=auto: drafts per block chosen from the pair's costs measured on this machine and the records'
# acceptance rate (router/machine/calibrate.py), stored in eval/<task>/gamma.json
PRESETS = {
    "tiny": Preset(
        {
            "drafter": "tiny:drafter",
            "verifier": "tiny:verifier",
            "dtype": "float32",
            "chat": False,
            "max_prompt_tokens": 256,
        },
        ["gsm8k", "mbpp"],
        24,
        4,
        16,
        48,
        3,
        2,
        8,
        2,
        eval_extra={"dtype": "float32", "gamma": "auto"},
    ),
    "cpu": Preset({}, ["gsm8k", "mbpp"], 150, 6, 48, 256, 20, 8, 160, 4, eval_extra={"gamma": "auto"}),
    # the cpu recording and routers, online on 50 held-out prompts per task (the records' test
    # split, then unrecorded examples the split rule puts in test): hours on 2 cores, resumable.
    # gamma stays 5 and the bonus token exact (bonus_from=target): its points were timed so before gamma
    # could be calibrated and before p became the bonus default, and a change would redo hours of
    # finished points (pass gamma=auto / --bonus-from verifier with a fresh output to use them)
    "long": Preset(
        {}, ["gsm8k", "mbpp"], 150, 6, 48, 256, 20, 50, 256, 4, eval_extra={"gamma": 5, "bonus_from": "target"}
    ),
    "gpu": Preset(
        {"device": "cuda"},
        ["gsm8k", "mbpp"],
        1000,
        64,
        128,
        256,
        30,
        32,
        256,
        8,
        gen_batch=16,
        eval_extra={"device": "cuda", "gamma": "auto"},
    ),
}


def with_decoding(p: Preset, **decoding) -> Preset:
    """The preset with the command line's decoding options (DecodeOptions fields) on top of its eval
    values; options left out (None) keep the preset's or the eval's defaults."""
    given = {k: v for k, v in decoding.items() if v is not None}
    return replace(p, eval_extra={**p.eval_extra, **given})


PRICED_PRESETS = ("cpu",)  # presets whose stages are priced on every installed engine under --engine auto
SERVED_GAMMA = 4  # drafts per step in vLLM, which drafts a fixed number (gamma auto calibrates specroute's loop)


def engine_choices() -> tuple[str, ...]:
    """`--engine`'s choices: auto (priced per stage) and every registered engine (router.backends.ENGINES)."""
    return ("auto", *engine_names())


def engine_candidates(preset: str, engine: str) -> tuple[tuple[str, ...], str]:
    """The engines a demo run's stages may use, and why. One when set. Under `auto`: for the cpu preset, torch and
    each other engine installed here (llama-cpp-python; vLLM where the demo runs in the vLLM environment, for
    evaluation only), each stage then running on the engine it is priced faster on here (the GGUF files decode
    several times faster in llama.cpp than in torch float32 on an AVX2 CPU, while torch's bf16 prefill on AMX
    records faster than llama.cpp); torch otherwise (tiny: seconds either way; long: its finished points were
    timed on torch; gpu: llama.cpp runs on the CPU here)."""
    if engine not in engine_choices():
        raise ValueError(f"engine must be one of {', '.join(engine_choices())}, got {engine!r}")
    if engine != "auto":
        return (engine,), "as set (--engine)"
    if preset not in PRICED_PRESETS:
        return (DEFAULT_ENGINE,), f"the {preset} preset runs on {DEFAULT_ENGINE} (--engine to change)"
    others = [e for e in engine_names() if e != DEFAULT_ENGINE]
    found = (DEFAULT_ENGINE, *(e for e in others if installed(e)))
    if found == (DEFAULT_ENGINE,):
        setups = ", ".join(f"`{ENGINES[e].setup}` installs {ENGINES[e].label}" for e in others)
        return found, f"no other engine is installed here ({setups})"
    return found, "each stage on the engine priced faster on this machine (--engine to fix one)"


def recording_engine(engine: str) -> str:
    """The engine a stage candidate records on: vLLM does not hand out the distributions a recording keeps, so a
    demo evaluating in vLLM records on torch."""
    return engine if get_engine(engine).loop else DEFAULT_ENGINE


def with_engines(p: Preset, recording: str, evaluation: str, threads: int = 0) -> Preset:
    """The preset with its records made on `recording` and its online points decoded on `evaluation` (torch,
    llamacpp: the pair's GGUF files in llama.cpp with `threads` threads, 0: chosen from the machine, or vllm: the
    plugin in vLLM's engine, SERVED_GAMMA drafts per step where the preset calibrates gamma). Records made on
    torch decode on llama.cpp: the same weights (eval says so in a note)."""

    def threaded(engine: str) -> dict:
        return {"threads": threads} if get_engine(engine).threads else {}

    models = {**p.models, "engine": recording, **threaded(recording)}
    extra = {**p.eval_extra, "engine": evaluation, **threaded(evaluation)}
    if not get_engine(evaluation).loop:
        extra = _served(extra)
    if recording == evaluation == DEFAULT_ENGINE:  # as before engines existed: finished folders stay current
        return p
    return replace(p, models=models, eval_extra=extra)


def _served(extra: dict) -> dict:
    """Eval values for vLLM: a fixed block size where the preset calibrates gamma; its bonus token is the verifier's."""
    if extra.get("bonus_from", "verifier") != "verifier":
        raise ValueError(
            "this preset decodes with bonus_from=target, which vLLM's loop cannot (its bonus token is the "
            "verifier's): use --engine torch or llamacpp, or --bonus-from verifier with a fresh output"
        )
    return {**extra, "gamma": SERVED_GAMMA if extra.get("gamma", "auto") == "auto" else extra["gamma"]}
