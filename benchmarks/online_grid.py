"""Online evaluation cost: generated tokens per second across a whole eval grid, and the fraction
of the grid's wall-clock time spent outside model forwards (target under 10%), side by side with
the same grid's time inside the drafter's and verifier's forwards.

Runs `specroute eval` online-only on held-out prompts of an existing record folder (the embedded
pair's GSM8K records by default; `--tiny` records and evaluates the tiny pair in seconds).

    python -m benchmarks.online_grid [--records runs/records/gsm8k] [--prompts 3] [--max-new-tokens 48] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from eval.run import EvalConfig, run_eval
from specroute import cli

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", default="runs/records/gsm8k")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--methods", default="opt,token_v3,lossless,token_cascade")
    parser.add_argument("--tiny", action="store_true", help="record and evaluate the tiny random pair")
    parser.add_argument("--out", default="runs/bench/eval.json")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="specroute-bench-eval-"))
    records, dtype = args.records, "auto"
    if args.tiny:
        records, dtype = str(scratch / "records"), "float32"
        if cli.main(["gen", "--config", str(ROOT / "configs" / "gen" / "tiny.yaml"), f"output={records}"]) != 0:
            raise SystemExit("recording the tiny pair failed (see the error above)")
    cfg = EvalConfig(
        name="bench",
        records=[records],
        offline=False,
        online=True,
        max_prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        online_methods=args.methods.split(","),
        online_rejection_targets=[0.5],
        dtype=dtype,
        output=str(scratch / "eval"),
    )
    started = time.perf_counter()
    metrics = run_eval(cfg)
    total = time.perf_counter() - started
    points = metrics["online"]["points"]
    tokens = sum(p["tokens"] for p in points)
    decode_s = sum(p["seconds"] for p in points)
    model_s = sum(p["model_seconds"] for p in points)
    result = {
        "records": records,
        "points": len(points),
        "prompts": args.prompts,
        "tokens": tokens,
        "eval_seconds": total,
        "decode_seconds": decode_s,
        "model_forward_seconds": model_s,
        "tokens_per_second": tokens / total,
        "outside_model_fraction": 1 - model_s / total,
        "outside_model_fraction_in_decoding": 1 - model_s / decode_s,
        "per_point": [
            {k: p[k] for k in ("method", "alpha", "tokens", "seconds", "model_seconds", "outside_model_fraction")}
            for p in points
        ],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(
        f"\nonline eval grid: {len(points)} points x {args.prompts} prompts, {tokens} tokens in {total:.1f} s "
        f"({tokens / total:.2f} tokens/s, model loading and scoring included)"
    )
    print(
        f"time in model forwards {model_s:.1f} s; outside them: {100 * result['outside_model_fraction']:.1f}% of "
        f"the eval, {100 * result['outside_model_fraction_in_decoding']:.1f}% of the decoding loops (target < 10%)"
    )
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
