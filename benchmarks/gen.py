"""Recording throughput against a bare teacher-forced forward pass, side by side in one run.

Both process the same batches of the same examples with the same two models: the bare pass only
runs the two forwards (keeping the continuation logits, as recording must); recording adds the
full-distribution statistics, top-k, features, drafter samples and the Arrow writes. Prints
tokens/s of each, their ratio (target >= 0.8) and bytes per token on disk (target <= 1 KB).
With --judge it also records the same examples with judge inputs (data_gen/judge.py: one more
verifier pass over the substituted tokens), with --window W with window inputs (data_gen/window.py:
W drafter passes and one verifier pass over every mismatch's chain), and prints each recording's
speed against the plain one.

    python -m benchmarks.gen [--tiny] [--task gsm8k] [--examples 16] [--batch-size 4] [--judge] [--window 6]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from data_gen.config import GenConfig
from data_gen.recorder import Recorder
from data_gen.plan import load_examples
from data_gen.run import run_gen
from router.loop.teacher import forward_tail
from router.loop.layout import Layout, left_pad
from router.machine.hardware import DTYPE_CHOICES, cpu_kind
from router.infra.embedded import embedded_installed


def bare_pass(recorder: Recorder, batches) -> tuple[int, float]:
    """Tokens and seconds of the two teacher-forced forwards alone."""
    tokens, started = 0, time.perf_counter()
    with torch.inference_mode():
        for prompts, conts in batches:
            ids, mask = left_pad([p + c for p, c in zip(prompts, conts)], recorder.pad_id)
            layout, keep = Layout(ids, mask), max(len(c) for c in conts) + 1
            forward_tail(recorder.drafter, layout, keep, recorder.vocab, False)
            forward_tail(recorder.verifier, layout, keep, recorder.vocab, False)
            tokens += sum(len(c) for c in conts)
    return tokens, time.perf_counter() - started


def _variant(cfg: GenConfig, recorder: Recorder, out: Path, **changes):
    """The same examples recorded again with more inputs (judge, window), on the same loaded models."""
    varied = replace(cfg, output=str(out), **changes)
    return run_gen(varied, Recorder(varied, recorder.drafter, recorder.verifier, recorder.tok))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="embedded pair's dtype (default auto)")
    parser.add_argument("--judge", action="store_true", help="also record with judge inputs, side by side")
    parser.add_argument("--window", type=int, default=0, help="also record with window inputs of this W, side by side")
    parser.add_argument("--out", default=None, help="results path without suffix (default runs/bench/gen_<pair>)")
    args = parser.parse_args()
    real = embedded_installed() and not args.tiny
    workdir = Path(tempfile.mkdtemp(prefix="specroute-bench-gen-"))
    pair = (
        dict(drafter="embedded:drafter", verifier="embedded:verifier", dtype=args.dtype, chat=True)
        if real
        else dict(drafter="tiny:drafter", verifier="tiny:verifier", dtype="float32", max_prompt_tokens=512)
    )
    cfg = GenConfig(
        task=args.task,
        max_examples=args.examples,
        batch_size=args.batch_size,
        modes=["gold"],
        examples_per_shard=args.examples,
        split_fractions=[1.0, 0.0, 0.0],
        output=str(workdir / "rec"),
        **pair,
    )
    recorder = Recorder(cfg)
    examples = load_examples(cfg)
    prepared = [pc for pc in (recorder.prepare(ex, "gold") for ex in examples) if pc is not None]
    batches = [
        ([p for p, _ in prepared[i : i + cfg.batch_size]], [c for _, c in prepared[i : i + cfg.batch_size]])
        for i in range(0, len(prepared), cfg.batch_size)
    ]
    bare_pass(recorder, batches)  # warm-up over every batch shape (oneDNN builds kernels per shape)
    bare_tokens, bare_s = bare_pass(recorder, batches)
    manifest = run_gen(cfg, recorder)
    rec_tokens, rec_s = manifest.tokens, manifest.seconds
    bare_tps, rec_tps = bare_tokens / bare_s, rec_tokens / rec_s
    result = {
        "pair": "embedded" if real else "tiny",
        "task": args.task,
        "examples": len(prepared),
        "batch_size": args.batch_size,
        "bare_tokens_per_second": bare_tps,
        "recording_tokens_per_second": rec_tps,
        "ratio": rec_tps / bare_tps,
        "bytes_per_token": manifest.bytes_per_token,
        "top_k": cfg.top_k,
        "tokens": rec_tokens,
        "dtype": manifest.dtype["dtype"],
        "cpu": cpu_kind(),
        "torch": torch.__version__,
    }
    if args.judge:
        judged = _variant(cfg, recorder, workdir / "rec-judge", judge=True)
        result.update(
            judge_tokens_per_second=judged.tokens / judged.seconds,
            judge_ratio=(judged.tokens / judged.seconds) / rec_tps,
            judge_tree_tokens_per_token=judged.counts["judge_tree_tokens"] / judged.tokens,
            judge_bytes_per_token=judged.bytes_per_token,
        )
    if args.window:
        windowed = _variant(cfg, recorder, workdir / "rec-window", window=args.window)
        result.update(
            window=args.window,
            window_tokens_per_second=windowed.tokens / windowed.seconds,
            window_ratio=(windowed.tokens / windowed.seconds) / rec_tps,
            window_chains_per_token=windowed.counts.get("window_chains", 0) / windowed.tokens,
            window_bytes_per_token=windowed.bytes_per_token,
        )
    out = Path(args.out or f"runs/bench/gen_{result['pair']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\n{result['pair']} pair in {result['dtype']} on {result['cpu']}; {args.task}, {len(prepared)} examples, "
        f"batch {args.batch_size}, {rec_tokens} tokens"
    )
    print(f"  bare teacher-forced forwards  {bare_tps:9.1f} tokens/s")
    print(f"  recording                     {rec_tps:9.1f} tokens/s   ratio {rec_tps / bare_tps:.2f} (target >= 0.8)")
    print(f"  bytes per token on disk       {manifest.bytes_per_token:9.0f}   (top-k {cfg.top_k}; target <= 1024)")
    if args.judge:
        print(
            f"  recording with judge inputs   {result['judge_tokens_per_second']:9.1f} tokens/s   "
            f"{result['judge_ratio']:.2f}x plain recording; {result['judge_tree_tokens_per_token']:.2f} substituted "
            f"tokens per token; {result['judge_bytes_per_token']:.0f} bytes per token"
        )
    if args.window:
        print(
            f"  recording with window inputs  {result['window_tokens_per_second']:9.1f} tokens/s   "
            f"{result['window_ratio']:.2f}x plain recording; W = {args.window}, {result['window_chains_per_token']:.2f} "
            f"mismatch chains per token; {result['window_bytes_per_token']:.0f} bytes per token"
        )
    print(f"results: {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
