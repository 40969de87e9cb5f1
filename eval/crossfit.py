"""Out-of-fold evaluation of cross-fitted routers (`specroute train cross_fit=K`), no model calls.

Every labelled example is scored once, by the fold router that never saw it (checked: a router whose
training or validation examples include one it would be scored on is refused). Greedy view (the
drafter drafts its argmax d; a method keeps d or takes the verifier's argmax). For each fold and each
method (the router, every plug-in rule with an offline score), the threshold is chosen on the fold's
inner validation examples to reach each target rejection rate, a fraction of the verifier's own
(lossless defers at every mismatch), and applied to the fold's scored examples. The best rule is
chosen per fold on the same validation examples, by the same measure. Measures per example:
- gold mode: emitted tokens equal to the gold one (quality, higher is better);
- consequence mode (answer-level): of the tested mismatches, the share of IMPORTANT ones the method
  keeps (lower is better) and of HARMLESS ones (higher is better); and `signed`, the expected accuracy
  change against the verifier, first order: per problem +1 where the method keeps a rescue (the verifier's
  answer is wrong and that draft makes it right), -1 where it keeps a harm (right, and the draft makes it
  wrong), averaged over problems (higher is better; router.labels.signed_consequence). An untested mismatch counts
  toward the rejection rate like any other (deferring there costs a verifier step) and in neither
  share (its consequence is unknown). Where the records hold short-horizon scores (data_gen/horizon.py),
  also `horizon`: the share of the mismatches' summed score (clipped at 0) a method keeps, lower is
  better; records with scores but no tested mismatch (short-horizon labels only) are scored, and
  their best rule chosen, by it alone.
Intervals: paired percentile bootstrap over examples, method minus the per-fold best rule, and minus
the best rule in hindsight (the one rule best on the scored examples: eval/crossfit_summary.py).

Matched operating points (`matched=True`, populations "...-matched"): a threshold chosen on validation
examples reaches its target there, not on the scored ones, so two methods' realised rejection rates can
differ (by 15% or more on 150 examples), and a method that rejects more keeps fewer important mismatches
for that reason alone. Matched, each method's threshold is set on the fold's scored rows themselves to
reach the target rejection rate exactly: it reads their scores and where deferring costs a rejection,
never their labels (an operating point fixed by a deferral budget, as in selective prediction at equal
coverage), so every method is compared at the same rejection rate; the best rule is still chosen on the
validation examples, at their own matched operating point (the same top-scored share of the rows where
deferring costs a rejection), so that the choice, like the comparison, is made at equal rejection rates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from eval.crossfit_summary import BOOTSTRAP, HIGHER_IS_BETTER, ORACLE, REFERENCES, summarise
from router.model import RouterError, load_router
from router.offline.folds import fold_folder, read_plan
from router.offline.inputs import RecordView, router_scores
from router.offline.views import example_index, greedy_columns, greedy_rule_scores, greedy_score
from router.labels import HARM, HARMLESS, IMPORTANT, NEUTRAL, RESCUE, UNTESTED, first_order_change, signed_consequence
from router.records import load_records

TARGETS = (0.25, 0.5, 0.75)  # rejection rates, as fractions of the verifier's


def _mode(folder: Path) -> str:
    path = folder / "train_config.json"
    return json.loads(path.read_text()).get("mode", "gold") if path.exists() else "gold"


def check_no_leak(router, fold: dict, name: str) -> None:
    """Refuse a fold router that trained or validated on an example of the fold it is scored on."""
    seen = router.cfg.trained_on.get("example_ids", {})
    if not isinstance(seen.get("train"), list):
        raise RouterError(f"{name} was not trained on cross-fitting folds (no example ids): retrain with cross_fit=K")
    overlap = set(fold["scored"]) & (set(seen["train"]) | set(seen.get("validation", [])))
    if overlap:
        raise RouterError(
            f"{name} was trained on {len(overlap)} of the examples it would be scored on out of fold (e.g. "
            f"{sorted(overlap)[:3]}): its folder does not belong to this fold; retrain the cross-fit"
        )


def _scores(view: RecordView, routers: dict) -> dict[str, np.ndarray]:
    """Greedy-view defer scores (N,) per method on a view: every rule with an offline score (window rules
    where the records hold windows), then each router by name."""
    out = greedy_rule_scores(view)
    for name, router in routers.items():
        out[name] = greedy_score(router_scores(router, view, name=name), router.cfg.head, view.cols["tv"])
    if "consequence" in view.cols and "answer_correct" in view.cols:
        out[ORACLE] = oracle_scores(view.cols["consequence"], view.cols["answer_correct"])
    return out


def oracle_scores(consequence: np.ndarray, answer_correct: np.ndarray) -> np.ndarray:
    """(N,) the signed labels' oracle: it reads the labels it is scored on (a reference, never a rule to
    choose): defers first at harms, then at untested mismatches (their sign unknown), then at neutral ones,
    and last at rescues, whose drafts it keeps."""
    signs = signed_consequence(consequence, answer_correct)
    order = {HARM: 3.0, UNTESTED: 2.0, NEUTRAL: 1.0, RESCUE: 0.0}
    return np.select([signs == k for k in order], list(order.values()), default=2.0)


def shared_plan(folders: list[Path]) -> tuple[dict, str]:
    """The fold plan and row mode the cross-fitted folders share; refused where they differ (a best router
    is chosen per fold among routers that were trained and scored on the same folds)."""
    plan, mode = read_plan(folders[0]), _mode(folders[0])
    for folder in folders[1:]:
        if read_plan(folder)["folds"] != plan["folds"] or _mode(folder) != mode:
            raise RouterError(
                f"{folder} was cross-fitted on other folds or rows than {folders[0]}: train both on the same "
                f"records with the same cross_fit and cross_fit_seed to compare them fold by fold"
            )
    return plan, mode


def tested_rows(view: RecordView) -> np.ndarray:
    """(N,) bool: the rows of tested mismatches (IMPORTANT or HARMLESS)."""
    return np.isin(view.cols["consequence"], (IMPORTANT, HARMLESS))


def _example_sums(view: RecordView, rows: np.ndarray | None = None):
    """defer (N,) -> per-example sums (E,) of rejections, positions, quality and (consequence rows)
    the tested mismatches and those kept; the view's columns and example index are read once.
    `rows` (N,) bool: only those rows count (defer then has one entry per such row)."""
    keep = slice(None) if rows is None else rows
    g = {k: np.asarray(v)[keep] for k, v in greedy_columns(view).items()}
    index, n = example_index(view)
    index = index[keep]
    tested, signs = {}, None
    if "consequence" in view.cols:
        tested = {
            kind: view.cols["consequence"][keep] == value
            for kind, value in (("important", IMPORTANT), ("harmless", HARMLESS))
        }
        if "answer_correct" in view.cols:
            signs = signed_consequence(view.cols["consequence"][keep], view.cols["answer_correct"][keep])
    damage = None  # (N,) a mismatch's short-horizon score, 0 where none (agreement) and below 0
    if "horizon_score" in view.cols:
        damage = np.clip(np.nan_to_num(np.asarray(view.cols["horizon_score"], np.float64)[keep], nan=0.0), 0, None)

    def total(x):
        return np.bincount(index, weights=np.asarray(x, np.float64), minlength=n)

    positions = total(np.ones(len(index)))

    def sums(defer: np.ndarray) -> dict[str, np.ndarray]:
        out = {
            "rejections": total(g["cost"] * defer),
            "positions": positions,
            "quality": total(g["q_val"] + defer * (g["p_val"] - g["q_val"])),
        }
        for kind, mask in tested.items():
            out[kind] = total(mask)
            out[f"{kind}_kept"] = total(mask & ~defer)
        if signs is not None:  # first order: an answer flips once, whichever of its flipping drafts is kept
            out["signed"] = np.ones(n)  # per problem: the measure is the mean accuracy change over problems
            out["signed_kept"] = first_order_change(signs, ~defer, index, n)
        if damage is not None:
            out["horizon"] = total(damage)
            out["horizon_kept"] = total(damage * ~defer)
        return out

    return sums


def _threshold(score: np.ndarray, cost: np.ndarray, target: float) -> float:
    """t with 'defer iff score > t' reaching about `target` rejections per position on these rows: just
    below the n-th largest score among the rows where deferring costs a rejection."""
    costly = np.sort(np.asarray(score, np.float64)[cost > 0])[::-1]
    n = int(round(target * len(score)))
    if n <= 0:
        return np.inf
    if n > len(costly):
        return -np.inf
    return float(np.nextafter(costly[n - 1], -np.inf))


def _defer_top(score: np.ndarray, cost: np.ndarray, target: float, seed: int = 0) -> np.ndarray:
    """(N,) bool: defer at exactly round(target * N) of the rows where deferring costs a rejection, those with
    the largest scores, ties broken at random (seeded): a matched operating point even for a rule whose
    scores tie (a threshold would defer every tied row or none)."""
    n = int(round(target * len(score)))
    costly = np.flatnonzero(cost > 0)
    tie_break = np.random.default_rng(seed).random(len(costly))
    order = costly[np.lexsort((tie_break, -np.asarray(score, np.float64)[costly]))]  # largest score first
    defer = np.zeros(len(score), dtype=bool)
    defer[order[: max(0, n)]] = True
    return defer


def _value(sums: dict, measure: str) -> float:
    """The measure a best rule is chosen by (`answer_measures(...)[0]` unless told), as higher is better."""
    if measure == "quality":
        return sums["quality"].sum() / max(sums["positions"].sum(), 1)
    share = sums[f"{measure}_kept"].sum() / max(sums[measure].sum(), 1e-12)
    return share if measure in HIGHER_IS_BETTER else -share  # a kept share of bad mismatches: lower is better


def answer_measures(records: list[str], mode: str) -> tuple[str, ...]:
    """The measures out-of-fold scoring reports on these records, the first the one the best rule (and
    the best router) is chosen by: quality on gold rows; on consequence rows important and harmless
    where any mismatch was tested, and horizon where the records hold short-horizon scores."""
    if mode != "consequence":
        return ("quality",)
    tested = scored = signed = False
    for folder in records:
        ds = load_records(folder, mode=mode)
        if "consequence" in ds.column_names:
            tested |= bool(np.isin(_column(ds, "consequence"), (IMPORTANT, HARMLESS)).any())
            signed |= "answer_correct" in ds.column_names  # the verifier's verdict: which way a flip goes
        if "horizon_score" in ds.column_names:
            scored |= bool(np.isfinite(_column(ds, "horizon_score").astype(np.float64)).any())
    if not tested and not scored:
        raise ValueError(
            f"{', '.join(map(str, records))} hold no answer-level label: no tested mismatch and no short-horizon "
            f"score. Score on records with full-answer labels (consequence_max_mismatches > 0) or short-horizon "
            f"scores (consequence_horizon > 0), e.g. --eval-records of such a folder"
        )
    return ("important", "harmless") * tested + ("signed",) * (tested and signed) + ("horizon",) * scored


def _column(ds, name: str) -> np.ndarray:
    return np.asarray(ds.select_columns([name])[:][name])


def out_of_fold(
    folder: str | Path, records: list[str], targets=TARGETS, tested_only: bool = False, matched: bool = False
) -> dict:
    """Every example scored out of fold: per target, per method, per-example sums over all folds.
    tested_only (consequence rows): the rejection rate and every measure over the tested mismatches
    alone, so a method cannot look better by moving deferrals from untested mismatches (whose
    consequence is unknown, and which a router may tell apart, e.g. by where they fall in an answer)
    onto tested ones; the verifier's rejection rate there is 1 (it defers at every tested mismatch).
    matched: thresholds set on the scored rows to the target rejection rate (module docstring)."""
    return _out_of_fold(_folders(folder), records, targets, ((tested_only, matched),))[(tested_only, matched)]


def _folders(folder) -> list[Path]:
    """One cross-fitted folder or a list of them (a best router chosen per fold among them)."""
    return [Path(f) for f in folder] if isinstance(folder, (list, tuple)) else [Path(folder)]


def _out_of_fold(
    folders: list[Path], records: list[str], targets, populations, choose_by: str | None = None
) -> dict[tuple, dict]:
    """out_of_fold for each population, (tested_only, matched) pairs, from one pass over the folds: each
    fold's routers are loaded, its views read and every method scored once. With several cross-fitted
    folders (one fold plan), also "best_router": per fold the router best on its validation examples.
    choose_by: the measure the per-fold best rule (and router) is chosen by (default the records' first)."""
    plan, mode = shared_plan(folders)
    measures = answer_measures(records, mode)
    if choose_by is not None and choose_by not in measures:
        raise ValueError(f"choose_by {choose_by!r} is not a measure of these records ({', '.join(measures)})")
    choose_by = choose_by or measures[0]
    names = [folder.name for folder in folders]
    if len(set(names)) < len(names):
        names = [f"{folder.parent.name}/{folder.name}" for folder in folders]
    sums = {p: {t: {} for t in targets} for p in populations}
    chosen = {p: {t: {"rule": [], "router": []} for t in targets} for p in populations}
    for f, fold in enumerate(plan["folds"]):
        routers = {name: load_router(fold_folder(folder, f)) for name, folder in zip(names, folders)}
        for name, router in routers.items():
            check_no_leak(router, fold, f"{name}/fold-{f}")
        hidden = tuple(sorted({h for r in routers.values() for h in r.cfg.hidden_inputs}))
        val = RecordView(records, "all", mode, hidden, examples=set(fold["validation"]))
        scored = RecordView(records, "all", mode, hidden, examples=set(fold["scored"]))
        s_val, s_scored = _scores(val, routers), _scores(scored, routers)
        for p in populations:
            tested, matched = p
            r_val, r_scored = (tested_rows(v) if tested else None for v in (val, scored))
            _score_fold(
                sums[p],
                chosen[p],
                names,
                choose_by,
                {m: _select(s, r_val) for m, s in s_val.items()},
                {m: _select(s, r_scored) for m, s in s_scored.items()},
                (_example_sums(val, r_val), _example_sums(scored, r_scored)),
                (
                    _select(np.asarray(greedy_columns(val)["cost"]), r_val),
                    _select(np.asarray(greedy_columns(scored)["cost"]), r_scored) if matched else None,
                ),
            )
    return {
        p: {
            "router": names[0] if len(names) == 1 else "best_router",
            "routers": names,
            "mode": mode,
            "measures": measures,
            "chosen_by": choose_by,
            "k": plan["k"],
            "tested_only": p[0],
            "matched": p[1],
            "sums": sums[p],
            "best_rule_per_fold": {t: c["rule"] for t, c in chosen[p].items()},
            **({"best_router_per_fold": {t: c["router"] for t, c in chosen[p].items()}} if len(names) > 1 else {}),
        }
        for p in populations
    }


def _select(x: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    return x if rows is None else x[rows]


def _score_fold(sums: dict, chosen: dict, routers: list[str], measure: str, s_val, s_scored, on, costs) -> None:
    """One fold at every target: each method's threshold chosen on the validation rows (matched: a second
    one on the scored rows, when their costs are given), its per-example sums on the scored rows
    appended, and the fold's best rule (on validation) recorded; with several routers, the best of them
    too (by the same measure on the same validation rows)."""
    on_val, on_scored = on
    cost, scored_cost = costs
    for t in sums:
        here, value = {}, {}
        for method in s_val:
            thr = _threshold(s_val[method], cost, t * cost.mean())
            if scored_cost is None:
                here[method] = on_scored(s_scored[method] > thr)
            else:  # matched: the scored rows' own operating point at the target (no label read)
                here[method] = on_scored(_defer_top(s_scored[method], scored_cost, t * scored_cost.mean()))
            # matched: the best is chosen at validation's own matched point too, else a rule whose scores
            # tie (fly's window verdicts) overshoots the target there and wins by deferring more
            val_defer = s_val[method] > thr if scored_cost is None else _defer_top(s_val[method], cost, t * cost.mean())
            value[method] = _value(on_val(val_defer), measure)
        rules = [m for m in value if m not in routers and m not in REFERENCES]  # the oracle reads the labels
        best = {"rule": _best(value, rules)}  # first of equals: registry order
        if len(routers) > 1:
            best["router"] = _best(value, routers)
            here["best_router"] = here[best["router"]]
        for kind, method in best.items():
            chosen[t][kind].append(method)
        for method, per_example in {**here, "best_rule": here[best["rule"]]}.items():
            _append(sums[t], method, per_example)


def _best(value: dict, among: list[str]) -> str:
    """The method of `among` with the highest validation value (the first of equals)."""
    return max(among, key=value.get)


def _append(table: dict, method: str, per_example: dict) -> None:
    """Concatenate one fold's per-example sums onto a method's (folds in order, examples in fold order)."""
    if method not in table:
        table[method] = dict(per_example)
        return
    for k, v in per_example.items():
        table[method][k] = np.concatenate([table[method][k], v])


def population_name(tested_only: bool, matched: bool) -> str:
    """ "all" / "tested" (the tested mismatches alone), "-matched" where every method's rejection rate is
    set to the target on the scored examples."""
    return ("tested" if tested_only else "all") + ("-matched" if matched else "")


def populations(folder, records: list[str], reps: int = BOOTSTRAP, choose_by: str | None = None) -> dict[str, dict]:
    """{"all": summary, "all-matched": summary} of a cross-fitted folder out of fold, plus "tested" and
    "tested-matched" (the tested mismatches alone) for consequence rows with tested mismatches, from one
    pass over its folds.
    A list of folders (one fold plan): all of them, and the best router per fold ("best_router").
    choose_by: the measure the per-fold best rule is chosen by (e.g. "signed"; default the records' first)."""
    folders = _folders(folder)
    tested = (False, True) if "important" in answer_measures(records, _mode(folders[0])) else (False,)
    pops = tuple((t, m) for t in tested for m in (False, True))
    results = _out_of_fold(folders, records, TARGETS, pops, choose_by)
    return {population_name(*p): summarise(results[p], reps=reps) for p in pops}


def out_of_fold_results(folders: list, records: list[str], reps: int = BOOTSTRAP) -> dict:
    """metrics.json's offline.out_of_fold: each cross-fitted folder summarised, for consequence rows a
    second time over the tested mismatches alone ("<name> (tested only)"), and each of those again at
    matched rejection rates ("<name> (matched)", "<name> (tested only, matched)")."""
    labels = {
        "all": "",
        "tested": " (tested only)",
        "all-matched": " (matched)",
        "tested-matched": " (tested only, matched)",
    }
    out = {}
    groups = [[folder] for folder in folders]
    if len(folders) > 1 and _one_plan(folders):  # and the best of them per fold, the variant a fold picks
        groups.append(list(folders))
    for group in groups:
        name = Path(group[0]).name if len(group) == 1 else "best router"
        for population, summary in populations(group, records, reps).items():
            out[name + labels[population]] = summary
    return out


def _one_plan(folders: list) -> bool:
    try:
        shared_plan([Path(f) for f in folders])
        return True
    except RouterError:
        return False
