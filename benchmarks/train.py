"""Router training throughput (records/s per arch on CPU) and router inference cost per decoding
block as a fraction of one verifier forward, measured side by side in one run.

    python benchmarks/train.py [--rows 1000000] [--epochs 1]
Targets: one MLP epoch over 1M records in under a minute on 2 cores; router cost per block < 1%
of a verifier forward on the embedded pair (tiny pair when it is not installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from router.features import FEATURE_NAMES  # noqa: E402
from router.model import LearnedRouter, RouterConfig, RouterNet  # noqa: E402


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
        loss = torch.nn.functional.mse_loss(net(x[i: i + batch]), y[i: i + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - started


def router_block_cost(gamma: int = 5) -> dict:
    """Seconds of one router target() call on a block vs one verifier forward on the same block."""
    from router.layout import CachedModel, Layout
    from router.models import embedded_installed, load_pair
    from router.sampling import process_logits

    drafter, verifier, _ = load_pair() if embedded_installed() else load_pair("tiny:drafter", "tiny:verifier")
    vocab = verifier.get_output_embeddings().weight.shape[0]
    ids = torch.randint(100, 1000, (1, 200))
    layout, v = Layout(ids, torch.ones_like(ids)), CachedModel(verifier, vocab)
    with torch.inference_mode():
        v.feed(layout, layout.length - gamma, 1)
        started = time.perf_counter()
        logits = v.feed(layout, layout.length, gamma + 1)
        verifier_s = time.perf_counter() - started
        raw, p = process_logits(logits, 1.0, 1.0)
        router = LearnedRouter(RouterNet(RouterConfig(arch="mlp")))
        router.target(p, p, 0.3, q_raw=raw, p_raw=raw)  # warm-up
        started = time.perf_counter()
        for _ in range(10):
            router.target(p, p, 0.3, q_raw=raw, p_raw=raw)
        router_s = (time.perf_counter() - started) / 10
    return {"pair": "embedded" if embedded_installed() else "tiny", "verifier_forward_s": verifier_s,
            "router_target_s": router_s, "fraction": router_s / verifier_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", default="runs/bench/train.json")
    args = parser.parse_args()
    results = {"threads": torch.get_num_threads(), "rows": args.rows, "archs": {}}
    for arch in ("linear", "mlp", "gru"):
        rows = args.rows if arch != "gru" else args.rows // 10  # the GRU is measured on a tenth
        s = epoch_seconds(arch, rows)
        results["archs"][arch] = {"rows": rows, "seconds": s, "records_per_second": rows / s}
    results["block_cost"] = router_block_cost()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"router training, {results['threads']} threads, one epoch, batch 1024")
    for arch, r in results["archs"].items():
        print(f"  {arch:<7} {r['records_per_second']:>12,.0f} records/s  ({r['rows']:,} rows in {r['seconds']:.1f} s)")
    b = results["block_cost"]
    print(f"router target() per block (gamma 5, {b['pair']} pair): {b['router_target_s'] * 1e3:.2f} ms = "
          f"{100 * b['fraction']:.2f}% of one verifier forward ({b['verifier_forward_s'] * 1e3:.0f} ms)")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
