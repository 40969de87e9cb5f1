"""How much of a vLLM request's time its prompt's prefill is, when the prompt is found in vLLM's prefix cache
and when it is not (runs in .venv-vllm).

One speculative engine with the plugin on the embedded pair decodes each held-out 5-shot GSM8K prompt twice,
after emptying the prefix cache and then again (its prefill found cached), for `lossless` and `token_v2`: the
difference is what a method gains when another method decoded the same prompt on the same engine before it, the
reason eval engine=vllm and benchmarks.serve_vllm give every timed call only the shared prefix cached. Prints
and writes JSON (seconds per prompt, emptied and cached, twice each).

    .venv-vllm/bin/python -m studies.vllm_prefix_cache [--prompts 5] [--max-tokens 48] [--out runs/studies/vllm_prefix_cache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

POLICIES = {
    "lossless": {"specroute_policy": "lossless"},
    "token_v2": {"specroute_policy": "token_v2", "specroute_alpha": 0.3776},
}


def timed_twice(llm, prompt: str, params) -> list[float]:
    """Seconds of (emptied, cached, emptied, cached) decodes of one prompt."""
    from router.vllm.served import cache_only_the_shared_prefix

    times = []
    for empty_first in (True, False, True, False):
        if empty_first:
            cache_only_the_shared_prefix(llm, None)  # emptied, nothing kept
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", default="runs/studies/vllm_prefix_cache.json")
    args = ap.parse_args(argv)
    from vllm import SamplingParams

    from benchmarks.serve_vllm import bound_cores, held_out_prompts, pair_folders, start_engine
    from router.machine.hardware import cpu_kind
    from router.tasks.prompts import default_stops

    os.environ["SPECROUTE_POLICY"] = "lossless"
    drafter, verifier = pair_folders("embedded", "bfloat16")
    threads = len(os.sched_getaffinity(0))  # the model on every core (vLLM keeps one for its scheduler otherwise)
    llm = start_engine(verifier, drafter, 4, "bfloat16", {"SPECROUTE_POLICY": "lossless", **bound_cores(threads)})
    examples, stops = held_out_prompts(args.prompts + 1), default_stops("gsm8k", chat=False)
    tokenizer, rows = llm.get_tokenizer(), []
    for name, extra in POLICIES.items():
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, stop=stops, extra_args=extra)
        llm.generate([examples[-1].prompt], params, use_tqdm=False)  # untimed: kernels built for this policy
        for ex in examples[: args.prompts]:
            seconds = timed_twice(llm, ex.prompt, params)
            rows.append({"policy": name, "prompt_tokens": len(tokenizer(ex.prompt).input_ids), "seconds": seconds})
            print(
                f"{name}: {rows[-1]['prompt_tokens']} prompt tokens, emptied/cached s: "
                + " ".join(f"{s:.2f}" for s in seconds),
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": cpu_kind(), "cores": threads, "dtype": "bfloat16", "gamma": 4, "rows": rows}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
