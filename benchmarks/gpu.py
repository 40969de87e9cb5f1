"""specroute on a GPU, at the embedded pair's shapes: model costs, the loop's own time per block, HF assisted
generation, and the projected time per token of each method, side by side in one run.

Needs torch, transformers, numpy and safetensors only: no network, no installs, no model files. It builds
the embedded pair's two Qwen2 architectures (Qwen2.5-Coder 0.5B drafter, 1.5B verifier) from their configs
with random weights (bf16 on cuda), so only the timings mean something. Per batch size and gamma:
- verifier-only and drafter-only ms/token (greedy decoding), the verifier's pass over 1..gamma+1 tokens
  and one drafter step (router.machine.costs);
- specroute's time per block outside the model forwards for lossless, token_v2, fly, a cascade, a token and
  a judge router (random weights), at forced all-accept and all-reject blocks (the method's decision work
  runs, its outcome is overridden), with every forward synchronised (router.loop.layout.SYNC_TIMING) so
  model seconds hold the kernels' time; host-device synchronisations per block outside the forwards
  (.item/.tolist/bool/int/float of a tensor, torch.cuda.synchronize) are counted;
- Hugging Face assisted generation at batch 1 on the same models (constant schedule, gamma drafts): its time
  per verifier call, beside specroute lossless's;
- the projected ms/token of each method at the acceptance rate measured on CPU for the real pair (a records
  folder's manifest, else 0.874, GSM8K greedy agreement), with the cost model of router.machine.costs.
No CUDA graphs and no torch.compile are used (stated in the output). --tiny runs the same on CPU with tiny
shapes (the default test run does: the GPU run cannot fail on a typo).

    python -m benchmarks.gpu [--tiny] [--batches 1 8] [--gammas 1 2 3 4 5 6 7 8] [--records DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from router.decoding import generate
from router.loop import layout as layout_module
from router.loop.baselines import generate_autoregressive
from router.machine.costs import block_seconds, measure_verify_curve, tokens_per_block
from router.model import LearnedRouter, RouterConfig, RouterNet
from router.rules import resolve_rule

# the embedded pair's configs (router/infra/embedded.py's models), checked against them by tests/benchmarks/test_benchmarks.py
QWEN = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6, hidden_act="silu")
PAIR_SHAPES = {
    "drafter": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "verifier": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
}
TINY_SHAPES = {
    "drafter": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    "verifier": dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4),
}
DEFAULT_ACCEPTANCE = 0.874  # greedy drafter/verifier agreement of the real pair on GSM8K (CPU records, bf16)
SCHEDULE = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
METHODS = ("lossless", "token_v2", "fly", "cascade_router", "token_router", "judge_router")
ALPHAS = {"token_v2": 0.3, "fly": 0.3}


def build_pair(tiny: bool, device: str, dtype: torch.dtype):
    """(drafter, verifier) with random weights at the embedded pair's shapes (or tiny ones)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    models = []
    for seed, role in enumerate(("drafter", "verifier")):
        extra = dict(QWEN, vocab_size=512) if tiny else QWEN
        cfg = Qwen2Config(**extra, **(TINY_SHAPES if tiny else PAIR_SHAPES)[role], num_key_value_heads=2)
        cfg.tie_word_embeddings = False
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).eval()
        model.generation_config.eos_token_id = None  # rows run to the length limit: blocks of known count
        model.generation_config.pad_token_id = 0
        models.append(model)
    return tuple(models)


class Forced:
    """A method whose decision work runs every block but whose outcome is forced: every draft accepted
    (pi one-hot on the draft) or the first one rejected (one-hot on another token)."""

    def __init__(self, policy, accept: bool):
        inner = resolve_rule(policy)
        self.inner, self.accept, self.name = inner, accept, f"{inner.name}/{'accept' if accept else 'reject'}"
        self.form, self.exact_bonus, self.offline_only, self.trained_pair, self.greedy_mode = (
            "judge", False, None, None, False,
        )  # fmt: skip
        # it decides drafted tokens (the forced outcome) and reads whatever its policy reads
        self.needs, self.min_gamma = dataclasses.replace(inner.needs, inputs=inner.needs.inputs | {"drafts"}), 1

    def check_alpha(self, alpha):
        return self.inner.check_alpha(alpha)

    def decide(self, view, alpha):
        self.inner.decide(view, alpha)  # the work a block pays for
        drafts, vocab = view.drafts, view.q.shape[-1]
        token = drafts if self.accept else (drafts + 1) % vocab
        return torch.nn.functional.one_hot(token, vocab).to(view.p.dtype)


def random_routers(vocab: int) -> dict:
    """A cascade, a token and a judge router with random weights (their cost, not their decisions)."""
    out = {}
    for name, cfg in (
        ("cascade_router", RouterConfig(head="cascade")),
        ("token_router", RouterConfig(head="token", token_candidates=8)),
        ("judge_router", RouterConfig(head="judge", vocab=vocab)),
    ):
        torch.manual_seed(0)
        out[name] = LearnedRouter(RouterNet(cfg), name=name)
    return out


@contextlib.contextmanager
def counted_syncs():
    """Counts host-device synchronisations outside model forwards: tensor .item/.tolist/bool/int/float and
    torch.cuda.synchronize (on a CPU they are not syncs, but the same calls would be on a GPU)."""
    counts = {"calls": 0}
    active = [True]
    patched = [(torch.Tensor, n) for n in ("item", "tolist", "__bool__", "__int__", "__float__")]
    originals = {(o, n): getattr(o, n) for o, n in patched}
    feed = layout_module.CachedModel.feed

    def wrap(fn):
        def counted(*a, **k):
            counts["calls"] += active[0]
            return fn(*a, **k)

        return counted

    def quiet_feed(self, *a, **k):  # calls inside a forward belong to the model, not the loop
        active[0] = False
        try:
            return feed(self, *a, **k)
        finally:
            active[0] = True

    for (owner, name), fn in originals.items():
        setattr(owner, name, wrap(fn))
    layout_module.CachedModel.feed = quiet_feed
    try:
        yield counts
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)
        layout_module.CachedModel.feed = feed


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def loop_overhead(drafter, verifier, policy, batch: int, gamma: int, accept: bool, blocks: int, device: str) -> dict:
    """ms per block outside the forwards, its share of the block, and syncs per block, for a forced outcome."""
    ids = torch.randint(3, 500, (batch, 16), generator=torch.Generator().manual_seed(batch)).to(device)
    per_block_tokens = gamma + 1 if accept else 1
    kw = dict(
        rule=Forced(policy, accept), alpha=ALPHAS.get(getattr(policy, "name", policy), 0.0), gamma=gamma,
        max_new_tokens=per_block_tokens * blocks + 1, check_pair=False,
    )  # fmt: skip
    generate(drafter, verifier, ids, **kw)  # warm-up: kernels for these shapes
    best = None
    for _ in range(2):
        with counted_syncs() as counts:
            sync(device)
            out = generate(drafter, verifier, ids, **kw)
        s = out.stats
        own = s["wall_seconds"] - s["drafter_seconds"] - s["verifier_seconds"]
        row = dict(
            ms_per_block=1e3 * own / s["blocks"], share=own / s["wall_seconds"],
            block_ms=1e3 * s["wall_seconds"] / s["blocks"], syncs_per_block=counts["calls"] / s["blocks"],
        )  # fmt: skip
        best = row if best is None or row["ms_per_block"] < best["ms_per_block"] else best
    return best


def model_costs(drafter, verifier, batch: int, max_gamma: int, device: str, tokens: int) -> dict:
    """Autoregressive ms/token of each model, the verifier's pass over 1..max_gamma+1 tokens, a drafter step."""
    ids = torch.randint(3, 500, (batch, 16), generator=torch.Generator().manual_seed(7)).to(device)
    out = {}
    for role, model in (("verifier", verifier), ("drafter", drafter)):
        generate_autoregressive(model, ids, role=role, max_new_tokens=4)  # warm-up
        sync(device)
        started = time.perf_counter()
        generate_autoregressive(model, ids, role=role, max_new_tokens=tokens)
        sync(device)
        out[f"{role}_ms_per_token"] = 1e3 * (time.perf_counter() - started) / tokens
    out["verify_ms"] = [1e3 * s for s in measure_verify_curve(verifier, batch, max_gamma + 1)]
    out["drafter_step_ms"] = 1e3 * measure_verify_curve(drafter, batch, 1)[0]
    return out


def hf_assisted(drafter, verifier, gamma: int, tokens: int, device: str) -> dict:
    """transformers' assisted generation at batch 1: ms per verifier call and per token."""
    calls, drafts = [0], [0]  # verifier and drafter forwards
    hook = verifier.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    draft_hook = drafter.register_forward_pre_hook(lambda *a: drafts.__setitem__(0, drafts[0] + 1))
    ids = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)
    kw = dict(
        assistant_model=drafter, do_sample=False, num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0, attention_mask=torch.ones_like(ids), pad_token_id=0,
    )  # fmt: skip
    # transformers reads the schedule from the assistant's own generation config (the keywords alone leave
    # its default there, which after rejections falls to one draft per call)
    saved = {k: getattr(drafter.generation_config, k, None) for k in SCHEDULE}
    for k in SCHEDULE:
        setattr(drafter.generation_config, k, kw[k])
    try:
        verifier.generate(ids, max_new_tokens=4, **kw)  # warm-up
        calls[0] = drafts[0] = 0
        sync(device)
        started = time.perf_counter()
        out = verifier.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
        sync(device)
        seconds = time.perf_counter() - started
    finally:
        hook.remove()
        draft_hook.remove()
        for k, value in saved.items():
            setattr(drafter.generation_config, k, value)
    new = out.shape[1] - ids.shape[1]
    return {
        "ms_per_verifier_call": 1e3 * seconds / max(calls[0], 1),
        "ms_per_token": 1e3 * seconds / new,
        "drafter_calls_per_verifier_call": drafts[0] / max(calls[0], 1),
    }


def lossless_batch1(drafter, verifier, gamma: int, tokens: int, device: str) -> dict:
    """specroute lossless at batch 1 on the same prompt as hf_assisted: ms per verifier call and per token."""
    ids = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)
    generate(drafter, verifier, ids, rule="lossless", gamma=gamma, max_new_tokens=4)
    sync(device)
    started = time.perf_counter()
    out = generate(drafter, verifier, ids, rule="lossless", gamma=gamma, max_new_tokens=tokens)
    sync(device)
    seconds = time.perf_counter() - started
    return {
        "ms_per_verifier_call": 1e3 * seconds / out.stats["verifier_forwards"],
        "ms_per_token": 1e3 * seconds / out.stats["new_tokens"],
        "drafter_calls_per_verifier_call": out.stats["drafter_forwards"] / out.stats["verifier_forwards"],
    }


def projected_ms_per_token(costs: dict, overhead_ms: float, gamma: int, acceptance: float) -> float:
    """The cost model's ms/token (router.machine.costs): gamma drafter steps, one verifier pass over gamma + 1
    tokens (bonus from the verifier: no extra drafter step) and the loop's own time, per expected tokens."""
    block = block_seconds(gamma, acceptance, costs["drafter_step_ms"], costs["verify_ms"][gamma], bonus_drafter=False)
    return float((block + overhead_ms) / tokens_per_block(acceptance, gamma))


def acceptance_of(records: str | None) -> tuple[float, str]:
    """Greedy drafter/verifier agreement from a records folder's manifest.json (plain JSON), else the default."""
    if records:
        manifest = json.loads((Path(records) / "manifest.json").read_text())
        return float(manifest["drafter_verifier_top1_agreement"]), f"{records}/manifest.json"
    return DEFAULT_ACCEPTANCE, "default: GSM8K greedy agreement of the real pair on CPU (bf16)"


def environment(device: str, dtype: torch.dtype) -> dict:
    import transformers

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    if gpu is None:
        from router.machine.hardware import cpu_kind

        gpu = f"none (CPU: {cpu_kind()})"
    return dict(
        torch=torch.__version__, transformers=transformers.__version__, device=device, gpu=gpu, dtype=str(dtype),
        cuda_graphs=False, torch_compile=False,
    )  # fmt: skip


def run(args) -> dict:
    device = args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if args.tiny or (device == "cpu" and args.dtype == "auto") else torch.bfloat16
    if args.dtype != "auto":
        dtype = getattr(torch, args.dtype)
    drafter, verifier = build_pair(args.tiny, device, dtype)
    policies = {**{m: m for m in METHODS if "router" not in m}, **random_routers(verifier.config.vocab_size)}
    for router in policies.values():
        if isinstance(router, LearnedRouter):
            router.net.to(device)
    acceptance, source = acceptance_of(args.records)
    result = {"environment": environment(device, dtype), "acceptance": acceptance, "acceptance_source": source}
    result["shapes"] = "tiny" if args.tiny else "embedded pair (Qwen2.5-Coder 0.5B / 1.5B), random weights"
    started = time.perf_counter()
    layout_module.SYNC_TIMING = True
    try:
        for batch in args.batches:
            costs = model_costs(drafter, verifier, batch, max(args.gammas), device, args.tokens)
            per_gamma = {}
            for gamma in args.gammas:
                rows = {}
                for name, policy in policies.items():
                    if name == "fly" and gamma < 7:  # fly's window needs 7 drafts per block (router/window/fly.py)
                        continue
                    rows[name] = {
                        outcome: loop_overhead(drafter, verifier, policy, batch, gamma, outcome == "accept", args.blocks, device)
                        for outcome in ("accept", "reject")
                    }  # fmt: skip
                    worst = max(r["ms_per_block"] for r in rows[name].values())
                    rows[name]["projected_ms_per_token"] = projected_ms_per_token(costs, worst, gamma, acceptance)
                per_gamma[gamma] = rows
                print(f"  batch {batch} gamma {gamma}: {time.perf_counter() - started:.0f} s", flush=True)
            result[f"batch_{batch}"] = {"costs": costs, "gammas": per_gamma}
        layout_module.SYNC_TIMING = False  # end-to-end comparisons run without the timing syncs
        result["hf_batch_1"] = {
            g: {"hf_assisted": hf_assisted(drafter, verifier, g, args.tokens, device),
                "specroute_lossless": lossless_batch1(drafter, verifier, g, args.tokens, device)}
            for g in args.gammas
        }  # fmt: skip
    finally:
        layout_module.SYNC_TIMING = False
    result["seconds"] = time.perf_counter() - started
    return result


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"GPU {env['gpu']}, {env['device']}, {env['dtype']}, torch {env['torch']}, transformers {env['transformers']}; "
        f"CUDA graphs: {env['cuda_graphs']}, torch.compile: {env['torch_compile']}; {result['shapes']}; acceptance "
        f"{result['acceptance']:.3f} ({result['acceptance_source']}); {result['seconds']:.0f} s.",
        "",
        "| batch | gamma | method | loop ms/block (accept / reject) | share of block | syncs/block | projected ms/token |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, block in result.items():
        if not key.startswith("batch_"):
            continue
        batch, costs = key.split("_")[1], block["costs"]
        lines.append(
            f"| {batch} | - | verifier alone | - | - | - | {costs['verifier_ms_per_token']:.2f} "
            f"(drafter {costs['drafter_ms_per_token']:.2f}) |"
        )
        for gamma, rows in block["gammas"].items():
            for name, r in rows.items():
                a, j = r["accept"], r["reject"]
                lines.append(
                    f"| {batch} | {gamma} | {name} | {a['ms_per_block']:.2f} / {j['ms_per_block']:.2f} | "
                    f"{max(a['share'], j['share']):.1%} | {a['syncs_per_block']:.1f} / {j['syncs_per_block']:.1f} | "
                    f"{r['projected_ms_per_token']:.2f} |"
                )
    lines += ["", "| gamma | HF assisted ms/verifier call | specroute lossless ms/verifier call | HF ms/token | lossless "
              "ms/token | drafter calls per verifier call (HF / specroute) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for gamma, r in result["hf_batch_1"].items():
        hf, ours = r["hf_assisted"], r["specroute_lossless"]
        lines.append(
            f"| {gamma} | {hf['ms_per_verifier_call']:.2f} | {ours['ms_per_verifier_call']:.2f} | "
            f"{hf['ms_per_token']:.2f} | {ours['ms_per_token']:.2f} | {hf['drafter_calls_per_verifier_call']:.2f} / "
            f"{ours['drafter_calls_per_verifier_call']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (seconds; what the tests run)")
    parser.add_argument("--device", default=None, help="default: cuda when available (cpu with --tiny)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 8 (tiny: 1 2)")
    parser.add_argument("--gammas", type=int, nargs="+", default=None, help="default 1..8 (tiny: 1 2 7)")
    parser.add_argument("--blocks", type=int, default=None, help="blocks per timed run (default 8, tiny 3)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per ms/token run (default 64, tiny 8)")
    parser.add_argument("--records", default=None, help="a records folder whose acceptance the projection uses")
    parser.add_argument("--out", default="runs/bench/gpu", help="results path without suffix (.json and .md)")
    args = parser.parse_args(argv)
    args.batches = args.batches or ([1, 2] if args.tiny else [1, 8])
    args.gammas = args.gammas or ([1, 2, 7] if args.tiny else list(range(1, 9)))
    args.blocks = args.blocks or (3 if args.tiny else 8)
    args.tokens = args.tokens or (8 if args.tiny else 64)
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    out.with_suffix(".md").write_text(table)
    print("\n" + table + f"results: {out.with_suffix('.json')}, {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
