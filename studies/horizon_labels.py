"""Short-horizon (SelfJudge) scores against full-answer consequence labels, on the same mismatches.

    python -m studies.horizon_labels runs/records/gsm8k-consequence-snap --out runs/studies/horizon

For every tested mismatch of a consequence record folder (IMPORTANT or HARMLESS, found by letting the
verifier finish the whole answer), computes SelfJudge's score_H (data_gen/horizon.py, from the shared few-shot prefix's cache) for H in
0/5/10/20 and reports how well each separates important from harmless: ROC-AUC over all tested
mismatches, and the agreement at a threshold chosen on half the examples (even positions in id
order), measured on the other half; plus the CPU seconds per mismatch. The continuation after the
verifier's own token is needed: at important (and untested) mismatches the recorded answer holds it;
at harmless ones the search kept the drafter's token, so it is regenerated (H greedy verifier tokens
after the verifier's token, from the example's cache), and that regeneration is counted in the seconds.
Writes horizon.json and per-mismatch rows (horizon.csv) to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(positive, score)) if 0 < positive.sum() < len(positive) else float("nan")


def _agreement(score, positive, fit) -> tuple[float, float]:
    """(threshold chosen on the `fit` rows for the best accuracy, accuracy on the others)."""
    cands = np.unique(score[fit])
    accs = [((score[fit] > c) == positive[fit]).mean() for c in cands]
    tau = float(cands[int(np.argmax(accs))])
    held = ~fit
    return tau, float(((score[held] > tau) == positive[held]).mean())


def _example_rows(view, idx):
    order = idx[np.argsort(view.cols["position"][idx])]
    return order


def main(argv: list[str] | None = None, recorder=None) -> int:
    """recorder: a data_gen Recorder over the pair the records were made with (default: built from
    the folder's gen_config.json)."""
    import torch

    from data_gen.config import GenConfig
    from data_gen.horizon import HORIZONS, horizon_scores
    from data_gen.plan import load_examples
    from data_gen.recorder import Recorder
    from router.infra.files import write_csv, write_json
    from router.offline.inputs import RecordView
    from router.labels import HARMLESS, IMPORTANT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", help="a consequence record folder (with manifest; see `specroute snapshot`)")
    parser.add_argument("--out", default="runs/studies/horizon")
    parser.add_argument("--max-examples", type=int, default=None)
    args = parser.parse_args(argv)
    raw = json.loads((Path(args.records) / "gen_config.json").read_text())
    cfg = GenConfig(**{**raw, "output": args.records})
    recorder = recorder or Recorder(cfg)
    verifier = recorder.verifier
    examples = {ex.example_id: ex for ex in load_examples(cfg)}
    recorder.share_prefix(list(examples.values()))  # the few-shot context's cache, prefilled once
    view = RecordView([args.records], "all", "consequence")
    label, ids = view.cols["consequence"], np.asarray(view.traj)
    rows, started = [], time.perf_counter()
    for n, key in enumerate(sorted(set(ids.tolist()))):
        if args.max_examples and n >= args.max_examples:
            break
        idx = _example_rows(view, np.nonzero(ids == key)[0])
        ex_id = key[: -len("consequence")]
        prompt, _ = recorder.prepare(examples[ex_id], "consequence")
        tokens = view.cols["token"][idx].tolist()
        tested = [
            (int(view.cols["position"][i]), int(view.cols["q_argmax"][i]), int(view.cols["p_argmax"][i]), int(label[i]))
            for i in idx
            if label[i] in (IMPORTANT, HARMLESS)
        ]
        regenerate = {(t, d): v for t, d, v, lab in tested if lab == HARMLESS}  # the search kept d there
        pairs = [(t, d) for t, d, _, _ in tested]
        scores = horizon_scores(verifier, prompt, tokens, pairs, regenerate=regenerate, prefix=recorder.prefix)
        found = dict(zip(pairs, scores))
        for t, d, v, lab in tested:
            rows.append(
                {
                    "example_id": ex_id,
                    "position": t,
                    "important": int(lab == IMPORTANT),
                    **{f"score_{h}": float(found[(t, d)][j]) for j, h in enumerate(HORIZONS)},
                }
            )
        print(f"[horizon] {n + 1} examples, {len(rows)} mismatches, {time.perf_counter() - started:.0f} s", flush=True)
    seconds = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "horizon.csv", list(rows[0]), rows)
    positive = np.array([r["important"] for r in rows], dtype=bool)
    order = sorted({r["example_id"] for r in rows})
    fit = np.array([order.index(r["example_id"]) % 2 == 0 for r in rows])
    result = {
        "records": args.records,
        "mismatches": len(rows),
        "important": int(positive.sum()),
        "examples": len(order),
        "seconds": seconds,
        "seconds_per_mismatch": seconds / max(len(rows), 1),
        "dtype": str(verifier.dtype),
        "torch": torch.__version__,
        "horizons": {},
    }
    for h in HORIZONS:
        score = np.array([r[f"score_{h}"] for r in rows])
        tau, acc = _agreement(score, positive, fit)
        result["horizons"][h] = {
            "auc": _auc(score, positive),
            "threshold": tau,
            "held_out_agreement": acc,
            "held_out_majority": float(max(positive[~fit].mean(), 1 - positive[~fit].mean())),
        }
        print(
            f"  H={h:2d}: AUC {result['horizons'][h]['auc']:.4f}, agreement on held-out half {acc:.4f} "
            f"(threshold {tau:.4f}; always-harmless {result['horizons'][h]['held_out_majority']:.4f})"
        )
    write_json(out / "horizon.json", result)
    print(
        f"  {len(rows)} mismatches in {seconds:.0f} s ({result['seconds_per_mismatch']:.2f} s each); {out}/horizon.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
