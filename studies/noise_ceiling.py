"""The noise ceiling of answer-level labels: re-draw a sample of them, then measure how predictable they are.

    python -m studies.noise_ceiling --records runs/records/gsm8k-consequence-c --per-stratum 15 --k 4 \
        --temperature 0.7 --out runs/studies/noise

Samples problems of a consequence recording in four strata (data_gen/noise.py: verifier right with / without a
harm, wrong with / without a rescue), and at every tested mismatch of each lets the verifier finish the answer
K times at --temperature after the draft and K times after its own token (the recording's model pair, dtype
and metric). Resumable: rerun the same command after an interruption; a larger --per-stratum with the same
--seed grows the sample. `--analyse-only` skips sampling and reports what is there.

Writes to --out: redrawn.jsonl (the verdicts), noise.json (every figure, with 95% intervals over problems),
noise.csv (one row per mismatch: greedy sign, flip probability, accuracy change, rule scores) and noise.png
(the re-drawn flip probability per greedy class). The method: docs/method.md, "The labels' noise ceiling".
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path

import numpy as np

from data_gen.noise import (
    STRATA,
    labelled_mismatches,
    problem_strata,
    read_redrawn,
    sample_problems,
    write_redrawn,
)
from router.labels import SIGNED_LABELS

RULE_SCORES = ("kl_gate", "token_v3", "token_v2", "diff", "chow")  # defer scores whose AUC is set beside the ceiling


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", required=True, help="a consequence recording (specroute gen, modes [consequence])")
    ap.add_argument("--per-stratum", type=int, default=15, help="problems per stratum (default 15)")
    ap.add_argument("--k", type=int, default=4, help="continuations per side and mismatch (default 4)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-mismatches", type=int, default=2, help="mismatches per decoding batch (2k rows each)")
    ap.add_argument("--reps", type=int, default=1000, help="bootstrap replicates over problems")
    ap.add_argument("--analyse-only", action="store_true")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def _redraw_all(args, answers, sample, out: Path, settings: dict, recorder=None) -> dict:
    """Re-draw every sampled mismatch not yet in redrawn.jsonl, a batch at a time, saving after each."""
    from tqdm import tqdm

    from data_gen.config import GenConfig
    from data_gen.noise import LabelRedraw
    from data_gen.plan import load_examples
    from data_gen.recorder import Recorder

    path = out / "redrawn.jsonl"
    done = read_redrawn(path, settings)
    todo = [m for m in sample if m.key not in done]
    if args.analyse_only or not todo:
        return done
    if recorder is None:  # the recording's own pair, dtype, metric and stop strings
        cfg = GenConfig(**json.loads((Path(args.records) / "gen_config.json").read_text()))
        recorder = Recorder(cfg)
    cfg = recorder.cfg
    recorder.cfg.consequence_batch_size = 2 * args.k * args.batch_mismatches
    wanted = {m.example_id for m in sample}
    every = load_examples(cfg)
    examples = [ex for ex in every if ex.example_id in wanted]
    recorder.share_prefix(every)  # the recording's shared few-shot prefix, prefilled once
    redraw = LabelRedraw(recorder.search, args.k, args.temperature, args.seed)
    prompts = {ex.example_id: recorder.prompt_ids(ex) for ex in examples}
    metas = {ex.example_id: ex.meta for ex in examples}
    print(
        f"re-drawing {len(todo)} mismatches ({len(done)} done) on {recorder.dtype.name}, {platform.processor() or 'cpu'}"
    )
    started = time.perf_counter()
    with tqdm(total=len(todo), unit="mismatch") as bar:
        for lo in range(0, len(todo), args.batch_mismatches):
            batch = todo[lo : lo + args.batch_mismatches]
            for r in redraw.redraw(batch, prompts, answers, metas):
                done[r.key] = r
            write_redrawn(path, settings, done)
            bar.update(len(batch))
    print(f"re-drawn in {time.perf_counter() - started:.1f} s")
    return done


def _token_inputs(view, rows: np.ndarray, answer_len: np.ndarray) -> np.ndarray:
    """What a per-token router reads, without hidden states: the position features, the draft's class bits
    and its relative position in the answer (n, F + 6 + 1)."""
    import torch

    from router.features import class_bits

    view.judge_columns()  # loads the token class table
    bits = class_bits(torch.from_numpy(view.token_classes), torch.from_numpy(view.cols["q_argmax"][rows])).numpy()
    rel = view.cols["position"][rows] / np.maximum(answer_len, 1)
    return np.concatenate([view.features[rows], bits, rel[:, None]], 1).astype(np.float64)


def analyse(view, sample, sizes: dict, done: dict, answers: dict, reps: int) -> tuple[dict, list[dict]]:
    """Every figure of eval/noise_ceiling.py on the re-drawn part of the sample, with per-mismatch rows."""
    from eval import noise_ceiling as nc
    from router.offline.views import greedy_rule_scores

    have = [m for m in sample if m.key in done]
    if not have:
        raise SystemExit("nothing re-drawn yet: run without --analyse-only first")
    d = np.array([done[m.key].draft_correct for m in have])
    v = np.array([done[m.key].verifier_correct for m in have])
    sign = np.array([m.sign for m in have])
    problem = np.array([m.example_id for m in have])
    stratum_of = problem_strata(sample)[1]  # from every sampled mismatch of a problem, re-drawn or not
    stratum = [stratum_of[m.example_id] for m in have]
    # sample -> recording's problems: each stratum's problems over those of it re-drawn so far (a run cut short
    # has re-drawn fewer than it sampled)
    redrawn = {name: len({p for p, s in zip(problem, stratum) if s == name}) for name in sizes}
    sizes = {name: {**sizes[name], "redrawn": redrawn[name]} for name in sizes}
    w = np.array([sizes[s]["problems"] / sizes[s]["redrawn"] for s in stratum])
    rows = np.array([m.row for m in have])
    f, delta = nc.flip_and_delta(d, v)
    noise = nc.sampling_noise(d, v)
    x = _token_inputs(view, rows, np.array([len(answers[p]) for p in problem]))
    rules = greedy_rule_scores(view)
    result = {
        "mismatches": len(have),
        "problems": len(set(problem)),
        "strata": sizes,
        "signs": {n: int((sign == s).sum()) for n, s in SIGNED_LABELS.items()},
        "redraw": nc.redraw_agreement(d, v, sign, w),
        **nc.ceiling_numbers(d, v, sign, w, problem),
        "intervals": nc.bootstrap_problems(d, v, sign, w, problem, reps),
        "mean_flip": {n: float(f[sign == s].mean()) for n, s in SIGNED_LABELS.items()
                      if (sign == s).any()},
        "mean_delta": {n: float(delta[sign == s].mean()) for n, s in SIGNED_LABELS.items()
                       if (sign == s).any()},
        "problem_random_effect": {"delta": nc.problem_share(delta, noise, problem), "flip": nc.problem_share(f, noise, problem)},
        "explained_delta": nc.explained_shares(delta, noise, problem, x),
        "explained_flip": nc.explained_shares(f, noise, problem, x),
        "rule_auc_on_greedy": {r: nc.weighted_auc(rules[r][rows], sign != 0, w) for r in RULE_SCORES if r in rules},
        "flip_auc_by_rule_on_redrawn": {r: nc.weighted_auc(rules[r][rows], f > np.median(f), w) for r in RULE_SCORES if r in rules},
    }  # fmt: skip
    table = [
        {"key": m.key, "stratum": s, "sign": m.sign, "flip": fi, "delta": di, "noise": ni,
         **{r: float(rules[r][m.row]) for r in RULE_SCORES if r in rules}}
        for m, s, fi, di, ni in zip(have, stratum, f, delta, noise)
    ]  # fmt: skip
    return result, table


def _plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, sign in SIGNED_LABELS.items():
        values = [r["flip"] for r in table if r["sign"] == sign]
        if values:
            ax.hist(values, bins=np.linspace(0, 1, 11), alpha=0.5, label=f"greedy {name} ({len(values)})")
    ax.set_xlabel("re-drawn flip probability")
    ax.set_ylabel("mismatches")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(result: dict) -> list[str]:
    i = result["intervals"]
    r = result["redraw"]
    lines = [
        f"{result['mismatches']} mismatches in {result['problems']} problems ({result['signs']})",
        f"re-drawn label agrees with the greedy one (important/harmless, weighted): {result['agreement']:.3f} "
        f"[{i['agreement'][0]:.3f}, {i['agreement'][1]:.3f}]",
        *(f"  greedy {n}: re-drawn important {r[n]['redrawn_important']:.3f}, same sign {r[n]['redrawn_same_sign']:.3f}"
          for n in ("harm", "rescue", "neutral")),
        f"ceiling AUC (labels ~ Bernoulli(flip)): {result['ceiling_auc']:.3f} [{i['ceiling_auc'][0]:.3f}, {i['ceiling_auc'][1]:.3f}]; "
        f"flip probability's AUC on the greedy labels {result['flip_auc_on_greedy']:.3f} "
        f"[{i['flip_auc_on_greedy'][0]:.3f}, {i['flip_auc_on_greedy'][1]:.3f}]",
        f"problem share of the true variance: accuracy change {result['problem_share_delta']:.3f} "
        f"[{i['problem_share_delta'][0]:.3f}, {i['problem_share_delta'][1]:.3f}], flip {result['problem_share_flip']:.3f} "
        f"[{i['problem_share_flip'][0]:.3f}, {i['problem_share_flip'][1]:.3f}]",
        f"out-of-fold R^2 of the accuracy change (reliability {result['explained_delta']['reliability']:.3f}; "
        "share of its true variance): "
        + ", ".join(f"{k} {result['explained_delta'][k]['r2']:.3f} ({result['explained_delta'][k]['share_of_true_variance']:.3f})"
                    for k in ("token", "problem_others", "token_and_problem")),
        "rules' AUC on the greedy labels: " + ", ".join(f"{k} {v:.3f}" for k, v in result["rule_auc_on_greedy"].items()),
    ]  # fmt: skip
    return lines


def main(argv=None, recorder=None) -> None:
    """recorder: a data_gen.recorder.Recorder to re-draw with (tests); default: the recording's own."""
    args = parse(argv)
    from router.offline.inputs import RecordView

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    view = RecordView([args.records], "all", mode="consequence")
    mismatches, answers = labelled_mismatches(view.ds)
    sample, sizes = sample_problems(mismatches, args.per_stratum, args.seed)
    settings = {"records": str(args.records), "k": args.k, "temperature": args.temperature, "seed": args.seed}
    done = _redraw_all(args, answers, sample, out, settings, recorder)
    result, table = analyse(view, sample, sizes, done, answers, args.reps)
    result["settings"] = {**settings, "per_stratum": args.per_stratum, "strata": list(STRATA),
                          "machine": platform.processor() or platform.machine()}  # fmt: skip
    (out / "noise.json").write_text(json.dumps(result, indent=2))
    with open(out / "noise.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    _plot(table, out / "noise.png")
    print("\n".join(summary(result)))
    print(f"wrote {out / 'noise.json'}, noise.csv, noise.png")


if __name__ == "__main__":
    main()
