"""What a deferral decision costs per block, next to the verifier forward it rides on.

For each plug-in rule and each router folder given, times `target(...)` on one block's inputs
(batch B, gamma drafts, the pair's vocabulary) as `router.decoding.generate` calls it (a judge gets
the loop's shifted view of p and the hidden state after each draft), side by side with the same
call as it was before the two speed-ups (the baseline): torch's unblocked reductions (max with
index, argmax, topk; before `router/reduce.py`) and features from the probabilities alone (two logs
over the vocabulary; the loop now also passes routers the logits, `router.features.log_probs_into`),
and divides by the verifier's forward over gamma + 1 tokens at that batch
(`router.machine.costs.measure_verify_curve`, the real model). Prints the CPU kind and dtype, writes JSON.

    python -m benchmarks.router_cost --routers runs/demo/long/routers/{mlp,token,judge} [--batch 1 4]
        [--gamma 5] [--rules token_v2 entropy_gate opt] [--tiny]
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from pathlib import Path

import torch

from router import reduce
from router.infra.clock import median_seconds
from router.machine.costs import measure_verify_curve
from router.machine.hardware import DTYPE_CHOICES, cpu_kind
from router.loop.common import shared_vocab
from router.model import load_router
from router.infra.embedded import embedded_installed
from router.pair import load_pair
from router.rules import get_rule, resolve_rule
from router.view import BlockView
from router.targets import trusted_inputs
from router.pair import tiny_pair


@contextmanager
def unblocked():
    """torch's own reductions everywhere (the baseline): no vocabulary width is blocked."""
    saved = reduce._block_width
    reduce._block_width = lambda v: None
    try:
        yield
    finally:
        reduce._block_width = saved


def block_views(policy, batch: int, gamma: int, vocab: int, hidden_sizes: dict) -> tuple:
    """(view with the logits, view without) shaped as one block of the loop, probabilities with a realistic
    peak: the loop hands a policy that reads logits the first; the second is the baseline's."""
    gen = torch.Generator().manual_seed(0)
    q_logits = torch.randn(batch, gamma, vocab, generator=gen) * 4
    p_logits = torch.randn(batch, gamma + 1, vocab, generator=gen) * 4  # (B, g+1, V)
    q, p_all = q_logits.softmax(-1), p_logits.softmax(-1)
    policy = resolve_rule(policy)
    kw = {"drafts": q.argmax(-1), "next_p_raw": p_all[:, 1:]}  # (B, g), (B, g, V)
    for role in policy.needs.hidden:
        kw[f"hidden_{role}"] = torch.randn(batch, gamma, hidden_sizes["drafter" if role == "drafter" else "verifier"])
    logits = {}
    if "logits" in policy.needs:
        logits = {"q_logits": q_logits, "p_logits": p_logits[:, :gamma], "next_p_logits": p_logits[:, 1:]}
    p = p_all[:, :gamma]
    return BlockView(q, p, q, p, **kw, **logits), BlockView(q, p, q, p, **kw)


def time_decide(policy, view, repeats: int) -> float:
    """Median seconds of one decide() call (after two warm-up calls)."""
    with torch.inference_mode(), trusted_inputs():
        return median_seconds({"decide": lambda: policy.decide(view, 0.3)}, repeats, warmup=2)["decide"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routers", nargs="*", default=[], help="router folders (specroute train outputs)")
    parser.add_argument("--rules", nargs="*", default=["token_v2", "entropy_gate", "opt"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="tiny random pair even if the embedded one is installed")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--out", default="runs/bench/router_cost.json")
    args = parser.parse_args()

    tiny = args.tiny or not embedded_installed()
    drafter, verifier, _ = tiny_pair() if tiny else load_pair(dtype=args.dtype)
    vocab = shared_vocab(drafter, verifier)
    sizes = {"drafter": drafter.config.hidden_size, "verifier": verifier.config.hidden_size}
    policies = [(name, get_rule(name)) for name in args.rules]
    policies += [(Path(f).name, load_router(f)) for f in args.routers]
    rows = []
    for batch in args.batch:
        forward = measure_verify_curve(verifier, batch, args.gamma + 1)[args.gamma]  # over gamma + 1 tokens
        for name, policy in policies:
            with_logits, without = block_views(policy, batch, args.gamma, vocab, sizes)
            now = time_decide(policy, with_logits, args.repeats)
            with unblocked():
                before = time_decide(policy, without, args.repeats)
            rows.append(
                {
                    "batch": batch,
                    "policy": name,
                    "seconds": now,
                    "seconds_baseline": before,
                    "verifier_forward_seconds": forward,
                    "share_of_verifier_forward": now / forward,
                    "share_baseline": before / forward,
                    "speedup": before / now,
                }
            )
    meta = {
        "cpu": cpu_kind(),
        "dtype": str(next(verifier.parameters()).dtype).removeprefix("torch."),
        "pair": "tiny" if tiny else "embedded",
        "gamma": args.gamma,
        "vocab": vocab,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"\n{meta['pair']} pair in {meta['dtype']} on {meta['cpu']}, gamma {args.gamma}, vocabulary {vocab}")
    print(
        f"{'batch':>5} {'policy':<16}{'ms/block':>10}{'% verifier fwd':>16}{'baseline ms':>14}{'% (baseline)':>15}"
        f"{'speedup':>9}"
    )
    for r in rows:
        print(
            f"{r['batch']:>5} {r['policy']:<16}{r['seconds'] * 1e3:>10.2f}{r['share_of_verifier_forward'] * 100:>15.2f}%"
            f"{r['seconds_baseline'] * 1e3:>14.2f}{r['share_baseline'] * 100:>14.2f}%{r['speedup']:>8.2f}x"
        )
    print(f"results: {out}")


if __name__ == "__main__":
    main()
