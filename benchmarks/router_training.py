"""Router training throughput (records/s per arch on CPU) and router inference cost per decoding
block as a fraction of one verifier forward, measured side by side in one run.

    python -m benchmarks.router_training [--rows 1000000] [--tiny]
Targets: one MLP epoch over 1M records in under a minute on 2 cores; router cost per block < 1%
of a verifier forward on the embedded pair (tiny pair when it is not installed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from router.infra.clock import median_seconds
from router.machine.hardware import cpu_kind
from router.features import FEATURE_NAMES
from router.model import LearnedRouter, RouterConfig, RouterNet


def epoch_seconds(arch: str, rows: int, batch: int = 1024) -> float:
    """One epoch of AdamW + MSE over `rows` random feature rows already in memory."""
    torch.manual_seed(0)
    net = RouterNet(RouterConfig(arch=arch))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    f = len(FEATURE_NAMES)
    x = torch.randn(rows, 4, f) if arch == "gru" else torch.randn(rows, f)
    y = torch.randn(rows)
    started = time.perf_counter()
    for i in range(0, rows, batch):
        loss = torch.nn.functional.mse_loss(net(x[i : i + batch]), y[i : i + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - started


def router_block_cost(gamma: int = 5, tiny: bool = False) -> dict:
    """Median seconds of target() on one block (as generate() calls it: trusted softmax inputs) for
    MLP routers (cascade and token head) and the plug-in rule opt, and of one verifier forward
    over the same block, measured side by side."""
    from router.loop.layout import CachedModel, Layout
    from router.infra.embedded import embedded_installed
    from router.pair import load_pair
    from router.rules import get_rule
    from router.targets import trusted_inputs
    from router.sampling import process_logits

    real = embedded_installed() and not tiny
    drafter, verifier, _ = load_pair() if real else load_pair("tiny:drafter", "tiny:verifier")
    vocab = verifier.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, min(1000, vocab), (1, 200))  # ids the tiny vocabulary holds too
    layout, v = Layout(ids, torch.ones_like(ids)), CachedModel(verifier, vocab)
    with torch.inference_mode(), trusted_inputs():
        v.feed(layout, layout.length - gamma - 1, 1)

        def verifier_block():
            v.crop_to(layout.length - gamma - 1)  # re-score the same block each time
            return v.feed(layout, layout.length, gamma + 1)

        verifier_s = median_seconds({"verifier": verifier_block}, 5)["verifier"]
        raw, p = process_logits(verifier_block(), 1.0, 1.0)  # (1, gamma+1, V)
        q = raw + 0.3 * torch.rand_like(raw) / raw.shape[-1]
        q = q / q.sum(-1, keepdim=True)  # another distribution of the same size
        methods = {
            "router_mlp_cascade": LearnedRouter(RouterNet(RouterConfig(arch="mlp"))),
            "router_mlp_token": LearnedRouter(RouterNet(RouterConfig(arch="mlp", head="token"))),
            "opt": get_rule("opt"),
            "token_v3": get_rule("token_v3"),
        }
        out = {
            "pair": "embedded" if real else "tiny",
            "verifier_forward_s": verifier_s,
            "dtype": str(verifier.dtype).removeprefix("torch."),
        }
        for name, rule in methods.items():
            s = median_seconds({name: lambda: rule.target(q, p, 0.3, q_raw=q, p_raw=raw)}, 20)[name]
            out[name] = {"target_s": s, "fraction": s / verifier_s}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None, help="rows per epoch (default 1,000,000; --tiny 20,000)")
    parser.add_argument("--tiny", action="store_true", help="the tiny pair and few rows: a smoke run in seconds")
    parser.add_argument("--out", default="runs/bench/train.json")
    args = parser.parse_args()
    args.rows = args.rows or (20_000 if args.tiny else 1_000_000)
    results = {"threads": torch.get_num_threads(), "cpu": cpu_kind(), "rows": args.rows, "archs": {}}
    for arch in ("linear", "mlp", "gru"):
        rows = args.rows if arch != "gru" else args.rows // 10  # the GRU is measured on a tenth
        s = epoch_seconds(arch, rows)
        results["archs"][arch] = {"rows": rows, "seconds": s, "records_per_second": rows / s}
    results["block_cost"] = router_block_cost(tiny=args.tiny)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"router training on {results['cpu']}, one epoch, batch 1024")
    for arch, r in results["archs"].items():
        print(f"  {arch:<7} {r['records_per_second']:>12,.0f} records/s  ({r['rows']:,} rows in {r['seconds']:.1f} s)")
    b = results["block_cost"]
    print(
        f"target() per block (gamma 5, {b['pair']} pair in {b['dtype']}) vs one verifier forward "
        f"({b['verifier_forward_s'] * 1e3:.1f} ms):"
    )
    for name, r in b.items():
        if isinstance(r, dict):
            print(f"  {name:<20} {r['target_s'] * 1e3:8.2f} ms = {100 * r['fraction']:.2f}%")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
