"""How far the signed measure's first-order estimate is from a real decode: predicted against measured accuracy.

    python -m studies.first_order_check --records runs/records/gsm8k-consequence-c --rule kl_gate --target 0.5 \
        --problems 100 --out runs/studies/first-order

The signed measure (eval/crossfit.py, docs/method.md) predicts a policy's accuracy change from labels tested one
swap at a time along the verifier's greedy answer: per problem +1 if it keeps a rescuing draft, -1 if it keeps a
harmful one. A real decode departs from that answer at the first kept mismatch, and later decisions fall on
another answer the labels never saw. This study decodes a seeded sample of the recording's problems with the
rule (greedy, --gamma drafts a block, the recording's pair, dtype, prompts, stop strings and metric) at the
alpha that defers at --target x the verifier's rejection rate on the recording, and with `lossless` (the
verifier's own answer: what the labels were measured against, here decoded again), and compares per problem
the predicted change with the measured one (the rule's verdict minus the lossless decode's).

Writes first_order.json (the summary and per-problem rows) and first_order.csv to --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", required=True, help="a consequence recording with tested mismatches")
    ap.add_argument("--rule", default="kl_gate", help="a rule with an offline greedy score (default kl_gate)")
    ap.add_argument("--target", type=float, default=0.5, help="deferral share of the mismatches (x the verifier's)")
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def predicted_changes(view, ids: np.ndarray, score: np.ndarray, alpha: float, problems: list[str]) -> dict[str, dict]:
    """Per problem the first-order change of deferring where score > alpha: +1 for a kept rescue on a wrong
    answer, -1 for a kept harm on a right one, and the kept mismatches whose consequence is unknown."""
    from router.labels import UNTESTED, first_order_change, signed_consequence

    signs = signed_consequence(view.cols["consequence"], view.cols["answer_correct"])
    kept = ~(score > alpha)
    mismatch = view.cols["q_argmax"] != view.cols["token"]
    place = {ex: i for i, ex in enumerate(problems)}
    rows = np.isin(ids, problems)  # the sampled problems' rows
    index = np.array([place[i] for i in ids[rows]], dtype=np.int64)
    change = first_order_change(signs[rows], kept[rows], index, len(problems))  # the measure eval.crossfit uses
    out = {}
    for p, ex in enumerate(problems):
        at = ids == ex
        out[ex] = {
            "predicted": int(change[p]),
            "kept_untested": int((kept & at & mismatch & (signs == UNTESTED)).sum()),
            "answer_correct": int(view.cols["answer_correct"][at][0]),
        }
    return out


def _ids(view) -> np.ndarray:
    return np.asarray(view.ds.select_columns(["example_id"])[:]["example_id"]).astype(str)


def rule_alpha(score: np.ndarray, cost: np.ndarray, target: float) -> float:
    """The alpha at which `score > alpha` defers at `target` of the mismatches (cost > 0): the verifier defers
    at all of them."""
    return float(np.quantile(score[cost > 0], 1 - target))


def decode(recorder, prompts: list[list[int]], rule, alpha: float, gamma: int, batch: int) -> tuple[list, float]:
    """Greedy answers of the prompts under the rule (the recording's stop strings and answer budget), and the
    seconds it took."""
    import torch
    from tqdm import tqdm

    from router.decoding import generate
    from router.loop.layout import left_pad

    search, budget, answers = recorder.search, recorder.cfg.consequence_max_new_tokens, []
    started = time.perf_counter()
    for lo in tqdm(range(0, len(prompts), batch), desc=f"{getattr(rule, 'name', rule)}", unit="batch"):
        rows = prompts[lo : lo + batch]
        ids, mask = left_pad(rows, recorder.pad_id)
        with torch.inference_mode():
            gen = generate(
                recorder.drafter, recorder.verifier, ids, rule=rule, alpha=alpha, gamma=gamma, temperature=0.0,
                max_new_tokens=budget, attention_mask=mask, stop=search.stop, prefix=recorder.prefix,
            )  # fmt: skip
        answers += [new[:budget] for new in gen.new_tokens()]
    return answers, time.perf_counter() - started


def compare(rows: list[dict], reps: int, seed: int = 0) -> dict:
    """Predicted against measured changes over problems: means, the paired difference with a bootstrap interval
    over problems, and how often the two agree per problem."""
    pred = np.array([r["predicted"] for r in rows], np.float64)
    real = np.array([r["measured"] for r in rows], np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(rows), (reps, len(rows)))
    gap = (real - pred)[draws].mean(1)
    confusion = {f"{p:+d}->{m:+d}": int(((pred == p) & (real == m)).sum()) for p in (-1, 0, 1) for m in (-1, 0, 1)}
    return {
        "problems": len(rows),
        "predicted_change": float(pred.mean()),
        "measured_change": float(real.mean()),
        "measured_minus_predicted": float((real - pred).mean()),
        "interval": [float(np.percentile(gap, 2.5)), float(np.percentile(gap, 97.5))],
        "same_per_problem": float((pred == real).mean()),
        "confusion_predicted_to_measured": {k: v for k, v in confusion.items() if v},
    }


def main(argv=None, recorder=None) -> dict:
    """recorder: a data_gen.recorder.Recorder to decode with (tests); default: the recording's own."""
    from data_gen.config import GenConfig
    from data_gen.plan import load_examples
    from data_gen.recorder import Recorder
    from router.offline.inputs import RecordView
    from router.offline.views import greedy_columns, greedy_rule_scores

    args = parse(argv)
    view = RecordView([args.records], "all", mode="consequence")
    score = greedy_rule_scores(view)[args.rule]
    alpha = rule_alpha(score, np.asarray(greedy_columns(view)["cost"]), args.target)
    ids = _ids(view)  # (N,) each row's problem
    problems = sorted(np.random.default_rng(args.seed).permutation(sorted(set(ids)))[: args.problems].tolist())
    predicted = predicted_changes(view, ids, score, alpha, problems)
    if recorder is None:
        recorder = Recorder(GenConfig(**json.loads((Path(args.records) / "gen_config.json").read_text())))
    examples = {ex.example_id: ex for ex in load_examples(recorder.cfg)}
    recorder.share_prefix(list(examples.values()))
    prompts = [recorder.prompt_ids(examples[p]) for p in problems]
    timing, verdicts = {}, {}
    for name, rule, a in (("lossless", "lossless", 0.0), (args.rule, args.rule, alpha)):
        answers, timing[name] = decode(recorder, prompts, rule, a, args.gamma, args.batch)
        verdicts[name] = [recorder.search.judge(t, examples[p].meta)[0] for t, p in zip(answers, problems)]
    rows = [
        {"problem": p, **predicted[p], "lossless_correct": verdicts["lossless"][i], "rule_correct": verdicts[args.rule][i],
         "measured": verdicts[args.rule][i] - verdicts["lossless"][i]}
        for i, p in enumerate(problems)
    ]  # fmt: skip
    result = {
        "settings": {**vars(args), "alpha": alpha, "dtype": recorder.dtype.name},
        "lossless_matches_recorded_verdict": float(np.mean([r["lossless_correct"] == r["answer_correct"] for r in rows])),
        "accuracy": {"recorded_verifier": float(np.mean([r["answer_correct"] for r in rows])),
                     "lossless": float(np.mean(verdicts["lossless"])), args.rule: float(np.mean(verdicts[args.rule]))},
        "kept_untested_per_problem": float(np.mean([r["kept_untested"] for r in rows])),
        "seconds": timing,
        **compare(rows, args.reps),
    }  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_order.json").write_text(json.dumps({**result, "rows": rows}, indent=2))
    with open(out / "first_order.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(
        f"{args.rule} alpha={alpha:.4g} ({args.target:g}x), {len(rows)} problems, {recorder.dtype.name}: predicted "
        f"{result['predicted_change']:+.4f}, measured {result['measured_change']:+.4f}, measured - predicted "
        f"{result['measured_minus_predicted']:+.4f} [{result['interval'][0]:+.4f}, {result['interval'][1]:+.4f}]; "
        f"same per problem {result['same_per_problem']:.3f}; lossless = recorded verdict on "
        f"{result['lossless_matches_recorded_verdict']:.3f}"
    )
    print(f"wrote {out / 'first_order.json'}, first_order.csv")
    return result


if __name__ == "__main__":
    main()
