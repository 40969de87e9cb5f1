"""What the vLLM plugin's acceptance step costs per verification step, outside vLLM (pure torch, no vLLM needed).

The plugin replaces vLLM's rejection step with router/vllm/acceptance.py: an all-greedy step reads each policy's
verdict per draft (router/greedy.py); a step with sampled requests scales both models' logits at each draft, takes
the policy's pi and accepts toward it (`--full-path` times that path too, on the same greedy step). vLLM's own greedy acceptance compares each
draft with the verifier's argmax. This times both on the same random logits of B requests x K drafts x V entries
(the real pair's vocabulary by default), interleaved, and states each as a share of a verifier step given in
seconds (`--verifier-step`, e.g. 8 / the verifier's tokens per second at 8 concurrent requests in
benchmarks.serve_vllm). Prints the CPU, threads and dtype; writes JSON.

    python -m benchmarks.vllm_acceptance [--batch 8] [--drafts 4] [--vocab 151936] [--threads 2]
        [--policies lossless token_v2@0.3776 kl_gate@1.0506 runs/routers/token@0.0535] [--verifier-step 0.1955]
        [--repeats 20] [--full-path] [--out runs/bench/vllm_acceptance.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from router.infra.clock import median_seconds
from router.reduce import fast_argmax


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--policies", nargs="+", default=["lossless", "token_v2@0.3776", "kl_gate@1.0506"])
    ap.add_argument("--verifier-step", type=float, default=None, help="seconds of one verifier step to compare with")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument(
        "--full-path",
        action="store_true",
        help="also time each policy on the full path (pi over the vocabulary), which sampled steps take",
    )
    ap.add_argument("--out", default="runs/bench/vllm_acceptance.json")
    return ap.parse_args(argv)


def greedy_step(b: int, k: int, v: int, seed: int = 0):
    """A step of b greedy requests with k drafts each over v entries: the drafts are the drafter's argmax."""
    from router.vllm.acceptance import Drafted, Sampling

    gen = torch.Generator().manual_seed(seed)
    q_logits = torch.randn(b, k, v, generator=gen) * 3  # (B, K, V)
    logits = q_logits + torch.randn(b, k, v, generator=gen) * 2  # (B, K, V) a verifier that mostly agrees
    sampling = Sampling(torch.zeros(b), torch.zeros(b, dtype=torch.long), torch.ones(b), [None] * b)
    bonus = torch.zeros(b, dtype=torch.long)
    return Drafted(q_logits.argmax(-1), torch.full((b,), k), q_logits, logits, None, bonus, sampling)


def vllms_greedy_acceptance(step) -> torch.Tensor:
    """What vLLM's own greedy rejection step computes: the verifier's argmax at each draft, the accepted prefix
    (B,) where drafts match it."""
    target = fast_argmax(step.target_logits)  # (B, K)
    return (step.drafts == target).long().cumprod(-1).sum(-1)


def policy_of(spec: str):
    """(policy, alpha) from RULE@ALPHA or ROUTER_DIR@ALPHA."""
    from router.vllm.settings import load_policy

    name, _, alpha = spec.partition("@")
    return load_policy(name, "--policies"), float(alpha or 0.0)


def main(argv=None) -> dict:
    args = _args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from router.machine.hardware import cpu_kind
    from router.vllm.acceptance import accept

    step = greedy_step(args.batch, args.drafts, args.vocab)
    fns = {"vllm greedy acceptance": lambda: vllms_greedy_acceptance(step)}
    for spec in args.policies:
        policy, alpha = policy_of(spec)
        fns[f"plugin {spec}"] = lambda p=policy, a=alpha: accept(p, a, step)
        if args.full_path:
            fns[f"plugin {spec} (full pi)"] = lambda p=policy, a=alpha: accept(p, a, step, sparse=False)
    with torch.inference_mode():
        seconds = median_seconds(fns, args.repeats)
    rows = {
        name: {
            "ms_per_step": s * 1e3,
            "share_of_verifier_step": s / args.verifier_step if args.verifier_step else None,
        }
        for name, s in seconds.items()
    }
    report = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"cpu": cpu_kind(), "threads": torch.get_num_threads(), "dtype": "float32 logits"},
        "steps": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    _print(report, args)
    return report


def _print(report: dict, args) -> None:
    print(
        f"acceptance step, {args.batch} requests x {args.drafts} drafts x {args.vocab} entries, greedy; "
        f"{report['machine']['cpu']}, torch threads {report['machine']['threads']}, float32 logits"
    )
    for name, row in report["steps"].items():
        share = row["share_of_verifier_step"]
        tail = f"  {share:.1%} of a {args.verifier_step * 1e3:.1f} ms verifier step" if share is not None else ""
        print(f"{name:<44}{row['ms_per_step']:>9.2f} ms{tail}")


if __name__ == "__main__":
    main()
