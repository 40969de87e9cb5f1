"""`specroute gen`'s configuration: GenConfig, every field settable in YAML or as `key=value`,
checked once when it is built (docs/reference.md lists them all)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.backends import DEFAULT_ENGINE
from router.infra.config import ConfigError, check_minimum
from router.machine.hardware import DTYPE_CHOICES
from router.pair import check_engine
from router.records import RECORD_MODES
from router.tasks.metrics import check_metric_settings

MODES = RECORD_MODES


@dataclass
class GenConfig:
    """What to record. Every field can be set in YAML or as a `key=value` override."""

    task: str = "gsm8k"  # built-in task name, or "custom" with data_path
    data_path: str | None = None  # custom: local jsonl/csv/parquet or a datasets name
    prompt_field: str = "prompt"  # custom: column holding the prompt
    reference_field: str = "reference"  # custom: column holding the gold continuation
    id_field: str | None = None  # custom: column holding a stable example id
    drafter: str = "embedded:drafter"  # model spec (hub id, folder, .gguf, embedded:*, tiny:*)
    verifier: str = "embedded:verifier"
    dtype: str = "auto"  # auto (bf16 where native, else float32), float32, bfloat16, float16
    device: str = "cpu"  # cpu, cuda, cuda:1, ...
    engine: str = DEFAULT_ENGINE  # torch (transformers) | llamacpp (the GGUF files in llama.cpp, on the CPU:
    #   docs/usage.md); router.backends.ENGINES lists them
    threads: int = 0  # llamacpp: threads per model (0: the physical cores, 1 when the machine is loaded)
    verifier_device_map: str | None = None  # e.g. auto: the verifier spread over the GPUs (accelerate)
    chat: bool = False  # prompt = chat template around the bare question
    max_examples: int | None = None  # first N examples of the task (None = all)
    split_fractions: list = field(default_factory=lambda: [0.7, 0.15, 0.15])  # train/validation/test
    seed: int = 0
    modes: list = field(default_factory=lambda: ["gold"])  # gold, rollout and/or consequence
    rollout_temperature: float = 1.0
    rollout_max_new_tokens: int = 128
    max_continuation_tokens: int = 256  # gold continuations are cut to this many tokens
    max_prompt_tokens: int | None = None  # None: the models' context minus the continuation
    long_prompts: str = "truncate"  # truncate (from the left, counted) or skip
    top_k: int = 8
    hidden_states: str = "none"  # none, drafter, verifier or both (stored as float16)
    judge: bool = False  # the verifier's view of the drafted tokens (judge routers; +1 verifier pass)
    window: int = 0  # > 0: window inputs (data_gen/window.py): at each mismatch the drafter's greedy W tokens
    # after its argmax and the verifier's scores of them (window policies; W drafter passes + 1 verifier pass)
    # consequence mode (data_gen/consequence.py): the verifier's greedy answer, and at each drafter/verifier
    # mismatch along it (up to consequence_max_mismatches per example) a branch the verifier finishes
    consequence_max_new_tokens: int = 256  # answer budget (branches included)
    consequence_max_mismatches: int = 8  # branches per example; later mismatches stay untested (0 with
    # consequence_horizon > 0: no branches, short-horizon labels only -- the cheap labelling at scale)
    consequence_batch_size: int = 4  # branches (and answers) decoded per batch
    consequence_lookup: int = 4  # branches decoded with drafts looked up in their answer, this many
    # per verifier pass (router.loop.lookup; same tokens); 0: one token per pass
    consequence_rejoin: int = 0  # > 0: a branch stops once it repeats this many consecutive tokens of the
    # answer it left, the answer's remainder spliced on (data_gen/rejoin.py; cheaper, approximate); 0: decode to the end
    consequence_horizon: int = 0  # > 0: also a short-horizon score of every mismatch (data_gen/horizon.py,
    # SelfJudge's likelihood difference over this many tokens; column horizon_score), tested or not
    labels_from: str | None = None  # consequence: a label file (`specroute labels export`) whose examples are
    # replayed (their stored answers teacher-forced, no search); the others are searched (data_gen/label_store.py)
    metric: str | None = None  # consequence: the task metric judging answers (default: the task's)
    sandbox: str = "auto"  # consequence on code tasks: where generated programs run
    stop: list | None = None  # consequence: stop strings (default: the prompt format's)
    batch_size: int = 4
    examples_per_shard: int = 32
    output: str = "runs/records/gsm8k"
    overwrite: bool = False

    def __post_init__(self):
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.long_prompts not in ("truncate", "skip"):
            raise ValueError(f"long_prompts must be 'truncate' or 'skip', got {self.long_prompts!r}")
        if self.hidden_states not in ("none", "drafter", "verifier", "both"):
            raise ValueError(f"hidden_states must be none, drafter, verifier or both, got {self.hidden_states!r}")
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"modes must be a non-empty subset of [{', '.join(MODES)}], got {self.modes}")
        if len(self.split_fractions) != 3 or abs(sum(self.split_fractions) - 1) > 1e-6 or min(self.split_fractions) < 0:
            raise ValueError(f"split_fractions must be 3 non-negative numbers summing to 1, got {self.split_fractions}")
        check_minimum(
            self,
            1,
            "top_k",
            "batch_size",
            "examples_per_shard",
            "max_continuation_tokens",
            "rollout_max_new_tokens",
            "consequence_max_new_tokens",
            "consequence_batch_size",
        )
        check_minimum(self, 1, "max_examples", "max_prompt_tokens", allow_none=True)
        check_minimum(
            self,
            0,
            "rollout_temperature",
            "consequence_lookup",
            "consequence_horizon",
            "consequence_max_mismatches",
            "consequence_rejoin",
            "window",
        )
        if "consequence" in self.modes and not self.consequence_max_mismatches and not self.consequence_horizon:
            raise ValueError(
                "consequence_max_mismatches is 0 and consequence_horizon is 0: the consequence mode would label "
                "nothing; set consequence_max_mismatches >= 1 (full-answer labels) or consequence_horizon > 0 "
                "(short-horizon labels only)"
            )
        if self.task == "custom" and not self.data_path:
            raise ValueError("task 'custom' needs data_path (a jsonl/csv/parquet file or a datasets name)")
        check_task_settings(self.task, self.metric, self.sandbox, self.device)
        check_engine(self.engine, self.threads, self.device, self.verifier_device_map)


def check_task_settings(task: str, metric: str | None, sandbox: str, device: str) -> None:
    """The task, metric, sandbox and device named in a config exist (checked before any model loads)."""
    from data_gen.tasks import TASKS

    if task != "custom" and task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)} or custom (with data_path), got {task!r}")
    check_metric_settings(metric, sandbox, device)
