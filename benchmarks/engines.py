"""Recording and labelling on the two engines, side by side: the same examples recorded by `specroute gen` with
the same settings on torch and on llama.cpp.

Stages "prefill" and "decode" time the models alone: the verifier's teacher-forced forward over whole 5-shot
prompts (tokens/s), and its greedy decoding of 48 tokens per row at batch 1 and 4 from the shared prefix (new
tokens/s), each engine twice in ABBA order. Per recording stage (gold: teacher-forced gold continuations, with
judge inputs with --judge; consequence: the verifier's answers searched at each mismatch, with short-horizon
scores), each engine records the same examples twice in ABBA order (torch, llama.cpp, llama.cpp, torch: a drift of the machine falls on both), and the summed times give
examples per second and the ratio llama.cpp / torch. The two engines' records are then compared: the drafter's
and the verifier's argmax at every gold position, the largest feature difference, and (consequence) the answers
and labels of examples both engines answered alike. Prints the CPU, torch's dtype and threads, llama.cpp's
threads and why; writes JSON and CSV.

    python -m benchmarks.engines [--tiny] [--examples 16] [--stages prefill decode gold consequence] [--threads 0]
        [--dtype auto] [--judge] [--horizon 10] [--mismatches 8] [--budget 256] [--out runs/bench/engines]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from data_gen.config import GenConfig
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from router.backends.llamacpp import engine_note
from router.infra.embedded import embedded_installed
from router.machine.hardware import DTYPE_CHOICES, cpu_kind, resolve_dtype
from router.pair import load_pair
from router.labels import HARMLESS, IMPORTANT
from router.records import load_records
from router.tasks import metrics

ORDER = ("torch", "llamacpp", "llamacpp", "torch")  # ABBA
RECORDING = ("gold", "consequence")
DECODE_TOKENS = 48


def task_prompts(tokenizer, task: str, n: int, limit: int | None) -> list[list[int]]:
    """The first n prompts of the task as `specroute gen` builds them (5-shot GSM8K: a shared context)."""
    from data_gen.plan import load_examples
    from router.tasks.prompts import prompt_text

    examples = load_examples(GenConfig(task=task, max_examples=n))
    ids = [
        tokenizer.encode(prompt_text(tokenizer, e.prompt, e.question, False), add_special_tokens=False)
        for e in examples
    ]
    return [p[-limit:] if limit else p for p in ids]


def model_speeds(pairs: dict, prompts: list[list[int]], stage: str) -> list[dict]:
    """Rows of the prefill or decode stage: each measurement on both engines, ABBA, seconds summed."""
    from router.loop.baselines import generate_autoregressive
    from router.loop.layout import left_pad
    from router.loop.common import vocab_size
    from router.loop.prefix import SharedPrefix
    from router.loop.teacher import forward_tail, tail_layout

    prefix = SharedPrefix.common(prompts)
    rows = []
    for batch in (1,) if stage == "prefill" else (1, 4):
        work = {}
        for engine in ORDER:
            pair = pairs[engine]
            pad = pair.tokenizer.pad_token_id or 0
            with torch.inference_mode():
                if stage == "prefill":  # one whole prompt, no prefix: every token fed
                    layout, _, keep = tail_layout([prompts[0][:-1]], [prompts[0][-1:]], pad, "cpu")
                    started = time.perf_counter()
                    forward_tail(pair.verifier, layout, keep, vocab_size(pair.verifier), False)
                    tokens = len(prompts[0])
                else:
                    ids, mask = left_pad(prompts[:batch], pad)
                    go = dict(attention_mask=mask, max_new_tokens=DECODE_TOKENS, prefix=prefix, role="verifier")
                    generate_autoregressive(pair.verifier, ids, **{**go, "max_new_tokens": 2})  # the prefix, once
                    started = time.perf_counter()
                    tokens = generate_autoregressive(pair.verifier, ids, **go).stats["new_tokens"]
            seconds, count = work.get(engine, (0.0, 0))
            work[engine] = (seconds + time.perf_counter() - started, count + tokens)
        per_s = {e: work[e][1] / work[e][0] for e in work}
        rows.append(
            {
                "stage": stage if stage == "prefill" else f"decode batch {batch}",
                "torch_tokens_per_s": per_s["torch"],
                "llamacpp_tokens_per_s": per_s["llamacpp"],
                "speedup": per_s["llamacpp"] / per_s["torch"],
            }
        )
        print(f"  {rows[-1]['stage']}: torch {per_s['torch']:.1f} tok/s, llama.cpp {per_s['llamacpp']:.1f} tok/s")
    return rows


def stage_config(stage: str, args, workdir: Path, real: bool) -> GenConfig:
    """The gen config of one stage (the engine is set per run)."""
    pair = (
        dict(drafter="embedded:drafter", verifier="embedded:verifier", dtype=args.dtype)
        if real
        else dict(drafter="tiny:drafter", verifier="tiny:verifier", dtype="float32", max_prompt_tokens=256)
    )
    cfg = GenConfig(
        task=args.task,
        max_examples=args.examples,
        batch_size=args.batch_size,
        modes=[stage],
        examples_per_shard=args.examples,
        split_fractions=[1.0, 0.0, 0.0],
        output=str(workdir / stage),
        judge=args.judge and stage == "gold",
        consequence_max_mismatches=args.mismatches,
        consequence_max_new_tokens=args.budget,
        consequence_horizon=args.horizon if stage == "consequence" else 0,
        **pair,
        **({} if real else {"metric": "always_right"}),
    )
    return cfg


def record(cfg: GenConfig, engine: str, pair, out: Path) -> dict:
    """One recording of the stage's examples on one engine: its manifest's counts and time."""
    run = replace(cfg, engine=engine, output=str(out), overwrite=True)
    manifest = run_gen(run, Recorder(run, *pair))
    examples = sum(s["examples"] for s in manifest.splits.values())
    return {"engine": engine, "seconds": manifest.seconds, "examples": examples, "tokens": manifest.tokens, "out": out}


def agreement(folders: dict, stage: str) -> dict:
    """How far the two engines' records of the same examples agree."""
    torch_rows, llama_rows = (load_records(folders[e]).sort("example_id") for e in ("torch", "llamacpp"))
    out = {}
    if stage == "gold":  # the same gold tokens on both sides: position by position
        for col in ("q_argmax", "p_argmax"):
            out[f"{col}_agreement"] = float(np.mean(np.asarray(torch_rows[col]) == np.asarray(llama_rows[col])))
        diff = np.abs(np.asarray(torch_rows["features"]) - np.asarray(llama_rows["features"]))
        out["features_max_abs_difference"] = float(np.nanmax(diff))
        out["features_median_abs_difference"] = float(np.nanmedian(diff))
        return out
    answers = [_answers(rows) for rows in (torch_rows, llama_rows)]
    same = [k for k in answers[0] if k in answers[1] and answers[0][k][0] == answers[1][k][0]]
    tested = [(k, t) for k in same for t, lab in answers[0][k][1].items() if lab in (HARMLESS, IMPORTANT)]
    agree = sum(answers[1][k][1].get(t) == answers[0][k][1][t] for k, t in tested)
    out.update(examples=len(answers[0]), same_answer=len(same), labels_compared=len(tested), labels_agree=agree)
    return out


def _answers(rows) -> dict:
    """example id -> (answer tokens, {position: label})."""
    found: dict = {}
    for ex, pos, tok, lab in zip(rows["example_id"], rows["position"], rows["token"], rows["consequence"]):
        toks, labels = found.setdefault(ex, ({}, {}))
        toks[pos], labels[pos] = tok, lab
    return {ex: ([t[p] for p in sorted(t)], labels) for ex, (t, labels) in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--stages",
        nargs="+",
        default=["prefill", "decode", "gold", "consequence"],
        choices=["prefill", "decode", *RECORDING],
    )
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: chosen from the machine)")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="torch's dtype (default auto)")
    parser.add_argument("--judge", action="store_true", help="gold records with judge inputs")
    parser.add_argument("--horizon", type=int, default=10, help="consequence: short-horizon scores over H tokens")
    parser.add_argument("--mismatches", type=int, default=8, help="consequence: branches per example")
    parser.add_argument("--budget", type=int, default=256, help="consequence: answer tokens")
    parser.add_argument("--out", default=None, help="results path without suffix (default runs/bench/engines_<pair>)")
    args = parser.parse_args()
    real = embedded_installed() and not args.tiny
    if not real:  # tiny random models never answer right: a metric that says every answer is right
        metrics.METRICS["always_right"] = lambda text, meta: {"quality": 1.0, "answer": text[-8:]}
    spec = ("embedded:drafter", "embedded:verifier") if real else ("tiny:drafter", "tiny:verifier")
    dtype = args.dtype if real else "float32"
    pairs = {"torch": load_pair(*spec, dtype), "llamacpp": load_pair(*spec, engine="llamacpp", threads=args.threads)}
    llama = engine_note(pairs["llamacpp"].verifier)
    workdir = Path(tempfile.mkdtemp(prefix="specroute-bench-engines-"))
    rows, result = [], {"cpu": cpu_kind(), "torch_dtype": resolve_dtype(dtype, "cpu").name, "llamacpp": llama}
    for stage in args.stages:
        if stage not in RECORDING:
            rows += model_speeds(
                pairs, task_prompts(pairs["torch"].tokenizer, args.task, 4, None if real else 200), stage
            )
            continue
        cfg = stage_config(stage, args, workdir, real)
        runs = [record(cfg, e, pairs[e], workdir / f"{stage}-{e}-{i}") for i, e in enumerate(ORDER)]
        seconds = {e: sum(r["seconds"] for r in runs if r["engine"] == e) for e in ("torch", "llamacpp")}
        examples = runs[0]["examples"]
        per_s = {e: 2 * examples / seconds[e] for e in seconds}
        folders = {e: next(r["out"] for r in runs if r["engine"] == e) for e in seconds}
        row = {
            "stage": stage,
            "examples": examples,
            "tokens": runs[0]["tokens"],
            "torch_examples_per_s": per_s["torch"],
            "llamacpp_examples_per_s": per_s["llamacpp"],
            "speedup": per_s["llamacpp"] / per_s["torch"],
            "run_seconds": [round(r["seconds"], 2) for r in runs],
            **agreement(folders, stage),
        }
        rows.append(row)
        print(
            f"  {stage}: torch {per_s['torch']:.3f} ex/s, llama.cpp {per_s['llamacpp']:.3f} ex/s: {row['speedup']:.2f}x"
        )
    result.update(pair="embedded" if real else "tiny", task=args.task, batch_size=args.batch_size, stages=rows)
    out = Path(args.out or f"runs/bench/engines_{result['pair']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    with out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)
    shutil.rmtree(workdir, ignore_errors=True)
    _summary(result, args)
    print(f"results: {out.with_suffix('.json')}, {out.with_suffix('.csv')}")


def _summary(result: dict, args) -> None:
    llama = result["llamacpp"]
    print(
        f"\n{result['pair']} pair, {result['task']}, batch {result['batch_size']}; CPU {result['cpu']}; torch in "
        f"{result['torch_dtype']} ({torch.get_num_threads()} threads); llama.cpp ({llama.get('kernels', '?')} kernels) "
        f"{llama['threads']} threads "
        f"({llama['threads_reason']}); each engine twice, ABBA"
    )
    for row in result["stages"]:
        if "torch_tokens_per_s" in row:
            print(
                f"  {row['stage']:<14} torch {row['torch_tokens_per_s']:.1f} tokens/s, llama.cpp "
                f"{row['llamacpp_tokens_per_s']:.1f} tokens/s, {row['speedup']:.2f}x"
            )
            continue
        line = (
            f"  {row['stage']:<12} {row['examples']} examples: torch {row['torch_examples_per_s']:.3f} ex/s, "
            f"llama.cpp {row['llamacpp_examples_per_s']:.3f} ex/s, {row['speedup']:.2f}x"
        )
        if row["stage"] == "gold":
            line += (
                f"; argmax agreement drafter {row['q_argmax_agreement']:.4f}, verifier {row['p_argmax_agreement']:.4f}"
            )
        else:
            line += (
                f"; same answer {row['same_answer']}/{row['examples']}, labels agree {row['labels_agree']}/"
                f"{row['labels_compared']}"
            )
        print(line)


if __name__ == "__main__":
    main()
