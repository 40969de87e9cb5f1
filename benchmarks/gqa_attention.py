"""The verifier's cached verification forward with grouped-query attention done two ways, side by side:
transformers' default on the CPU (its SDPA path copies each key/value head to every query head it
serves, `repeat_kv`, before attention: 6x the cache's bytes for the Qwen2.5 pair's 12 query / 2 key-value
heads) against SDPA's own grouped-query attention (`enable_gqa`, what TRANSFORMERS_SDPA_FORCE_GQA=1 asks
transformers for; specroute sets it when it loads a pair on the CPU, router/machine/attention.py).

The shape is the speculative loop's and the consequence search's: B rows with a padding mask, a cached
prefix of L tokens (a 5-shot GSM8K prompt is about 900), Q new tokens per forward (gamma + 1). It builds
the embedded verifier's Qwen2 architecture (Qwen2.5-Coder 1.5B) with random weights, as benchmarks/gpu.py
does (no model files), or tiny shapes with --tiny (the default tests run that). Both ways are timed
interleaved in one process, median of --repeats forwards each, and their logits compared.

    python -m benchmarks.gqa_attention [--tiny] [--dtype bfloat16|float32] [--batches 1 4 16]
        [--prefix 900] [--queries 5] [--repeats 5] [--out PATH]

Prints a table (ratio: enable_gqa over the default) and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from router.infra.files import write_json
from benchmarks.gpu import PAIR_SHAPES, QWEN, TINY_SHAPES, environment
from router.machine.attention import FLAG


def build_verifier(tiny: bool, dtype: torch.dtype):
    """The embedded verifier's architecture (or a tiny one) with seeded random weights, on the CPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shapes = dict(QWEN, vocab_size=512) if tiny else QWEN
    cfg = Qwen2Config(**shapes, **(TINY_SHAPES if tiny else PAIR_SHAPES)["verifier"], num_key_value_heads=2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(dtype=dtype).eval()


def cached_forward(model, batch: int, prefix: int, queries: int):
    """A closure running one verification forward (B, Q) over a left-padded cached prefix (B, L)."""
    from transformers import DynamicCache

    from router.loop.layout import cache_argument

    arg = cache_argument(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, vocab, (batch, prefix + queries), generator=g)
    mask = torch.ones(batch, prefix + queries, dtype=torch.long)
    mask[1::2, : prefix // 10] = 0  # every other row left-padded: the loop's ragged batches
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids[:, :prefix], attention_mask=mask[:, :prefix], position_ids=positions[:, :prefix],
              **{arg: cache}, use_cache=True, logits_to_keep=1)  # fmt: skip

    def forward() -> torch.Tensor:
        with torch.inference_mode():
            out = model(input_ids=ids[:, prefix:], attention_mask=mask, position_ids=positions[:, prefix:],
                        **{arg: cache}, use_cache=True)  # fmt: skip
        cache.crop(-queries)  # the next forward sees the same prefix
        return out.logits

    return forward


def timed(forward, flag: str) -> tuple[float, torch.Tensor]:
    os.environ[FLAG] = flag
    started = time.perf_counter()
    logits = forward()
    return time.perf_counter() - started, logits


def run(args) -> dict:
    dtype = getattr(torch, args.dtype)
    model = build_verifier(args.tiny, dtype)
    before = os.environ.get(FLAG)
    rows = []
    try:
        for batch in args.batches:
            forward = cached_forward(model, batch, args.prefix, args.queries)
            timed(forward, "0"), timed(forward, "1")  # warm-up
            seconds = {"0": [], "1": []}
            logits = {}
            for _ in range(args.repeats):
                for flag in ("0", "1"):  # interleaved: a drift of the machine hits both alike
                    s, logits[flag] = timed(forward, flag)
                    seconds[flag].append(s)
            default, gqa = (1e3 * sorted(seconds[f])[len(seconds[f]) // 2] for f in ("0", "1"))
            diff = (logits["0"].float() - logits["1"].float()).abs().max().item()
            same = bool((logits["0"].argmax(-1) == logits["1"].argmax(-1)).all())
            rows.append(dict(batch=batch, default_ms=default, gqa_ms=gqa, ratio=gqa / default,
                             logits_max_abs_diff=diff, argmax_equal=same))  # fmt: skip
    finally:
        if before is None:
            os.environ.pop(FLAG, None)
        else:
            os.environ[FLAG] = before
    return dict(environment=environment("cpu", dtype), shapes="tiny" if args.tiny else "Qwen2.5-Coder-1.5B (random "
                "weights)", prefix=args.prefix, queries=args.queries, repeats=args.repeats, rows=rows)  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prefix", type=int, default=900)
    parser.add_argument("--queries", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="runs/bench/gqa_attention.json")
    args = parser.parse_args(argv)
    result = run(args)
    out = Path(args.out)
    write_json(out, result)
    env = result["environment"]
    print(f"verifier verification forward, {result['shapes']}, {env['dtype']} on {env['gpu']}, torch {env['torch']}, "
          f"prefix {args.prefix}, {args.queries} new tokens per row, median of {args.repeats}")  # fmt: skip
    print(
        f"{'batch':>5} {'repeat_kv ms':>13} {'enable_gqa ms':>14} {'ratio':>7} {'max |logit diff|':>17} {'same argmax':>12}"
    )
    for r in result["rows"]:
        print(f"{r['batch']:>5} {r['default_ms']:>13.1f} {r['gqa_ms']:>14.1f} {r['ratio']:>7.3f} "
              f"{r['logits_max_abs_diff']:>17.3g} {str(r['argmax_equal']):>12}")  # fmt: skip
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
