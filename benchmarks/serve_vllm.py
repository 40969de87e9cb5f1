"""Speculative cascades served by vLLM: the verifier alone, vLLM's own lossless draft-model speculative decoding and
specroute's plugin with each policy, side by side on held-out GSM8K prompts (runs in .venv-vllm).

The engines the methods need stay up together: the verifier alone, vLLM's speculative decoding with the plugin off
(one per number of drafts asked), and one with the plugin on, where each request names its policy
(`specroute_policy` / `specroute_alpha`). Two engines of the embedded pair fit in 23 GB (a third ran out of memory
starting), so a run compares two engines' methods; vLLM's own lossless, in every run, links them. Each engine's
model runs on every core (`--threads`): vLLM's CPU backend by default keeps one core for its scheduler. The prompts go in
batches of `--batch` concurrent requests; every batch is decoded by every method before the next batch, in an
order that rotates batch by batch, so a change in the machine's load lands on all methods alike; every timed
call finds only the prompts' shared prefix cached (the plugin's methods share one engine and the same prompts).
Per method: tokens/s, time per token against the baseline (the verifier alone where it runs, else vLLM's own
lossless) with a 95% bootstrap interval over the paired batches (a prompt's time is its batch's), vLLM's
acceptance rate, GSM8K accuracy and its paired difference against the baseline (bootstrap over prompts), and the
plugin's overhead (plugin lossless / vLLM lossless, the same tokens).
Prints the CPU, dtype and threads; writes JSON. A journal per batch lets a cut run resume.

    .venv-vllm/bin/python -m benchmarks.serve_vllm [--pair embedded|tiny] [--tiny] [--prompts 50] [--batch 8] [--gamma 4]
        [--max-tokens 256] [--methods verifier vllm-lossless vllm-lossless@2 plugin:lossless plugin:token_v2@0.3 ...]
        [--dtype bfloat16] [--out runs/bench/serve_vllm.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from eval.paired import bootstrap_mean

PLUGIN_OFF = {"SPECROUTE_POLICY": ""}


def bound_cores(threads: int) -> dict:
    """The environment that has each engine's model run on `threads` of this process's cores. vLLM's CPU
    backend by default keeps one core for its scheduler process: on 2 cores its model ran on 1 (measured: the
    verifier at 8 requests 22.9 tokens/s on one core, 40.95 on both)."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=("embedded", "tiny"), default="embedded")
    ap.add_argument("--tiny", action="store_true", help="the tiny pair (as --pair tiny)")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="cores each engine's model runs on (default: all; 0: vLLM's own binding, which keeps one for its scheduler)",
    )
    ap.add_argument("--methods", nargs="+", default=["verifier", "vllm-lossless", "plugin:lossless"])
    ap.add_argument("--replicates", type=int, default=2000)
    ap.add_argument("--out", default="runs/bench/serve_vllm.json")
    return ap.parse_args(argv)


def pair_folders(kind: str, dtype: str) -> tuple[Path, Path]:
    """(drafter, verifier) Hugging Face folders: the embedded Qwen2.5-Coder pair converted once, or the tiny pair."""
    import torch

    if kind == "tiny":
        from router.loop.tiny import save_tiny_pair

        return save_tiny_pair(Path(tempfile.mkdtemp(prefix="vllm-bench-")), hidden=128)
    from router.infra.embedded import embedded_path

    torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    return embedded_path("drafter", torch_dtype), embedded_path("verifier", torch_dtype)


@functools.cache
def held_out_prompts(n: int) -> list:
    """The first n GSM8K examples of the test split (specroute gen's seeded split, seed 0): held out from
    any recording made with the default settings."""
    from data_gen.plan import assign_split
    from data_gen.tasks import load_gsm8k

    test = [ex for ex in load_gsm8k() if assign_split(ex.example_id, 0, (0.7, 0.15, 0.15)) == "test"]
    return test[:n]


ENGINE_BUDGET = {  # per engine, alike for every engine; still only two real-pair engines fit in 23 GB
    "kv_cache_memory_bytes": 512 << 20,  # 8 requests of ~1k tokens need ~0.3 GB (both models' caches, bf16)
    "max_num_batched_tokens": 2048,  # vLLM's CPU default 4096 sizes its start-up dummy pass; prompts share a cached prefix
}


def start_engine(verifier: Path, drafter: Path | None, gamma: int, dtype: str, env: dict, batch: int = 8):
    """One vLLM engine sized for `batch` concurrent requests; its engine core is spawned with `env` over this
    process's environment."""
    from vllm import LLM

    from router.vllm.served import environment

    spec = {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": gamma} if drafter else None
    with environment(**env):
        return LLM(
            model=str(verifier),
            dtype=dtype,
            max_model_len=4096,
            enforce_eager=True,
            max_num_seqs=max(batch, 8),
            **ENGINE_BUDGET,
            speculative_config=spec,
            disable_log_stats=False,
            seed=0,
        )


def method_plan(methods: list[str]) -> list[dict]:
    """Each method's engine and per-request extra arguments: verifier, vllm-lossless (at --gamma),
    vllm-lossless@G (vLLM's own at G drafts per step, an engine of its own), plugin:RULE@ALPHA or
    plugin:ROUTER_DIR@ALPHA."""
    plan = []
    for m in methods:
        if m in ("verifier", "vllm-lossless"):
            plan.append({"name": m, "engine": m, "extra": None})
            continue
        if m.startswith("vllm-lossless@"):
            gamma = m.removeprefix("vllm-lossless@")
            if not gamma.isdigit() or int(gamma) < 1:
                raise SystemExit(f"error: method {m!r}: vllm-lossless@G takes a number of drafts G >= 1")
            plan.append({"name": m, "engine": m, "extra": None, "gamma": int(gamma)})
            continue
        if not m.startswith("plugin:"):
            raise SystemExit(
                f"error: method {m!r}: use verifier, vllm-lossless, vllm-lossless@G or plugin:POLICY[@ALPHA]"
            )
        policy, _, alpha = m.removeprefix("plugin:").partition("@")
        extra = {"specroute_policy": policy, **({"specroute_alpha": float(alpha)} if alpha else {})}
        plan.append({"name": m, "engine": "plugin", "extra": extra})
    return plan


def decode_batch(
    llm, prompts: list[str], max_tokens: int, stops: list[str], extra, counts: Path | None, shared=None
) -> dict:
    """One batch through one engine: seconds, texts, tokens; with the plugin, its drafts and accepted drafts
    (its counts file: vLLM's metrics registry is one per process, held by the last engine started). The call
    finds only `shared` (token ids every prompt starts with) cached: the plugin's methods share one engine and
    decode the same prompts, and none may find its prompts cached by the one before."""
    from vllm import SamplingParams

    from router.vllm.served import cache_only_the_shared_prefix

    params = SamplingParams(temperature=0, max_tokens=max_tokens, stop=stops, extra_args=extra)
    cache_only_the_shared_prefix(llm, shared)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    rows = json.loads(counts.read_text())["requests"] if counts is not None and counts.exists() else {}
    mine = [rows.get(o.request_id, {}) for o in outs]
    return {
        "seconds": seconds,
        "texts": [o.outputs[0].text for o in outs],
        "tokens": [len(o.outputs[0].token_ids) for o in outs],
        "drafts": sum(r.get("drafts", 0) for r in mine),
        "accepted": sum(r.get("accepted", 0) for r in mine),
    }


def shared_prefix(llm, prompts: list[str]) -> list[int]:
    """The token ids every prompt starts with (the 5-shot context), as eval's router.loop.prefix finds them."""
    from router.loop.prefix import SharedPrefix

    tokenizer = llm.get_tokenizer()
    prefix = SharedPrefix.common([tokenizer(p).input_ids for p in prompts])
    return prefix.ids if prefix is not None else []


def warm_up(engines: dict, plan: list[dict], prompts: list[str], stops: list[str]) -> None:
    """One untimed batch of 32 tokens per method: an engine's first calls build its CPU kernels for each shape
    (measured: the first batch of 8 took twice the second), which would otherwise land on whichever method
    runs first."""
    started = time.perf_counter()
    for p in plan:
        decode_batch(engines[p["engine"]], prompts, 32, stops, p["extra"], None)
    print(f"warmed up in {time.perf_counter() - started:.0f} s", flush=True)


def baseline_of(plan: list[dict]) -> str:
    """What every ratio is against: the verifier alone where it runs, else vLLM's own lossless, else the first."""
    names = [p["name"] for p in plan]
    own = [n for n in names if n.startswith("vllm-lossless@")]
    return next((n for n in ("verifier", "vllm-lossless", *own) if n in names), names[0])


SUMMARY_ENTRIES = ("plugin_overhead", "kept_drafts_bound")  # entries of "methods" that compare methods, not one


def summarise(plan: list[dict], batches: list[dict], examples: list, replicates: int, gamma: int | None = None) -> dict:
    """Per method: tokens/s, time per token against the baseline (bootstrap over batches: a prompt's time is its
    batch's), acceptance, accuracy and its paired difference against the baseline (bootstrap over prompts); with
    the plugin's lossless in the run and its gamma, what the cascades' kept drafts allow (kept_drafts_bound)."""
    per = _per_method(plan, batches, examples)
    base = per[baseline_of(plan)]
    out = {}
    for name, v in per.items():
        tok, sec, ok = (np.asarray(v[k], np.float64) for k in ("tokens", "seconds", "correct"))
        out[name] = {
            "prompts": len(ok),
            "tokens": int(tok.sum()),
            "tokens_per_s": float(tok.sum() / sec.sum()),
            "seconds_per_token": float(sec.sum() / tok.sum()),
            "acceptance": v["accepted"] / v["drafts"] if v["drafts"] else None,
            "accuracy": float(ok.mean()),
            "accuracy_ci": bootstrap_mean(ok, replicates),
        }
        if v is not base:
            out[name].update(_against(v, base, replicates))
    if "plugin:lossless" in out and "vllm-lossless" in out:
        out["plugin_overhead"] = {
            "plugin_lossless_over_vllm_lossless": out["plugin:lossless"]["seconds_per_token"]
            / out["vllm-lossless"]["seconds_per_token"],
            "same_tokens": per["vllm-lossless"]["row_tokens"] == per["plugin:lossless"]["row_tokens"],
        }
    if gamma and (out.get("plugin:lossless") or {}).get("acceptance") is not None:
        out["kept_drafts_bound"] = kept_drafts_bound(out, gamma)
    return out


def kept_drafts_bound(out: dict, gamma: int) -> dict:
    """Per plugin cascade: its time per token over the plugin's lossless as it would be if every step cost the
    same whichever drafts it keeps (gamma drafter passes and one verifier pass either way), so that only the
    tokens a step emits differ, 1 + gamma x the share of drafts kept: the most its kept drafts can save.
    Beside it the measured ratio; the gap is what else differs (fewer requests left in a batch, overhead)."""
    lossless = out["plugin:lossless"]

    def tokens_per_step(share: float) -> float:
        return 1 + gamma * share

    return {
        name: {
            "bound": tokens_per_step(lossless["acceptance"]) / tokens_per_step(r["acceptance"]),
            "measured": r["seconds_per_token"] / lossless["seconds_per_token"],
        }
        for name, r in out.items()
        if name.startswith("plugin:") and name != "plugin:lossless" and r.get("acceptance") is not None
    }


def _per_method(plan: list[dict], batches: list[dict], examples: list) -> dict:
    """Per method, per batch: tokens and seconds; per prompt: tokens and correctness; drafts and accepted."""
    from router.tasks.metrics import gsm8k_metric

    keys = ("tokens", "seconds", "correct", "row_tokens")
    per = {p["name"]: {**{k: [] for k in keys}, "drafts": 0.0, "accepted": 0.0} for p in plan}
    for batch in batches:
        for name, got in batch["methods"].items():
            v = per[name]
            v["tokens"].append(sum(got["tokens"]))
            v["seconds"].append(got["seconds"])
            v["row_tokens"] += got["tokens"]
            v["drafts"] += got["drafts"]
            v["accepted"] += got["accepted"]
            v["correct"] += [
                gsm8k_metric(t, examples[i].meta)["quality"] for t, i in zip(got["texts"], batch["examples"])
            ]
    return per


def _against(v: dict, base: dict, replicates: int) -> dict:
    """Time per token over the baseline's with a bootstrap over the paired batches; accuracy minus the
    baseline's with a bootstrap over prompts."""
    tok, sec, ok = (np.asarray(v[k], np.float64) for k in ("tokens", "seconds", "correct"))
    btok, bsec, bok = (np.asarray(base[k], np.float64) for k in ("tokens", "seconds", "correct"))
    idx = np.random.default_rng(0).integers(0, len(tok), (replicates, len(tok)))  # (replicates, batches)
    ratio = (sec[idx].sum(1) / tok[idx].sum(1)) / (bsec[idx].sum(1) / btok[idx].sum(1))
    return {
        "time_per_token_vs_baseline": float((sec.sum() / tok.sum()) / (bsec.sum() / btok.sum())),
        "time_per_token_vs_baseline_ci": [float(x) for x in np.quantile(ratio, [0.025, 0.975])],
        "accuracy_minus_baseline": float(ok.mean() - bok.mean()),
        "accuracy_minus_baseline_ci": bootstrap_mean(ok - bok, replicates),
    }


def main(argv=None) -> None:
    args = _args(argv)
    args.pair = "tiny" if args.tiny else args.pair
    from router.machine.hardware import cpu_kind

    plan = method_plan(args.methods)
    examples = held_out_prompts(args.prompts)
    drafter, verifier = pair_folders(args.pair, args.dtype)
    dtype = "float32" if args.pair == "tiny" else args.dtype
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    journal = out.with_suffix(".batches.jsonl")
    # the machine is part of the settings: a journal from another CPU starts over rather than mixing timings
    cpu = cpu_kind()
    settings = {**{k: v for k, v in vars(args).items() if k not in ("out", "replicates", "tiny")}, "cpu": cpu}
    done = _resume(journal, settings)
    binding = bound_cores(args.threads) if args.threads else {}
    if len(done) < -(-len(examples) // args.batch):  # a finished journal is summarised without starting engines
        counts = out.with_suffix(".counts.json")
        engines = start_engines(plan, (drafter, verifier), args.gamma, dtype, counts, args.batch, binding)
        decode_all(engines, counts, plan, examples, args, done, journal)
    summary = summarise(plan, done, examples, args.replicates, args.gamma)
    report = {
        "settings": settings,
        "machine": {
            "cpu": cpu,
            "threads": args.threads or "vLLM's own binding",
            "cores": binding.get("VLLM_CPU_OMP_THREADS_BIND"),
            "dtype": dtype,
        },
        "pair": {"drafter": str(drafter), "verifier": str(verifier)},
        "engine_budget": ENGINE_BUDGET,
        "baseline": baseline_of(plan),
        "methods": summary,
    }
    out.write_text(json.dumps(report, indent=2))
    _print(report)


def start_engines(
    plan: list[dict], pair: tuple, gamma: int, dtype: str, counts: Path, batch: int = 8, binding: dict | None = None
) -> dict:
    """The engines the plan's methods decode on: the verifier alone, vLLM's own speculative decoding (the
    plugin off; one engine per number of drafts asked), the plugin's (writing its counts to `counts`); each
    with `binding` (bound_cores) in its environment."""
    drafter, verifier = pair
    os.environ["SPECROUTE_POLICY"] = "lossless"  # requests are checked against the plugin's settings here
    # a request's router is not checked against the pair here: that loads both models in this process once more,
    # beside two engines (23 GB hold two); `specroute eval engine=vllm` checks a router against its records' pair
    os.environ["SPECROUTE_CHECK_PAIR"] = "0"
    engines = {}
    started = time.perf_counter()
    for p in plan:
        kind = p["engine"]
        if kind in engines:
            continue
        plugin_env = {"SPECROUTE_POLICY": "lossless", "SPECROUTE_STATS": str(counts), "SPECROUTE_STATS_EVERY": "0"}
        env = {**(plugin_env if kind == "plugin" else PLUGIN_OFF), **(binding or {})}
        draft = None if kind == "verifier" else drafter
        engines[kind] = start_engine(verifier, draft, p.get("gamma", gamma), dtype, env, batch)
    print(f"engines up in {time.perf_counter() - started:.0f} s", flush=True)
    return engines


def decode_all(
    engines: dict, counts: Path, plan: list[dict], examples: list, args, done: list[dict], journal: Path
) -> None:
    """Every batch not in the journal, by every method in a rotating order, appended to `done` and the journal
    (`counts`: the plugin's counts file)."""
    from router.tasks.prompts import default_stops

    stops = default_stops("gsm8k", chat=False)
    shared = shared_prefix(next(iter(engines.values())), [ex.prompt for ex in examples])
    warm_up(engines, plan, [ex.prompt for ex in examples[: args.batch]], stops)
    for b, start in enumerate(range(0, len(examples), args.batch)):
        if b < len(done):
            continue
        ids = list(range(start, min(start + args.batch, len(examples))))
        order = plan[b % len(plan) :] + plan[: b % len(plan)]  # rotate: no method always goes first
        result = {"examples": ids, "methods": {}}
        prompts = [examples[i].prompt for i in ids]
        for p in order:
            mine = counts if p["engine"] == "plugin" else None
            result["methods"][p["name"]] = decode_batch(
                engines[p["engine"]], prompts, args.max_tokens, stops, p["extra"], mine, shared
            )
        done.append(result)
        with open(journal, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(
            f"batch {b + 1}/{-(-len(examples) // args.batch)}: "
            + ", ".join(f"{n} {sum(g['tokens']) / g['seconds']:.2f} tok/s" for n, g in result["methods"].items()),
            flush=True,
        )


def _resume(journal: Path, settings: dict) -> list[dict]:
    """The finished batches of an earlier run with the same settings (a journal of other settings starts over)."""
    if journal.exists():
        lines = journal.read_text().splitlines()
        if lines and json.loads(lines[0]) == settings:
            return [json.loads(line) for line in lines[1:] if line.strip()]
    journal.write_text(json.dumps(settings) + "\n")
    return []


def _print(report: dict) -> None:
    m = report["machine"]
    print(
        f"\nvLLM CPU backend, {m['cpu']} (each engine's model on {m['threads']} cores: {m.get('cores')}), {m['dtype']}, "
        f"batch {report['settings']['batch']}"
    )
    base = report["baseline"]
    print(
        f"{'method':<28}{'tok/s':>8}{'time/tok vs ' + base + ' [95%]':>36}{'accept':>8}{'GSM8K':>7}{'minus it [95%]':>26}"
    )
    for name, r in report["methods"].items():
        if name in SUMMARY_ENTRIES:
            continue
        vs = r.get("time_per_token_vs_baseline")
        vs_text = (
            f"{vs:.3f} [{r['time_per_token_vs_baseline_ci'][0]:.3f}, {r['time_per_token_vs_baseline_ci'][1]:.3f}]"
            if vs
            else "1"
        )
        diff = r.get("accuracy_minus_baseline")
        diff_text = (
            f"{diff:+.3f} [{r['accuracy_minus_baseline_ci'][0]:+.3f}, {r['accuracy_minus_baseline_ci'][1]:+.3f}]"
            if diff is not None
            else "-"
        )
        acc = f"{r['acceptance']:.3f}" if r["acceptance"] is not None else "-"
        print(f"{name:<28}{r['tokens_per_s']:>8.2f}{vs_text:>36}{acc:>8}{r['accuracy']:>7.3f}{diff_text:>26}")
    if "plugin_overhead" in report["methods"]:
        o = report["methods"]["plugin_overhead"]
        print(
            f"plugin overhead: plugin lossless / vLLM lossless time per token {o['plugin_lossless_over_vllm_lossless']:.3f} "
            f"(same tokens: {o['same_tokens']})"
        )
    for name, b in report["methods"].get("kept_drafts_bound", {}).items():
        print(f"{name} over plugin lossless: {b['measured']:.3f} measured, {b['bound']:.3f} if steps cost the same")


if __name__ == "__main__":
    main()
