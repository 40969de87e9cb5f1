"""`specroute eval`'s configuration: EvalConfig, every field settable in YAML or as `key=value`,
checked once when it is built (docs/reference.md lists them all)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.backends import DEFAULT_ENGINE, bridge, get_engine
from router.loop.options import DecodeOptions
from router.infra.config import ConfigError, check_listed_once, check_minimum, check_numbers
from router.machine.hardware import DTYPE_CHOICES
from router.pair import check_engine
from router.records import RECORD_MODES
from router.tasks.metrics import check_metric_settings


@dataclass
class EvalConfig(DecodeOptions):
    """What to evaluate. Every field can be set in YAML or as a `key=value` override; the decoding
    knobs (temperature, top_p, seed, max_new_tokens, stop, gamma, draft_stop, bonus_from) are
    DecodeOptions' (router/loop/options.py: their defaults, help and checks). eval: stop null takes
    the prompt format's; gamma auto is chosen once per run from the pair's measured costs and the
    records' acceptance rate (gamma.json)."""

    name: str = "eval"
    records: list = field(default_factory=lambda: ["runs/records/gsm8k"])  # their test split is held out
    routers: list = field(default_factory=list)  # router folders (specroute train outputs)
    offline: bool = True
    online: bool = True
    online_methods: list | None = None  # default: every plug-in rule, every router, the baselines
    alphas: dict = field(default_factory=dict)  # per-method online alpha grids, e.g. {opt: [0, 0.5]}
    gammas: dict = field(default_factory=dict)  # per-method block sizes, e.g. {fly: 15} (FLy's spd_k); the
    #   others decode with gamma (a window rule needs gamma >= its min_gamma: `specroute rules`)
    # online alphas: where each method's offline rejection is closest to these fractions of the verifier's
    # own (lossless) rejection, in the view the decoding uses: greedy (temperature 0: drafts are argmaxes,
    # rejected where they differ from the verifier's) or temperature 1 (rejection TV(q, pi))
    online_rejection_targets: list = field(default_factory=lambda: [0.25, 0.5, 0.75])
    records_mode: str = "gold"  # the record rows offline views and alpha matching read: gold, rollout, or consequence
    #   (answer-level records: the verifier's own greedy answers, what greedy online decoding meets)
    match_split: str = "validation"  # the records' split those offline rejections are read on: validation, so
    #   alphas are not chosen on the test examples results are reported on (`test`: runs before 2026-12-03)
    paired_with: list = field(default_factory=list)  # online methods every point is also paired with, prompt by
    #   prompt (e.g. [judge, token_v2]); the verifier always is
    max_prompts: int = 10  # held-out prompts: the records' test examples, then (when more are asked)
    unrecorded_prompts: bool = True  #   the task's further examples its split rule puts in test
    prompts: str | None = None  # or a prompts file (JSON lines; `specroute prompts` writes the task's examples the
    #   records did not record, any split): decoded instead, refused where one is in a train/validation split
    batch_size: int = 1  # prompts per decoding call (1: per-prompt latency, as served)
    drafter: str | None = None  # default: the records' drafter
    verifier: str | None = None  # default: the records' verifier
    dtype: str = "auto"  # auto (bf16 where native, else float32), float32, bfloat16, float16
    device: str = "cpu"
    engine: str = DEFAULT_ENGINE  # torch (transformers) | llamacpp (GGUF files in llama.cpp, on the CPU) | vllm (the
    #   plugin in vLLM's engine, from .venv-vllm: the grid decoded where it is served; docs/usage.md)
    threads: int = 0  # llamacpp: threads per model (0: the physical cores, 1 when the machine is loaded)
    verifier_device_map: str | None = None  # e.g. auto: the verifier spread over the GPUs (accelerate)
    cost_ratio: float | None = None  # drafter/verifier seconds per token; default measured
    bootstrap: int = 1000  # replicates (over test examples) of the offline views' intervals
    metric: str | None = None  # default: the task's metric
    sandbox: str = "auto"  # code tasks: auto/bwrap (isolated; refused without bubblewrap) or python
    logger: str = "csv"  # csv | wandb
    wandb_project: str = "specroute"
    output: str = "runs/eval/eval"

    def __post_init__(self):
        if not self.records:
            raise ConfigError("records is empty: name the record folder(s) to evaluate on")
        check_listed_once("records", self.records)
        super().__post_init__()  # the decoding knobs' one check
        check_minimum(self, 1, "max_prompts", "batch_size", "bootstrap")
        if self.records_mode not in RECORD_MODES:
            raise ConfigError(
                f"records_mode is which rows of the records eval reads: {', '.join(RECORD_MODES)}; got {self.records_mode!r}"
            )
        if self.match_split not in ("validation", "test", "train"):
            raise ConfigError(
                f"match_split is the records' split online alphas are matched on: validation (default), test or "
                f"train; got {self.match_split!r}"
            )
        check_numbers("online_rejection_targets", self.online_rejection_targets, what=" in (0, 1], e.g. [0.5]")
        for method, grid in self.alphas.items():
            if not isinstance(grid, list) or not grid:
                raise ConfigError(
                    f"alphas.{method} must be a list of alphas, e.g. 'alphas={{{method}: [{grid!r}]}}'; got {grid!r}"
                )
            check_numbers(f"alphas.{method}", grid)
        if not all(0 < t <= 1 for t in self.online_rejection_targets):
            raise ConfigError(
                f"online_rejection_targets are fractions of the verifier's own rejection rate, each in (0, 1]; "
                f"got {self.online_rejection_targets}"
            )
        bad = {m: g for m, g in self.gammas.items() if isinstance(g, bool) or not isinstance(g, int) or g < 1}
        if bad:
            raise ConfigError(f"gammas are per-method block sizes, each an integer >= 1; got {bad}")
        if self.cost_ratio is not None and not self.cost_ratio > 0:
            raise ConfigError(f"cost_ratio (drafter/verifier seconds per token) must be > 0, got {self.cost_ratio}")
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        check_engine(self.engine, self.threads, self.device, self.verifier_device_map, served=True)
        if not get_engine(self.engine).loop:  # a served engine's own loop: what it can run, said before loading
            bridge(self.engine).check_options(self)
        check_metric_settings(self.metric, self.sandbox, self.device)
        if self.logger not in ("csv", "wandb"):
            raise ConfigError(f"logger must be csv or wandb, got {self.logger!r}")
