"""One drafter decode step three ways, side by side: the loop's dynamic KV cache (eager, the baseline),
a static KV cache (eager), and a static KV cache with the step compiled by torch.compile (gpt-fast's recipe).

The drafter decodes one token per forward inside a block, so its per-step overhead (Python, kernel
launches) is paid gamma times a block. This measures whether a static cache + compiled step pays on this
machine before the loop grows such a path: ms per one-token step after a prefill, the compile time, and
whether the greedy tokens agree with the eager dynamic cache (they must). It builds the embedded drafter's
Qwen2 architecture (Qwen2.5-Coder 0.5B) with random weights, as benchmarks/gpu.py does (no model files),
or tiny shapes with --tiny (the default tests run that).

    python -m benchmarks.drafter_step [--tiny] [--device cpu|cuda] [--dtype float32|bfloat16]
        [--batches 1 4] [--steps 32] [--mode default|reduce-overhead|max-autotune] [--out PATH]

Prints a table (ratios against the dynamic cache) and writes JSON.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from router.infra.clock import median
from router.infra.files import write_json
from benchmarks.gpu import PAIR_SHAPES, QWEN, TINY_SHAPES, environment, sync

PROMPT = 16


def build_drafter(tiny: bool, device: str, dtype: torch.dtype):
    """The embedded drafter's architecture (or a tiny one) with seeded random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shapes = dict(QWEN, vocab_size=512) if tiny else QWEN
    cfg = Qwen2Config(**shapes, **(TINY_SHAPES if tiny else PAIR_SHAPES)["drafter"], num_key_value_heads=2)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def dynamic_steps(model, ids: torch.Tensor, steps: int, device: str) -> tuple[list[float], torch.Tensor]:
    """Seconds per one-token step and the greedy tokens (B, steps + 1), dynamic cache, eager."""
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    tokens, seconds = [tok], []
    for _ in range(steps):
        sync(device)
        started = time.perf_counter()
        out = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        seconds.append(time.perf_counter() - started)
        tokens.append(tok)
    return seconds, torch.cat(tokens, 1)


def static_steps(model, ids: torch.Tensor, steps: int, device: str, step) -> tuple[list[float], torch.Tensor]:
    """The same with a StaticCache of PROMPT + steps + 1 slots and `step(tok, cache, position)` per token."""
    from transformers import StaticCache

    length = ids.shape[1]
    cache = StaticCache(config=model.config, max_cache_len=length + steps + 1)
    out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(length, device=device),
                use_cache=True, logits_to_keep=1)  # fmt: skip
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens, seconds = [tok], []
    for i in range(steps):
        position = torch.tensor([length + i], device=device)
        sync(device)
        started = time.perf_counter()
        tok = step(tok, cache, position)[:, -1].argmax(-1, keepdim=True)
        sync(device)
        seconds.append(time.perf_counter() - started)
        tokens.append(tok)
    return seconds, torch.cat(tokens, 1)


def median_ms(seconds: list[float]) -> float:
    return 1e3 * median(seconds)


def compiled_row(model, ids: torch.Tensor, args, compiled, want: torch.Tensor, dynamic_ms: float) -> dict:
    """The compiled step's columns; where torch.compile cannot run here (no C++ compiler, an unsupported
    backend), the reason instead of a traceback."""
    try:
        started = time.perf_counter()
        static_steps(model, ids, 2, args.device, compiled)  # compiles (once per batch size)
        compile_s = time.perf_counter() - started
        fast, got = static_steps(model, ids, args.steps, args.device, compiled)
    except Exception as error:  # noqa: BLE001 - any compiler failure is a result to report, not a crash
        return dict(compiled_ms=None, compiled_ratio=None, compile_seconds=None, tokens_equal_compiled=None,
                    compile_error=f"{type(error).__name__}: {str(error)[:300]}")  # fmt: skip
    ms = median_ms(fast)
    return dict(compiled_ms=ms, compiled_ratio=ms / dynamic_ms, compile_seconds=compile_s,
                tokens_equal_compiled=bool(torch.equal(want, got)))  # fmt: skip


def run(args) -> dict:
    dtype = getattr(torch, args.dtype)
    model = build_drafter(args.tiny, args.device, dtype)

    def eager(tok, cache, position):
        return model(input_ids=tok, past_key_values=cache, cache_position=position, use_cache=True,
                     logits_to_keep=1).logits  # fmt: skip

    compiled = torch.compile(eager, dynamic=False, mode=args.mode)
    rows = []
    with torch.inference_mode():
        for batch in args.batches:
            ids = torch.randint(3, 500, (batch, PROMPT), generator=torch.Generator().manual_seed(batch)).to(args.device)
            dynamic_steps(model, ids, 4, args.device)  # warm-up
            base, want = dynamic_steps(model, ids, args.steps, args.device)
            plain, got_plain = static_steps(model, ids, args.steps, args.device, eager)
            row = dict(batch=batch, dynamic_ms=median_ms(base), static_ms=median_ms(plain))
            row.update(
                static_ratio=row["static_ms"] / row["dynamic_ms"],
                tokens_equal_static=bool(torch.equal(want, got_plain)),
            )
            row.update(compiled_row(model, ids, args, compiled, want, row["dynamic_ms"]))
            rows.append(row)
    env = dict(environment(args.device, dtype), torch_compile=f"the compiled column (mode {args.mode})")
    env["cuda_graphs"] = args.mode == "reduce-overhead" and args.device.startswith("cuda")
    return dict(environment=env, shapes="tiny" if args.tiny else "Qwen2.5-Coder-0.5B (random weights)",
                steps=args.steps, mode=args.mode, rows=rows)  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--mode", default="default", help="torch.compile mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--out", default="runs/bench/drafter_step.json")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    result = run(args)
    out = Path(args.out)
    write_json(out, result)
    env = result["environment"]
    print(f"drafter step, {result['shapes']}, {env['dtype']} on {env.get('gpu') or env.get('cpu')}, "
          f"torch {env['torch']}, compile mode {args.mode}, median of {args.steps} steps")  # fmt: skip
    print(f"{'batch':>5} {'dynamic ms':>11} {'static ms':>10} {'compiled ms':>12} {'static x':>9} {'compiled x':>11} "
          f"{'compile s':>10} {'same tokens':>12}")  # fmt: skip
    for r in result["rows"]:
        if r["compiled_ms"] is None:
            print(f"{r['batch']:>5} {r['dynamic_ms']:>11.2f} {r['static_ms']:>10.2f} {'-':>12} {r['static_ratio']:>9.3f} "
                  f"{'-':>11} {'-':>10} {str(r['tokens_equal_static']):>12}  compile failed: {r['compile_error']}")  # fmt: skip
            continue
        same = r["tokens_equal_static"] and r["tokens_equal_compiled"]
        print(f"{r['batch']:>5} {r['dynamic_ms']:>11.2f} {r['static_ms']:>10.2f} {r['compiled_ms']:>12.2f} "
              f"{r['static_ratio']:>9.3f} {r['compiled_ratio']:>11.3f} {r['compile_seconds']:>10.1f} {str(same):>12}")  # fmt: skip
    if not all(r["tokens_equal_static"] and r["tokens_equal_compiled"] is not False for r in result["rows"]):
        print("note: some greedy tokens differ from the dynamic cache's: the static cache's masked full-length attention "
              "(and the compiled kernels) round differently, and random weights make near-ties common; such a path "
              "would not be bitwise exact against the loop's dynamic-cache decoding in this dtype")  # fmt: skip
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
