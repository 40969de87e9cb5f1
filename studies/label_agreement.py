"""Two consequence labellings of the same examples side by side: cost per labelled mismatch and agreement.

    python -m studies.label_agreement runs/records/gsm8k-horizon-16 runs/records/gsm8k-rejoin8-16 \
        --out runs/studies/rejoin8

REFERENCE is the full-answer search (branches decoded to their end), CANDIDATE a cheaper variant
(e.g. `consequence_rejoin: 8`, data_gen/rejoin.py) recorded on the same examples with the same pair.
A mismatch is compared where both folders tested it on the same answer: same example, position and
drafter token, and the same answer tokens up to it (after a verdict that differs, the two searches
walk different answers, and their later mismatches are different questions). Reports the agreement,
the confusion table (important/harmless in each), the share of the reference's mismatches the
candidate labelled the same way, and the seconds and decoded branch tokens per labelled mismatch of
each folder (from their manifests: `consequence_seconds` over every tested mismatch). A CANDIDATE
with no tested mismatch but short-horizon scores (configs/studies/gen/gsm8k-horizon.yaml) is compared by its
scores instead: ROC-AUC of the score against the reference's verdict on the same mismatches, and its
seconds per scored mismatch. Writes agreement.json and the compared mismatches (agreement.csv) to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def _mismatches(folder: str, column: str, value) -> dict:
    """{(example_id, position): (drafter token, answer prefix before the position, value(x))} of a
    folder's consequence rows where `value` of the column's entry x is not None."""
    from router.records import load_records

    rec = load_records(folder, mode="consequence")
    if column not in rec.column_names:
        return {}
    ids, pos, tok, q_arg, col = (np.asarray(rec[c]) for c in ("example_id", "position", "token", "q_argmax", column))
    out = {}
    for ex in np.unique(ids):
        rows = np.nonzero(ids == ex)[0]
        rows = rows[np.argsort(pos[rows])]
        answer = tok[rows].tolist()
        for k, i in enumerate(rows):
            if (x := value(col[i])) is not None:
                out[(str(ex), int(pos[i]))] = (int(q_arg[i]), tuple(answer[:k]), x)
    return out


def tested_mismatches(folder: str) -> dict:
    """{(example_id, position): (drafter token, answer prefix, label)} of a folder's tested mismatches
    (IMPORTANT or HARMLESS)."""
    from router.labels import HARMLESS, IMPORTANT

    return _mismatches(folder, "consequence", lambda x: int(x) if x in (IMPORTANT, HARMLESS) else None)


def scored_mismatches(folder: str) -> dict:
    """{(example_id, position): (drafter token, answer prefix, horizon_score)} wherever a folder holds
    a short-horizon score (e.g. configs/studies/gen/gsm8k-horizon.yaml: every mismatch, none tested)."""
    return _mismatches(folder, "horizon_score", lambda x: float(x) if np.isfinite(x) else None)


def score_agreement(reference: dict, scored: dict) -> tuple[dict, list[dict]]:
    """How well a short-horizon score ranks the reference's important mismatches above its harmless
    ones (ROC-AUC), over the mismatches both hold on the same answer."""
    from sklearn.metrics import roc_auc_score

    from router.labels import IMPORTANT

    rows = []
    for key, (d, prefix, lab) in sorted(reference.items()):
        other = scored.get(key)
        if other is not None and other[0] == d and other[1] == prefix:
            rows.append(
                {
                    "example_id": key[0],
                    "position": key[1],
                    "reference_important": int(lab == IMPORTANT),
                    "score": other[2],
                }
            )
    y = np.array([r["reference_important"] for r in rows])
    both = 0 < y.sum() < len(y)
    auc = float(roc_auc_score(y, [r["score"] for r in rows])) if both else float("nan")
    return {"compared": len(rows), "of_reference": len(reference), "important": int(y.sum()), "auc": auc}, rows


def costs(folder: str) -> dict:
    """Seconds, decoded branch tokens and tested mismatches of a folder, from its manifest's counts."""
    from router.records import read_manifest

    c = read_manifest(folder).counts
    tested = c.get("consequence_important", 0) + c.get("consequence_harmless", 0)
    return {
        "tested": tested,
        "important": c.get("consequence_important", 0),
        "seconds": c.get("consequence_seconds", float("nan")),
        "seconds_per_labelled_mismatch": c.get("consequence_seconds", float("nan")) / max(tested, 1),
        "branch_tokens_per_labelled_mismatch": c.get("consequence_branch_tokens", 0) / max(tested, 1),
        "horizon_seconds_per_mismatch": c.get("horizon_seconds", float("nan")) / max(c.get("horizon_mismatches", 0), 1),
        "rejoined_branches": c.get("consequence_rejoined_branches", 0),
        "spliced_tokens": c.get("consequence_spliced_tokens", 0),
    }


def compare(reference: dict, candidate: dict) -> tuple[dict, list[dict]]:
    """Agreement and confusion over the mismatches both tested on the same answer."""
    from router.labels import IMPORTANT

    rows = []
    for key, (d, prefix, lab) in sorted(reference.items()):
        other = candidate.get(key)
        if other is None or other[0] != d or other[1] != prefix:
            continue
        rows.append(
            {
                "example_id": key[0],
                "position": key[1],
                "reference_important": int(lab == IMPORTANT),
                "candidate_important": int(other[2] == IMPORTANT),
            }
        )
    ref = np.array([r["reference_important"] for r in rows], dtype=bool)
    cand = np.array([r["candidate_important"] for r in rows], dtype=bool)
    table = {
        "both_important": int((ref & cand).sum()),
        "both_harmless": int((~ref & ~cand).sum()),
        "reference_important_candidate_harmless": int((ref & ~cand).sum()),
        "reference_harmless_candidate_important": int((~ref & cand).sum()),
    }
    result = {
        "compared": len(rows),
        "of_reference": len(reference),
        "agreement": float((ref == cand).mean()) if rows else float("nan"),
        "important_recall": float(cand[ref].mean()) if ref.any() else float("nan"),
        "confusion": table,
    }
    return result, rows


def score_report(args, reference: dict, out: Path, cost: dict) -> int:
    """The comparison with a short-horizon-only candidate: written and printed."""
    from router.infra.files import write_csv, write_json

    result, rows = score_agreement(reference, scored_mismatches(args.candidate))
    result.update(reference=args.reference, candidate=args.candidate, costs=cost)
    write_json(out / "agreement.json", result)
    write_csv(out / "agreement.csv", ["example_id", "position", "reference_important", "score"], rows)
    print(
        f"{result['compared']} of the reference's {result['of_reference']} tested mismatches scored on the same "
        f"answer ({result['important']} important): ROC-AUC {result['auc']:.4f}; "
        f"{cost['candidate']['horizon_seconds_per_mismatch']:.3f} s per scored mismatch\n  {out}/agreement.json"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    from router.infra.files import write_csv, write_json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", help="consequence records with full-answer labels")
    parser.add_argument("candidate", help="consequence records of the same examples, labelled more cheaply")
    parser.add_argument("--out", default="runs/studies/label-agreement")
    args = parser.parse_args(argv)
    reference, candidate = tested_mismatches(args.reference), tested_mismatches(args.candidate)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cost = {"reference": costs(args.reference), "candidate": costs(args.candidate)}
    if not candidate:  # no tested mismatch: a short-horizon-only folder, compared by its scores
        return score_report(args, reference, out, cost)
    result, rows = compare(reference, candidate)
    result.update(reference=args.reference, candidate=args.candidate, costs=cost)
    write_json(out / "agreement.json", result)
    write_csv(out / "agreement.csv", ["example_id", "position", "reference_important", "candidate_important"], rows)
    ref, cand = cost["reference"], cost["candidate"]
    print(
        f"{result['compared']} mismatches tested on the same answer by both ({result['of_reference']} in the reference): "
        f"agreement {result['agreement']:.4f}, reference-important kept important {result['important_recall']:.4f}\n"
        f"  confusion {result['confusion']}\n"
        f"  seconds per labelled mismatch: reference {ref['seconds_per_labelled_mismatch']:.2f} "
        f"({ref['tested']} tested), candidate {cand['seconds_per_labelled_mismatch']:.2f} ({cand['tested']} tested, "
        f"{cand['rejoined_branches']} branches re-joined)\n  {out}/agreement.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
