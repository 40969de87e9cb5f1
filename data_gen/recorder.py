"""The recorder: the models and counters of one `specroute gen` run, and how one batch of
examples becomes record rows (gold mode: the teacher-forced gold continuation; rollout mode: a
drafter sample; consequence mode: the verifier's answer searched at each mismatch), scored by both
models (data_gen/scoring.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from data_gen.config import GenConfig
from data_gen.consequence import ConsequenceSearch, Searched, consequence_columns, untested_columns
from data_gen.label_store import LabelStore
from data_gen.scoring import example_seed, score_batch
from data_gen.tasks import Example
from router.loop.baselines import generate_autoregressive
from router.loop.layout import left_pad, model_device, tokenizer_pad_id
from router.backends import backend_of, get_engine
from router.loop.common import shared_vocab
from router.loop.prefix import SharedPrefix
from router.machine.hardware import DtypeChoice, resolve_dtype
from router.pair import load_pair, same_files
from router.infra import clock
from router.labels import HARMLESS, IMPORTANT, UNTESTED
from router.tasks.metrics import get_metric
from router.tasks.prompts import context_length, default_stops, fit_prompt, prompt_limit, prompt_text


def _dtype(cfg: GenConfig, verifier, how: str) -> DtypeChoice | EngineChoice:
    """What the manifest says the rows were computed in: torch's dtype and why, or llama.cpp's note."""
    note = backend_of(verifier).note(verifier)  # an engine's own note in place of torch's dtype
    if note is not None:
        return EngineChoice(note)
    if how == "loaded":
        return resolve_dtype(cfg.dtype, cfg.device)
    return DtypeChoice(next(verifier.parameters()).dtype, how)


class EngineChoice(NamedTuple):
    """DtypeChoice's place on an engine that runs its files' own weight types (its backend's `note`)."""

    note: dict

    @property
    def name(self) -> str:
        return self.note["dtype"]

    def as_dict(self) -> dict:
        return dict(self.note)


class Recorder:
    """Holds the models and counters for one `specroute gen` run."""

    def __init__(self, cfg: GenConfig, drafter=None, verifier=None, tokenizer=None):
        self.cfg = cfg
        if drafter is None:
            drafter, verifier, tokenizer = load_pair(
                cfg.drafter, cfg.verifier, cfg.dtype, cfg.device, cfg.verifier_device_map, cfg.engine, cfg.threads
            )
            self.dtype = _dtype(cfg, verifier, "loaded")
        else:
            self.dtype = _dtype(cfg, verifier, "models passed in by the caller")
        self.drafter, self.verifier, self.tok = drafter, verifier, tokenizer
        self.vocab = shared_vocab(drafter, verifier)
        if cfg.top_k > self.vocab:
            raise ValueError(
                f"top_k {cfg.top_k} is above the models' vocabulary ({self.vocab} tokens): use top_k <= {self.vocab}"
            )
        self.pad_id = tokenizer_pad_id(tokenizer)
        self.context = context_length(drafter, verifier)
        self.counts = dict(
            truncated_prompts=0, skipped_long=0, skipped_empty=0, cut_continuations=0, judge_tree_tokens=0
        )  # tokens of the judge's extra verifier pass (data_gen/judge.py)
        self.prefix = None  # the prompts' shared prefix, set by share_prefix
        self.search = None  # consequence mode's search, made by share_prefix (it reads the prefix's cache)
        self.store = None  # labels_from: stored searches replayed instead of searched
        if "consequence" in cfg.modes:  # checked before any decoding: a task without a metric is refused now
            self.metric = get_metric(cfg.task, cfg.metric, cfg.sandbox)
            self.stops = default_stops(cfg.task, cfg.chat) if cfg.stop is None else list(cfg.stop)
            if cfg.labels_from:
                self.store = LabelStore(cfg.labels_from)
                own = get_engine(backend_of(verifier).name).own_weights  # fingerprints of its files, not of torch's
                other_engine = own and same_files(cfg.drafter) and same_files(cfg.verifier)
                self.store.check(cfg, (drafter, verifier, tokenizer), other_engine_ok=other_engine)

    def share_prefix(self, examples: list[Example]) -> None:
        """Find the prompt prefix every example shares (a few-shot context): it is prefilled once
        per model (`router.loop.prefix`) instead of once per batch."""
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
                c.consequence_rejoin,
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
        device = model_device(self.drafter)
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
        return out.new_tokens()

    def consequence(self, batch: list[Example], prompts: list[list[int]]) -> list[Searched]:
        """The consequence search over a batch (data_gen/consequence.py), counted in the manifest."""
        counters = ("branch_tokens", "branch_verifier_passes", "rejoined_branches", "spliced_tokens")
        before, started = [getattr(self.search, c) for c in counters], clock.now()
        stored = [self.store.searched(ex.example_id) if self.store else None for ex in batch]
        todo = [i for i, s in enumerate(stored) if s is None]
        found = self.search.run([prompts[i] for i in todo], [batch[i].meta for i in todo]) if todo else []
        self.counts["consequence_seconds"] = self.counts.get("consequence_seconds", 0.0) + clock.now() - started
        for key, was in zip(counters, before):
            if key in ("branch_tokens", "branch_verifier_passes") or self.search.rejoin:  # the manifest's old keys stay
                name = f"consequence_{key}"
                self.counts[name] = self.counts.get(name, 0) + getattr(self.search, key) - was
        for s in found:
            for key, kind in (("important", IMPORTANT), ("harmless", HARMLESS)):
                self.counts[f"consequence_{key}"] = self.counts.get(f"consequence_{key}", 0) + sum(
                    v == kind for v in s.labels.values()
                )
        for i, s in zip(todo, found):
            stored[i] = s
        return stored

    def replayed(self, ex: Example) -> bool:
        """The example's search comes from the label file (labels_from), not from this run."""
        return self.store is not None and ex.example_id in self.store.entries

    def label_columns(self, ex: Example, s: Searched, row: dict) -> dict:
        """A consequence row's label columns: as searched, or as stored (checked against this pass)."""
        if self.replayed(ex):
            return self.store.columns(ex.example_id, row["q_argmax"], self.counts)
        return consequence_columns(s, row["q_argmax"], self.counts)

    def horizon(self, prompt: list[int], ex: Example, s: Searched, row: dict) -> np.ndarray:
        """(n,) the short-horizon score of every mismatch of a searched answer (NaN elsewhere): at a tested
        one, from the verifier's token and continuation as they stood when it was tested (the answer may
        have changed there since: a harmless substitution at it or shortly after it); a replayed example's
        stored scores where they still apply, the rest scored here."""
        from data_gen.horizon import horizon_scores

        started = clock.now()
        out = np.full(len(row["token"]), np.nan, dtype=np.float32)
        at = [t for t in range(len(out)) if row["consequence"][t] in (HARMLESS, IMPORTANT, UNTESTED)]
        if self.replayed(ex):
            stored = self.store.horizon(ex.example_id, row["q_argmax"])
            out[[t for t in at if t in stored]] = [stored[t] for t in at if t in stored]
            at = [t for t in at if t not in stored]
        pairs = [(t, int(row["q_argmax"][t])) for t in at]
        given = {(t, int(row["q_argmax"][t])): s.originals[t] for t in at if t in s.originals}
        if pairs:
            scores = horizon_scores(
                self.verifier,
                prompt,
                s.tokens,
                pairs,
                (self.cfg.consequence_horizon,),
                continuations=given,
                prefix=self.prefix,
            )
            out[at] = scores[:, 0]
        self.counts["horizon_seconds"] = self.counts.get("horizon_seconds", 0.0) + clock.now() - started
        self.counts["horizon_mismatches"] = self.counts.get("horizon_mismatches", 0) + len(pairs)
        return out

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
            window=self.cfg.window,
            rollout=mode == "rollout",
        )
        for b, (ex, row) in enumerate(zip(exs, rows)):
            n = len(row["token"])
            if "consequence" in self.cfg.modes:  # every row of such a folder has the columns (shards mix modes)
                row.update(self.label_columns(ex, searched[b], row) if searched else untested_columns(n))
                if self.cfg.consequence_horizon:
                    row["horizon_score"] = (
                        self.horizon(prompts[b], ex, searched[b], row) if searched else np.full(n, np.nan)
                    )
            if self.cfg.window and mode != "rollout":  # positions whose drafter continuation was written
                self.counts["window_chains"] = self.counts.get("window_chains", 0) + int(
                    np.isfinite(row["window"][:, 0]).sum()
                )
            if self.cfg.judge:  # the argmax and the sample, where each differs from the trajectory's token
                self.counts["judge_tree_tokens"] += int(
                    (row["q_argmax"] != row["token"]).sum() + (row["draft_token"] != row["token"]).sum()
                )
            row.update(example_id=[ex.example_id] * n, task=[self.cfg.task] * n, split=[split] * n, mode=[mode] * n)
        return rows
