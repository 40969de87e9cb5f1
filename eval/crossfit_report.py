"""report.md's out-of-fold section: each cross-fitted router (and the best of them per fold) against every
plug-in rule and the per-fold best rule (eval/crossfit.py computes the numbers)."""

from __future__ import annotations

from eval.crossfit_summary import result_measures
from eval.tables import markdown_table


def out_of_fold_section(results: dict) -> list[str]:
    """report.md: each cross-fitted router against every rule and the per-fold best rule, out of fold."""
    parts = []
    for name, res in results.items():
        measures = result_measures(res)
        parts += [
            f"### Out of fold: {name} ({res['k']}-fold cross-fitting, {res['mode']} rows, greedy view)",
            "",
            "Every labelled example scored once, by the fold router that never saw it; alphas and the best rule "
            "chosen per fold on inner validation examples at each target rejection rate (a fraction of the "
            "verifier's). "
            + _measures_text(res, measures)
            + (
                "Matched: every method's threshold set on the scored examples to the target rejection rate (no "
                "labels read), so all are compared at the same rate. "
                if res.get("matched")
                else ""
            )
            + "Intervals: paired bootstrap over examples, method minus the per-fold best rule (and minus the best "
            "rule in hindsight, the one rule best on the scored examples: it favours the rule).",
            "",
        ]
        for target, block in res["targets"].items():
            rows = []
            for method, row in block["methods"].items():
                cells = [method, row["rejection"]]
                for m in measures:
                    d = row[f"{m}_vs_best_rule"]
                    cells += [row[m], f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"]
                rows.append(cells + hindsight_cell(row, measures[0], block))
            header = ["method", "rejection", *[h for m in measures for h in (m, f"{m} - best rule [95%]")]]
            header += hindsight_header(measures[0], block)
            parts += [
                f"At {float(target):.0%} of the verifier's rejection rate (best rule per fold: "
                f"{', '.join(block['best_rule_per_fold'])}"
                + (
                    f"; best router per fold: {', '.join(block['best_router_per_fold'])}"
                    if "best_router_per_fold" in block
                    else ""
                )
                + "):",
                "",
                markdown_table(header, rows),
                "",
            ]
    return parts


def _measures_text(res: dict, measures: tuple[str, ...]) -> str:
    """What the table's measures are, in a sentence each."""
    if "quality" in measures:
        return "quality: the share of emitted tokens equal to the gold one. "
    text = ""
    if "important" in measures:
        text += "important / harmless: the share of the tested important / harmless mismatches a method keeps (lower / "
        text += "higher is better); " + (
            "rejection rates over the tested mismatches alone (untested ones left out). "
            if res.get("tested_only")
            else "untested mismatches count toward the rejection rate only. "
        )
    if "signed" in measures:
        text += (
            "signed: the expected accuracy change against the verifier, first order (per problem +1 where a kept "
            "draft rescues a wrong answer, -1 where one harms a right one; higher is better). "
        )
    if "horizon" in measures:
        text += "horizon: the share of the mismatches' summed short-horizon score a method keeps (lower is better). "
    return text


def hindsight_header(measure: str, block: dict) -> list[str]:
    """The column of the difference to the best rule in hindsight (none in summaries that predate it)."""
    return [f"{measure} - {block['hindsight_rule']} (best in hindsight) [95%]"] if "hindsight_rule" in block else []


def hindsight_cell(row: dict, measure: str, block: dict) -> list[str]:
    if "hindsight_rule" not in block:
        return []
    d = row[f"{measure}_vs_hindsight_rule"]
    return [f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"]
