"""The recorder: task examples -> token-level record shards + manifest (README, Recording data).

Examples are split deterministically by id (seeded hash), grouped by split into shards of
`examples_per_shard`, and each shard is scored (gold mode: teacher-forced gold continuation;
rollout mode: a drafter sample scored by both models) and written atomically. A rerun skips the
finished shards (resume); a complete folder is left alone unless `overwrite`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data_gen.consequence import (
    ConsequenceSearch,
    Searched,
    consequence_columns,
    label_counts,
    summary_line,
    untested_columns,
)
from data_gen.scoring import example_seed, score_batch
from router.infra import clock
from router.engine.layout import left_pad
from router.engine.prefix import SharedPrefix
from data_gen.tasks import Example, load_task
from router.infra.config import ConfigError, check_minimum, config_to_dict
from router.infra.distributed import barrier, gather, start
from router.engine.baselines import generate_autoregressive
from router.engine.loop import check_pair
from router.features import FEATURE_NAMES, TOKEN_CLASS_NAMES, token_class_table
from router.machine.hardware import DTYPE_CHOICES, DtypeChoice, resolve_dtype
from router.pair import load_pair, model_fingerprint, tokenizer_fingerprint
from router.infra.console import summary_table
from router.infra.files import output_lock, write_bytes
from router.tasks.metrics import get_metric
from router.tasks.prompts import context_length, default_stops, fit_prompt, prompt_limit, prompt_text
from router.records import (
    EXAMPLES,
    HARMLESS,
    HELDOUT,
    IMPORTANT,
    MANIFEST,
    SPLITS,
    TOKEN_CLASSES,
    RecordsError,
    Manifest,
    intact_shard,
    read_manifest,
    rows_to_table,
    write_manifest,
    write_shard,
)


MODES = ("gold", "rollout", "consequence")


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
    # consequence mode (data_gen/consequence.py): the verifier's greedy answer, and at each drafter/verifier
    # mismatch along it (up to consequence_max_mismatches per example) a branch the verifier finishes
    consequence_max_new_tokens: int = 256  # answer budget (branches included)
    consequence_max_mismatches: int = 8  # branches per example; later mismatches stay untested
    consequence_batch_size: int = 4  # branches (and answers) decoded per batch
    consequence_lookup: int = 4  # branches decoded with drafts looked up in their answer, this many
    # per verifier pass (router.engine.lookup; same tokens); 0: one token per pass
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
            "consequence_max_mismatches",
            "consequence_batch_size",
        )
        check_minimum(self, 1, "max_examples", "max_prompt_tokens", allow_none=True)
        check_minimum(self, 0, "rollout_temperature", "consequence_lookup")
        if self.task == "custom" and not self.data_path:
            raise ValueError("task 'custom' needs data_path (a jsonl/csv/parquet file or a datasets name)")


def assign_split(example_id: str, seed: int, fractions) -> str:
    """Deterministic split of an example by a seeded hash of its id."""
    digest = hashlib.sha256(f"split:{seed}:{example_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "little") / 2**64
    edges = np.cumsum(fractions)
    return SPLITS[min(int(np.searchsorted(edges, u, side="right")), 2)]


def plan_shards(examples: list[Example], cfg: GenConfig) -> list[tuple[str, str, list[Example]]]:
    """(file name, split, examples) per shard: grouped by split, in task order."""
    by_split = {s: [] for s in SPLITS}
    for ex in examples:
        by_split[assign_split(ex.example_id, cfg.seed, cfg.split_fractions)].append(ex)
    plan = []
    for split, items in by_split.items():
        for i in range(0, len(items), cfg.examples_per_shard):
            plan.append(
                (f"{split}-{i // cfg.examples_per_shard:05d}.arrow", split, items[i : i + cfg.examples_per_shard])
            )
    return plan


def _load_examples(cfg: GenConfig) -> list[Example]:
    user = (
        dict(
            path=cfg.data_path,
            prompt_field=cfg.prompt_field,
            reference_field=cfg.reference_field,
            id_field=cfg.id_field,
        )
        if cfg.task == "custom"
        else {}
    )
    examples, seen = [], set()
    for ex in load_task(cfg.task, **user):
        if cfg.max_examples is not None and len(examples) >= cfg.max_examples:
            break
        if ex.example_id in seen:
            raise RecordsError(
                f"duplicate example id {ex.example_id!r} in task {cfg.task}: ids must be unique "
                f"(set id_field to a unique column)"
            )
        seen.add(ex.example_id)
        examples.append(ex)
    if not examples:
        raise RecordsError(f"task {cfg.task} yielded no examples")
    return examples


class Recorder:
    """Holds the models and counters for one `specroute gen` run."""

    def __init__(self, cfg: GenConfig, drafter=None, verifier=None, tokenizer=None):
        self.cfg = cfg
        if drafter is None:
            drafter, verifier, tokenizer = load_pair(
                cfg.drafter, cfg.verifier, cfg.dtype, cfg.device, cfg.verifier_device_map
            )
            self.dtype = resolve_dtype(cfg.dtype, cfg.device)
        else:
            self.dtype = DtypeChoice(next(verifier.parameters()).dtype, "models passed in by the caller")
        self.drafter, self.verifier, self.tok = drafter, verifier, tokenizer
        self.vocab = check_pair(drafter, verifier)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.context = context_length(drafter, verifier)
        self.counts = dict(
            truncated_prompts=0, skipped_long=0, skipped_empty=0, cut_continuations=0, judge_tree_tokens=0
        )  # tokens of the judge's extra verifier pass (data_gen/judge.py)
        self.prefix = None  # the prompts' shared prefix, set by share_prefix
        self.search = None  # consequence mode's search, made by share_prefix (it reads the prefix's cache)
        if "consequence" in cfg.modes:  # checked before any decoding: a task without a metric is refused now
            self.metric = get_metric(cfg.task, cfg.metric, cfg.sandbox)
            self.stops = default_stops(cfg.task, cfg.chat) if cfg.stop is None else list(cfg.stop)

    def share_prefix(self, examples: list[Example]) -> None:
        """Find the prompt prefix every example shares (a few-shot context): it is prefilled once
        per model (`router.engine.prefix`) instead of once per batch."""
        prompts = [self.prompt_ids(ex) for ex in examples if ex.prompt.strip() or ex.question.strip()]
        self.prefix = SharedPrefix.common(prompts)
        if "consequence" in self.cfg.modes:
            c = self.cfg
            self.search = ConsequenceSearch(
                self.drafter,
                self.verifier,
                self.tok,
                self.metric,
                self.stops,
                self.vocab,
                self.pad_id,
                c.consequence_max_new_tokens,
                c.consequence_max_mismatches,
                c.consequence_batch_size,
                self.prefix,
                c.consequence_lookup,
            )

    # ---- one example -> token ids -------------------------------------------------------------
    def prompt_ids(self, ex: Example) -> list[int]:
        text = prompt_text(self.tok, ex.prompt, ex.question, self.cfg.chat)
        return self.tok.encode(text, add_special_tokens=False)

    def fit(self, prompt: list[int], cont: list[int]) -> list[int] | None:
        """The prompt cut to fit the context (or None to skip), per `long_prompts`."""
        fitted, cut = fit_prompt(prompt, prompt_limit(self.context, len(cont), self.cfg.max_prompt_tokens))
        if cut and self.cfg.long_prompts == "skip":
            self.counts["skipped_long"] += 1
            return None
        self.counts["truncated_prompts"] += int(cut)
        return fitted

    def prepare(self, ex: Example, mode: str):
        """(prompt ids, gold continuation ids or None for rollout), or None to skip the example."""
        if not ex.prompt.strip() and not ex.question.strip():
            self.counts["skipped_empty"] += 1
            return None
        if mode in ("rollout", "consequence"):  # no gold needed: a model writes the continuation
            budget = self.cfg.rollout_max_new_tokens if mode == "rollout" else self.cfg.consequence_max_new_tokens
            prompt = self.fit(self.prompt_ids(ex), [0] * budget)
            return None if prompt is None else (prompt, None)
        cont = self.tok.encode(ex.reference, add_special_tokens=False) if ex.reference.strip() else []
        if not cont:
            self.counts["skipped_empty"] += 1
            return None
        if len(cont) > self.cfg.max_continuation_tokens:
            self.counts["cut_continuations"] += 1
            cont = cont[: self.cfg.max_continuation_tokens]
        prompt = self.fit(self.prompt_ids(ex), cont)
        return None if prompt is None else (prompt, cont)

    # ---- a batch -> record columns --------------------------------------------------------------
    def rollouts(self, batch: list[Example], prompts: list[list[int]]) -> list[list[int]]:
        """Drafter samples for a batch of prompts (seeded by the batch's first example)."""
        ids, mask = left_pad(prompts, self.pad_id)
        device = next(self.drafter.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        out = generate_autoregressive(
            self.drafter,
            ids,
            temperature=self.cfg.rollout_temperature,
            max_new_tokens=self.cfg.rollout_max_new_tokens,
            attention_mask=mask,
            seed=example_seed(self.cfg.seed, batch[0].example_id, "rollout"),
            role="drafter",
            prefix=self.prefix,
        )
        return [out.sequences[b, ids.shape[1] :][out.sources[b] >= 0].tolist() for b in range(len(prompts))]

    def consequence(self, batch: list[Example], prompts: list[list[int]]) -> list[Searched]:
        """The consequence search over a batch (data_gen/consequence.py), counted in the manifest."""
        before = self.search.branch_tokens, self.search.branch_verifier_passes
        found = self.search.run(prompts, [ex.meta for ex in batch])
        for key, now, was in (
            ("tokens", self.search.branch_tokens, before[0]),
            ("verifier_passes", self.search.branch_verifier_passes, before[1]),
        ):
            self.counts[f"consequence_branch_{key}"] = self.counts.get(f"consequence_branch_{key}", 0) + now - was
        for s in found:
            for key, kind in (("important", IMPORTANT), ("harmless", HARMLESS)):
                self.counts[f"consequence_{key}"] = self.counts.get(f"consequence_{key}", 0) + sum(
                    v == kind for v in s.labels.values()
                )
        return found

    def record_batch(self, batch: list[Example], split: str, mode: str) -> list[dict]:
        pairs = [(ex, self.prepare(ex, mode)) for ex in batch]
        pairs = [(ex, pc) for ex, pc in pairs if pc is not None]
        if not pairs:
            return []
        exs, prompts = [ex for ex, _ in pairs], [pc[0] for _, pc in pairs]
        searched = None
        if mode == "consequence":
            searched = self.consequence(exs, prompts)
            conts = [s.tokens for s in searched]
        else:
            conts = [pc[1] for _, pc in pairs] if mode == "gold" else self.rollouts(exs, prompts)
        keep = [i for i, c in enumerate(conts) if c]
        exs, prompts, conts = [exs[i] for i in keep], [prompts[i] for i in keep], [conts[i] for i in keep]
        searched = [searched[i] for i in keep] if searched else None
        if not exs:
            return []
        rows = score_batch(
            self.drafter,
            self.verifier,
            prompts,
            conts,
            self.vocab,
            self.pad_id,
            self.cfg.top_k,
            self.cfg.hidden_states,
            [example_seed(self.cfg.seed, ex.example_id, mode) for ex in exs],
            judge=self.cfg.judge,
            prefix=self.prefix,
        )
        for b, (ex, row) in enumerate(zip(exs, rows)):
            n = len(row["token"])
            if "consequence" in self.cfg.modes:  # every row of such a folder has the columns (shards mix modes)
                row.update(consequence_columns(searched[b], row["q_argmax"]) if searched else untested_columns(n))
            if self.cfg.judge:  # the argmax and the sample, where each differs from the trajectory's token
                self.counts["judge_tree_tokens"] += int(
                    (row["q_argmax"] != row["token"]).sum() + (row["draft_token"] != row["token"]).sum()
                )
            row.update(example_id=[ex.example_id] * n, task=[self.cfg.task] * n, split=[split] * n, mode=[mode] * n)
        return rows


def _concat(rows: list[dict]) -> dict:
    return {
        k: (sum((r[k] for r in rows), []) if isinstance(rows[0][k], list) else np.concatenate([r[k] for r in rows]))
        for k in rows[0]
    }


def _prepare_folder(out: Path, cfg: GenConfig) -> bool:
    """Create or check the output folder; True when it is already complete (nothing to do)."""
    resolved = {k: v for k, v in config_to_dict(cfg).items() if k != "overwrite"}
    config_path = out / "gen_config.json"
    if cfg.overwrite and out.exists():
        shutil.rmtree(out)
    earlier = _earlier_config(config_path, out)
    if earlier is not None and _grows(earlier, resolved):
        _check_receipts_name_examples(out)
        # more (or fewer) examples of the same recording: finished shards whose examples are unchanged
        # are kept; the manifest is rewritten when the new plan is done
        print(
            f"{out}: max_examples {earlier.get('max_examples')} -> {cfg.max_examples}: recording the "
            f"difference, keeping the finished shards"
        )
        (out / MANIFEST).unlink(missing_ok=True)
        config_path.write_text(json.dumps(resolved, indent=2))
        return False
    changed = config_changes(earlier, resolved) if earlier is not None else []
    if changed:
        state = "a finished" if (out / MANIFEST).exists() else "an unfinished"
        raise ConfigError(
            f"{out} holds {state} recording made with a different config (differs in {changed}): "
            f"rerun with the same config{' to resume' if state == 'an unfinished' else ''}, record "
            f"into another output, or pass overwrite=true"
        )
    if (out / MANIFEST).exists():
        return True
    out.mkdir(parents=True, exist_ok=True)
    if earlier is None:
        config_path.write_text(json.dumps(resolved, indent=2))
    return False


def config_changes(earlier: dict, resolved: dict) -> list[str]:
    """Config keys whose values differ between an earlier recording and this one. A field the
    earlier version did not have counts as its default (a newer version adding an option does not
    make older recordings stale)."""
    now = json.loads(json.dumps(resolved))
    defaults = json.loads(json.dumps(config_to_dict(GenConfig())))
    return sorted(k for k in set(earlier) | set(now) if earlier.get(k, defaults.get(k)) != now.get(k, defaults.get(k)))


def _earlier_config(config_path: Path, out: Path) -> dict | None:
    """The config an earlier run in this folder was made with (None for a new folder)."""
    if not config_path.exists():
        return None
    try:
        return json.loads(config_path.read_text())
    except ValueError:
        raise ConfigError(
            f"{config_path} is not valid JSON: the recording in {out} cannot be checked "
            f"against this config; pass overwrite=true to start it again"
        ) from None


def _check_receipts_name_examples(out: Path) -> None:
    """Growing keeps a shard only when its receipt names its examples (written by this version)."""
    for receipt in out.glob("*.arrow.json"):
        if "examples" not in json.loads(receipt.read_text() or "{}"):
            raise ConfigError(
                f"{out} was recorded before recordings could grow ({receipt.name} does not name its "
                f"examples): record into a new folder, or pass overwrite=true"
            )


def _grows(earlier: dict, resolved: dict) -> bool:
    """True when the configs differ in max_examples only (a recording made larger or smaller)."""
    now = json.loads(json.dumps(resolved))
    other = {k for k in set(earlier) | set(now) if earlier.get(k) != now.get(k)}
    return other == {"max_examples"}


def planned_batches(cfg: GenConfig, recorder: Recorder) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """What `run_gen` will feed the models, without running them: (split, mode, [(prompt tokens
    after the shared prefix, continuation tokens) per example]) per batch, in recording order
    (rollout continuations counted at their maximum length). For time estimates; skipped examples
    are left out as run_gen does."""
    out = []
    examples = _load_examples(cfg)
    recorder.share_prefix(examples)
    shared = len(recorder.prefix) if recorder.prefix is not None else 0  # prefilled once, not per batch
    for _, split, shard_examples in plan_shards(examples, cfg):
        for i in range(0, len(shard_examples), cfg.batch_size):
            for mode in cfg.modes:
                prepared = [recorder.prepare(ex, mode) for ex in shard_examples[i : i + cfg.batch_size]]
                lengths = [
                    (
                        len(p) - shared if shared and p[:shared] == recorder.prefix.ids else len(p),
                        len(c)
                        if c is not None
                        else cfg.rollout_max_new_tokens
                        if mode == "rollout"
                        else cfg.consequence_max_new_tokens,
                    )
                    for p, c in filter(None, prepared)
                ]
                if lengths:
                    out.append((split, mode, lengths))
    return out


def run_gen(cfg: GenConfig, recorder: Recorder | None = None) -> dict:
    """`specroute gen`: holds a lock on cfg.output for the whole run (a second writer is refused)."""
    with output_lock(cfg.output, "gen"):
        return _run_gen(cfg, recorder)


def _run_gen(cfg: GenConfig, recorder: Recorder | None = None) -> dict:
    """Record a task into cfg.output; returns the manifest (and prints a summary). Under torchrun each
    rank records every world-th shard and rank 0 writes the manifest (router/infra/distributed.py)."""
    out = Path(cfg.output)
    ranks = start(cfg.device)
    if _on_main(ranks, lambda: _prepare_folder(out, cfg)):
        barrier()
        manifest = read_manifest(out)
        print(f"{out} is complete (manifest {manifest.id}); nothing to do (overwrite=true to redo)")
        return manifest
    examples = _load_examples(cfg)
    plan = plan_shards(examples, cfg)
    if ranks.main:
        write_examples(out, plan, cfg)
    mine = ranks.mine(plan)  # shard k to rank k mod world: each shard's batches are what one process makes
    recorder = recorder or Recorder(replace(cfg, device=ranks.device(cfg.device)))
    recorder.share_prefix(examples)
    started, tokens_done = clock.now(), 0
    bar = tqdm(total=sum(len(s[2]) for s in mine), desc=f"gen {cfg.task}{_rank_label(ranks)}", unit="ex")
    if recorder.search is not None:  # a consequence search takes minutes per batch: show its rounds
        recorder.search.report = bar.set_postfix_str
    for name, split, shard_examples in mine:
        ids = [ex.example_id for ex in shard_examples]
        if intact_shard(out, name, ids) is not None:  # finished by an earlier run, and unchanged since
            bar.update(len(shard_examples))
            continue
        rows = []
        for i in range(0, len(shard_examples), cfg.batch_size):
            batch = shard_examples[i : i + cfg.batch_size]
            for mode in cfg.modes:
                new_rows = recorder.record_batch(batch, split, mode)
                tokens_done += sum(len(r["token"]) for r in new_rows)
                rows += new_rows
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{tokens_done / (clock.now() - started):.0f}")
        if rows:
            _write_shard_or_explain(out, name, rows, ids)
    bar.close()
    counts = _merged(gather(recorder.counts))  # every rank's, summed; also waits for every rank's shards
    if ranks.main:
        manifest = _finish_manifest(out, cfg, plan, recorder, clock.now() - started, counts)
        print_summary(manifest)
    barrier()
    return read_manifest(out)


def _on_main(ranks, decide):
    """decide() on rank 0, its answer (or its error, raised on every rank) shared with every rank."""
    result = None
    if ranks.main:
        try:
            result = ("ok", decide())
        except (ConfigError, RecordsError, ValueError) as err:
            result = ("error", err)
    kind, value = gather(result)[0]
    if kind == "error":
        raise value
    return value


def _merged(counts: list[dict]) -> dict:
    return {k: sum(c.get(k, 0) for c in counts) for k in dict.fromkeys(k for c in counts for k in c)}


def _rank_label(ranks) -> str:
    return f" (rank {ranks.rank}/{ranks.world})" if ranks.world > 1 else ""


def write_examples(out: Path, plan, cfg: GenConfig) -> None:
    """examples.jsonl: every planned example with its split, prompt, reference and metric fields, and
    heldout.jsonl: the task's other examples that the split rule puts in test, so eval can run
    held-out prompts and score them without importing data_gen (stages meet on disk)."""
    rows = [example_row(ex, split) for _, split, shard_examples in plan for ex in shard_examples]
    recorded = {r["example_id"] for r in rows}
    write_bytes(out / EXAMPLES, _jsonl_bytes(rows))
    write_bytes(out / HELDOUT, _jsonl_bytes(unrecorded_test_examples(vars(cfg), recorded)))


def _jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, default=str) + "\n" for r in rows).encode()


def example_row(ex: Example, split: str) -> dict:
    """An example in the examples-file form (what eval reads back)."""
    return {
        "example_id": ex.example_id,
        "split": split,
        "prompt": ex.prompt,
        "question": ex.question,
        "reference": ex.reference,
        "meta": ex.meta,
    }


def unrecorded_test_examples(config: dict, recorded: set) -> list[dict]:
    """The examples of a recording's task beyond the ones it recorded that its split rule (seeded
    hash of the id) puts in the test split: held out exactly as its test examples are. In task
    order, examples-file form."""
    user = (
        dict(
            path=config["data_path"],
            prompt_field=config["prompt_field"],
            reference_field=config["reference_field"],
            id_field=config["id_field"],
        )
        if config["task"] == "custom"
        else {}
    )
    return [
        json.loads(json.dumps(example_row(ex, "test"), default=str))
        for ex in load_task(config["task"], **user)
        if ex.example_id not in recorded
        and assign_split(ex.example_id, config["seed"], config["split_fractions"]) == "test"
    ]


def write_token_classes(out: Path, tokenizer, vocab: int) -> dict:
    """token_classes.npy: the class bits of every token id (router.features.TOKEN_CLASS_NAMES), which
    judge routers read for the drafted token and carry into their export (decoding has no tokenizer)."""
    import io

    buf = io.BytesIO()
    np.save(buf, token_class_table(tokenizer, vocab))
    write_bytes(out / TOKEN_CLASSES, buf.getvalue())
    return {
        "file": TOKEN_CLASSES,
        "names": list(TOKEN_CLASS_NAMES),
        "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
    }


def _write_shard_or_explain(out: Path, name: str, rows: list[dict], ids: list[str]) -> None:
    try:
        write_shard(out, name, rows_to_table(_concat(rows)), ids)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise RecordsError(
                f"the disk is full while writing {out / name}: free some space and rerun the same "
                f"command; finished shards are kept and the run resumes after them"
            ) from None
        raise


def _finish_manifest(
    out: Path, cfg: GenConfig, plan, recorder: Recorder, seconds: float, counts: dict | None = None
) -> dict:
    """Gather shard statistics, write manifest.json last, return it."""
    import datasets

    shards, stats = [], {"tokens": 0, "agree": 0.0, "q_top1": 0.0, "p_top1": 0.0, "gold_tokens": 0}
    split_examples = {s: 0 for s in SPLITS}
    split_rows = {s: 0 for s in SPLITS}
    consequence: dict = {}
    for name, split, shard_examples in plan:
        receipt = intact_shard(out, name, [ex.example_id for ex in shard_examples])
        if receipt is None:
            continue  # every example of this shard was skipped (the loop above redid any damaged one)
        ds = datasets.Dataset.from_file(str(out / name))
        feats = np.asarray(ds["features"])
        gold = np.asarray(ds["mode"]) == "gold"
        token, qa, pa_ = (np.asarray(ds[c]) for c in ("token", "q_argmax", "p_argmax"))
        stats["tokens"] += len(ds)
        stats["agree"] += float(feats[:, FEATURE_NAMES.index("argmax_agree")].sum())
        stats["gold_tokens"] += int(gold.sum())
        stats["q_top1"] += float((qa == token)[gold].sum())
        stats["p_top1"] += float((pa_ == token)[gold].sum())
        n_ex = len(set(ds["example_id"]))
        shards.append(
            {
                "file": name,
                "split": split,
                "rows": len(ds),
                "examples": n_ex,
                "bytes": receipt["bytes"],
                "sha256": receipt["sha256"],
            }
        )
        split_examples[split] += n_ex
        split_rows[split] += len(ds)
        for key, value in label_counts(ds).items():
            consequence[key] = consequence.get(key, 0) + value
    total_bytes = sum(s["bytes"] for s in shards)
    tokens = max(stats["tokens"], 1)
    manifest = Manifest(
        task=cfg.task,
        modes=list(cfg.modes),
        config=config_to_dict(cfg),
        models={
            "drafter": {
                "spec": cfg.drafter,
                "name": getattr(recorder.drafter, "name_or_path", ""),
                "hash": model_fingerprint(recorder.drafter),
            },
            "verifier": {
                "spec": cfg.verifier,
                "name": getattr(recorder.verifier, "name_or_path", ""),
                "hash": model_fingerprint(recorder.verifier),
                "device_map": cfg.verifier_device_map,
                "placement": _placement(recorder.verifier),
            },
        },
        tokenizer_hash=tokenizer_fingerprint(recorder.tok)[:16],
        vocab=recorder.vocab,
        dtype=recorder.dtype.as_dict(),
        feature_names=list(FEATURE_NAMES),
        top_k=cfg.top_k,
        hidden_states=cfg.hidden_states,
        judge=cfg.judge,
        token_classes=write_token_classes(out, recorder.tok, recorder.vocab),
        splits={s: {"examples": split_examples[s], "rows": split_rows[s]} for s in SPLITS},
        shards=shards,
        tokens=stats["tokens"],
        bytes=total_bytes,
        bytes_per_token=total_bytes / tokens,
        counts=counts if counts is not None else recorder.counts,
        seconds=seconds,
        consequence=consequence or None,
        drafter_verifier_top1_agreement=stats["agree"] / tokens,
        gold_top1_accuracy={
            "drafter": stats["q_top1"] / max(stats["gold_tokens"], 1),
            "verifier": stats["p_top1"] / max(stats["gold_tokens"], 1),
        },
    )
    write_manifest(out, manifest)
    return manifest


def _placement(model) -> dict | str:
    """Where a model's layers live: its accelerate device map, or its one device."""
    placed = getattr(model, "hf_device_map", None)
    return {k: str(v) for k, v in placed.items()} if placed else str(next(model.parameters()).device)


def print_summary(manifest: Manifest) -> None:
    counts = manifest.counts
    if counts["truncated_prompts"] or counts["skipped_long"] or counts["skipped_empty"]:
        warnings.warn(
            f"{counts['truncated_prompts']} prompts truncated from the left, {counts['skipped_long']} "
            f"skipped as too long, {counts['skipped_empty']} skipped for an empty prompt or reference"
        )
    rows = [
        ("task", f"{manifest.task} ({', '.join(manifest.modes)})"),
        ("examples", ", ".join(f"{s} {v['examples']}" for s, v in manifest.splits.items())),
        ("tokens", str(manifest.tokens)),
        ("bytes / token", f"{manifest.bytes_per_token:.0f}"),
        ("drafter/verifier top-1 agreement", f"{manifest.drafter_verifier_top1_agreement:.3f}"),
        (
            "gold top-1 accuracy",
            f"drafter {manifest.gold_top1_accuracy['drafter']:.3f}, "
            f"verifier {manifest.gold_top1_accuracy['verifier']:.3f}",
        ),
        ("seconds", f"{manifest.seconds:.1f}"),
    ]
    if manifest.consequence:
        rows.insert(-1, ("consequence labels", summary_line(manifest.consequence)))
    print("\n" + summary_table(rows))
