"""DecodeOptions: every decoding knob in one object, with one default and one check each.

`router.decoding.generate` builds one from its keywords; eval's config inherits its fields (so a
YAML file or a `key=value` override sets them by the same names); `specroute generate`, the demo
and the benchmarks get their command-line flags and help from the fields (`add_decode_flags`).
Temperature 0 is greedy; temperature and top-p shape the *scaled* distributions tokens are drawn
from, while deferral decisions read the raw (temperature-1) ones.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import torch

from router.infra.config import ConfigError
from router.sampling import process_logits

# where a whole accepted block's bonus token comes from: the policy's pi there ("target", exact: one
# more drafter forward where the policy's target reads q) or the verifier's p ("verifier")
BONUS_FROM = ("target", "verifier")


def _help(text: str, **meta) -> dict:
    return {"help": text, **meta}


@dataclass
class DecodeOptions:
    """How a speculative cascade decodes: sampling, length, stops, block size and bonus token."""

    temperature: float = field(
        default=0.0, metadata=_help("0 = greedy (so is anything below 1e-4); > 0 samples from the scaled distributions")
    )
    top_p: float = field(default=1.0, metadata=_help("nucleus sampling mass in (0, 1]"))
    seed: int = field(default=0, metadata=_help("seed of the sampler's generator"))
    max_new_tokens: int = field(default=64, metadata=_help("new tokens per row at most"))
    stop: list | None = field(
        default=None,
        metadata=_help(
            "texts that end a row like EOS (Python escapes such as \\n work on the command line); eval: null takes "
            "the prompt format's (few-shot GSM8K: a blank line); on the command line repeat --stop TEXT",
            flag_action="append",
        ),
    )
    gamma: int | str = field(
        default=4,
        metadata=_help(
            "drafts per block, or auto: chosen each block from the pair's measured costs on this machine and the "
            "acceptance so far (router/machine/calibrate.py)"
        ),
    )
    draft_stop: float | None = field(
        default=None,
        metadata=_help(
            "end a block once the drafter's probability of its draft is below this in every row (in (0, 1); "
            "default: never)"
        ),
    )
    bonus_from: str = field(
        default="verifier",
        metadata=_help(
            "a whole accepted block's bonus token: from the verifier's p (verifier: no extra drafter forward) or from "
            "the policy's pi (target: exact, one more drafter forward for policies whose target reads q)",
            choices=BONUS_FROM,
        ),
    )

    def __post_init__(self):
        check_decode_options(self)

    def probs(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw, scaled) probabilities (..., V) from logits (..., V)."""
        return process_logits(logits, self.temperature, self.top_p)

    def generator(self, device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed)

    def sampling_kwargs(self) -> dict:
        """The keywords every loop takes, the baselines included (`router.loop.baselines`)."""
        return {name: getattr(self, name) for name in SAMPLING_FIELDS}

    def generate_kwargs(self) -> dict:
        """Keywords of `router.decoding.generate` (stop strings need a tokenizer: `StopStrings.build`)."""
        return {name: getattr(self, name) for name in DECODE_FIELDS if name != "stop"}


DECODE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DecodeOptions))
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "max_new_tokens")


MAX_BLOCK = 128  # gamma: beyond this a block's verifier pass and counters outgrow any use


def check_decode_options(o) -> None:
    """The one check of every decoding knob, on any object holding DecodeOptions' fields."""
    if isinstance(o.max_new_tokens, bool) or not isinstance(o.max_new_tokens, int) or o.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {o.max_new_tokens!r}")
    for name in ("temperature", "top_p"):
        value = getattr(o, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not o.temperature >= 0 or not 0 < o.top_p <= 1:  # NaN fails both
        raise ConfigError(f"temperature must be >= 0 (got {o.temperature}) and top_p in (0, 1] (got {o.top_p})")
    if isinstance(o.seed, bool) or not isinstance(o.seed, int) or not 0 <= o.seed < 2**63:
        raise ConfigError(f"seed must be an integer in [0, 2**63), got {o.seed!r}")
    if o.gamma != "auto" and (isinstance(o.gamma, (str, bool, float)) or not 1 <= o.gamma <= MAX_BLOCK):
        raise ConfigError(
            f"gamma must be an integer from 1 to {MAX_BLOCK} (drafts per block, scored in one verifier pass) or auto, "
            f"got {o.gamma!r}"
        )
    if o.draft_stop is not None and not 0 < o.draft_stop < 1:
        raise ConfigError(f"draft_stop must be in (0, 1) (a drafter probability) or null, got {o.draft_stop}")
    if o.bonus_from not in BONUS_FROM:
        raise ConfigError(f"bonus_from must be one of {', '.join(BONUS_FROM)}, got {o.bonus_from!r}")
    if o.stop is not None and (isinstance(o.stop, str) or any(not isinstance(s, str) or not s for s in o.stop)):
        raise ConfigError(f"stop must be a list of non-empty texts (e.g. ['\\n\\n']) or null, got {o.stop!r}")


def _gamma_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"gamma must be an integer from 1 to {MAX_BLOCK} or auto, got {text!r}"
        ) from None


def _unescape(text: str) -> str:
    """'\\n' typed in a shell is a newline."""
    import codecs

    return codecs.decode(text, "unicode_escape")


_FLAG_TYPES = {
    "temperature": float,
    "top_p": float,
    "seed": int,
    "max_new_tokens": int,
    "gamma": _gamma_arg,
    "draft_stop": float,
    "bonus_from": str,
    "stop": _unescape,
}


def add_decode_flags(
    parser: argparse.ArgumentParser, defaults: DecodeOptions | None = None, only: tuple[str, ...] = DECODE_FIELDS
) -> None:
    """`--temperature`, `--top-p`, ... from DecodeOptions' fields: their help, types and defaults.
    defaults=None leaves every flag unset (None) so a caller's own defaults (a preset) apply."""
    for f in dataclasses.fields(DecodeOptions):
        if f.name not in only:
            continue
        meta = f.metadata
        kwargs = {
            "type": _FLAG_TYPES[f.name],
            "help": meta["help"],
            "default": None if defaults is None else getattr(defaults, f.name),
        }
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
        if "flag_action" in meta:
            kwargs.update(action=meta["flag_action"], metavar="TEXT")
        if kwargs["default"] is not None:
            kwargs["help"] += f" (default: {kwargs['default']})"
        parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def options_from_flags(args: argparse.Namespace, base: DecodeOptions | None = None) -> DecodeOptions:
    """DecodeOptions from parsed flags; flags left unset (None) keep `base`'s values."""
    base = base or DecodeOptions()
    given = {name: value for name, value in vars(args).items() if name in DECODE_FIELDS and value is not None}
    return dataclasses.replace(base, **given)
