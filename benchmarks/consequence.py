"""The consequence search's speed with and without drafts looked up in the answer, side by side.

Runs `data_gen.consequence.ConsequenceSearch` over the same batch of a task's examples once per
--lookup value (0 = branches decoded one verifier token per pass; g > 0 = up to g drafts per pass
looked up in the answer the branch departs from, router/loop/lookup.py), checks that every run finds
the same answers, labels and branch verdicts, and prints seconds per example, branch tokens per
verifier pass and the speed-up over the first value. Prints the CPU kind and dtype; writes JSON.

    python -m benchmarks.consequence [--tiny] [--task gsm8k] [--examples 8] [--lookup 0 4]
        [--mismatches 3] [--budget 256] [--engine torch|llamacpp] [--threads N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from data_gen.consequence import ConsequenceSearch
from data_gen.config import GenConfig
from data_gen.recorder import Recorder
from data_gen.plan import load_examples
from router.infra import clock
from router.machine.hardware import DTYPE_CHOICES, cpu_kind
from router.infra.embedded import embedded_installed


def search_once(recorder: Recorder, prompts: list, metas: list, lookup: int, args) -> dict:
    """One search over the prompts: its results and what it cost."""
    search = ConsequenceSearch(
        recorder.drafter,
        recorder.verifier,
        recorder.tok,
        recorder.metric,
        recorder.stops,
        recorder.vocab,
        recorder.pad_id,
        args.budget,
        args.mismatches,
        len(prompts),
        recorder.prefix,
        lookup,
    )
    started = clock.now()
    found = search.run(prompts, metas)
    seconds = clock.now() - started
    return {
        "lookup": lookup,
        "seconds": seconds,
        "seconds_per_example": seconds / len(prompts),
        "branch_tokens": search.branch_tokens,
        "branch_verifier_passes": search.branch_verifier_passes,
        "branch_tokens_per_pass": search.branch_tokens / max(search.branch_verifier_passes, 1),
        "tested": sum(s.tested for s in found),
        "found": [(s.tokens, s.correct, sorted(s.labels.items()), sorted(s.branches.items())) for s in found],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny random models even if the embedded pair is installed")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--examples", type=int, default=8, help="searched together, as one recorder batch")
    parser.add_argument("--lookup", type=int, nargs="+", default=[0, 4], help="drafts per pass (0 = plain greedy)")
    parser.add_argument("--mismatches", type=int, default=3, help="branches per example")
    parser.add_argument("--budget", type=int, default=256, help="answer budget, branches included")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--engine", default="torch", choices=["torch", "llamacpp"], help="what runs the models")
    parser.add_argument(
        "--threads", type=int, default=0, help="llamacpp: threads per model (0: chosen from the machine)"
    )
    parser.add_argument("--out", default=None, help="results path (default runs/bench/consequence_<pair>.json)")
    args = parser.parse_args()
    clock.pause_aware()
    real = embedded_installed() and not args.tiny
    pair = (
        dict(drafter="embedded:drafter", verifier="embedded:verifier", dtype=args.dtype)
        if real
        else dict(drafter="tiny:drafter", verifier="tiny:verifier", dtype="float32", max_prompt_tokens=512)
    )
    if not real:  # random models write no numbers: a verdict that flips often exercises both labels
        from router.tasks import metrics

        metrics.METRICS["length3"] = lambda text, meta: {"quality": float(sum(map(ord, text)) % 3 != 0), "answer": ""}
    cfg = GenConfig(
        task=args.task,
        chat=args.task != "gsm8k",
        max_examples=args.examples,
        modes=["consequence"],
        output="runs/bench/unused",
        metric=None if real else "length3",
        engine=args.engine,
        threads=args.threads,
        **pair,
    )
    recorder = Recorder(cfg)
    examples = load_examples(cfg)[: args.examples]
    recorder.share_prefix(examples)
    ready = [(ex, pc) for ex, pc in ((ex, recorder.prepare(ex, "consequence")) for ex in examples) if pc is not None]
    prompts, metas = [pc[0] for _, pc in ready], [ex.meta for ex, _ in ready]
    runs = []
    with torch.inference_mode():
        for lookup in tqdm(args.lookup, desc=f"searches of {len(prompts)} examples", unit="search"):
            runs.append(search_once(recorder, prompts, metas, lookup, args))
    same = all(r["found"] == runs[0]["found"] for r in runs)
    meta = {
        "pair": "embedded" if real else "tiny",
        "task": args.task,
        "examples": len(prompts),
        "mismatches": args.mismatches,
        "budget": args.budget,
        "cpu": cpu_kind(),
        "engine": args.engine,
        "dtype": recorder.dtype.name,
        "threads": getattr(recorder.verifier, "threads", torch.get_num_threads()),
        "same_results": same,
    }
    rows = [{k: v for k, v in r.items() if k != "found"} | {"speedup": runs[0]["seconds"] / r["seconds"]} for r in runs]
    out = Path(args.out or f"runs/bench/consequence_{meta['pair']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(
        f"\n{meta['pair']} pair on {meta['engine']} in {meta['dtype']} ({meta['threads']} threads) on {meta['cpu']}; {len(prompts)} "
        f"{args.task} examples searched together, {args.mismatches} branches each at most"
    )
    print(
        f"{'lookup':>6}{'s / example':>13}{'branch tokens':>15}{'verifier passes':>17}{'tokens / pass':>15}"
        f"{'tested':>8}{'speed-up':>10}"
    )
    for r in rows:
        print(
            f"{r['lookup']:>6}{r['seconds_per_example']:>13.2f}{r['branch_tokens']:>15}{r['branch_verifier_passes']:>17}"
            f"{r['branch_tokens_per_pass']:>15.2f}{r['tested']:>8}{r['speedup']:>9.2f}x"
        )
    print(f"same answers, labels and branch verdicts in every run: {same}\nresults: {out}")
    if not same:
        raise SystemExit("the runs disagree: looked-up drafts changed what the search found (a bug)")


if __name__ == "__main__":
    main()
