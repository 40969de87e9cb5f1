"""What a label file says, signed: harms, rescues and neutral mismatches, per problem, and the file checked
against its own definition (`specroute labels show`).

An important mismatch moves the answer one way or the other: a harm where the verifier's answer is right
(keeping the draft makes it wrong), a rescue where it is wrong (keeping the draft makes it right). The
first-order oracle keeps exactly one rescuing draft in every problem that has one and defers everywhere
else: its accuracy is the verifier's plus the rescued problems (each swap judged alone, as the search
tests it; two kept drafts in one answer are not tested together).
"""

from __future__ import annotations

from router.labels import HARMLESS, IMPORTANT


def signed_summary(entries) -> dict:
    """Counts over a label file's examples (LabelStore.entries values): signed mismatches, the problems
    they touch, the first-order oracle's accuracy, and the tested mismatches whose stored token breaks
    the file's definition (data_gen.label_store.substitutions says what a replay does with them)."""
    out = dict(examples=0, verifier_correct=0, tested=0, harms=0, rescues=0, neutral=0)
    out.update(harmed_problems=0, rescued_problems=0, harmless_token_not_in_answer=0, important_token_is_answer=0)
    for e in entries:
        right, tested, tokens = e["answer_correct"] == 1, e.get("tested", []), e["tokens"]
        important = sum(kind == IMPORTANT for _, kind, *_ in tested)
        out["examples"] += 1
        out["verifier_correct"] += right
        out["tested"] += len(tested)
        out["neutral"] += sum(kind == HARMLESS for _, kind, *_ in tested)
        out["harms" if right else "rescues"] += important
        out["harmed_problems" if right else "rescued_problems"] += important > 0
        out["harmless_token_not_in_answer"] += sum(kind == HARMLESS and tokens[t] != sub for t, kind, sub, *_ in tested)
        out["important_token_is_answer"] += sum(kind == IMPORTANT and tokens[t] == sub for t, kind, sub, *_ in tested)
    n = max(out["examples"], 1)
    out["verifier_accuracy"] = out["verifier_correct"] / n
    out["oracle_accuracy"] = (out["verifier_correct"] + out["rescued_problems"]) / n
    return out


def summary_lines(s: dict) -> list[str]:
    """The summary as `specroute labels show` prints it."""
    wrong = s["examples"] - s["verifier_correct"]
    lines = [
        f"  signed: {s['harms']} harms, {s['rescues']} rescues, {s['neutral']} neutral of {s['tested']} tested "
        f"mismatches",
        f"  verifier right on {s['verifier_correct']} of {s['examples']} problems ({s['verifier_accuracy']:.3f}): "
        f"{s['harmed_problems']} of them with a harm; wrong on {wrong}: {s['rescued_problems']} of them rescued "
        f"by a single kept draft",
        f"  first-order oracle (keep exactly the rescues, defer elsewhere): accuracy {s['oracle_accuracy']:.3f}",
    ]
    bad = s["harmless_token_not_in_answer"] + s["important_token_is_answer"]
    if bad:
        lines.append(
            f"  {bad} tested mismatches store the recording's drafter token instead of the substituted one "
            f"({s['harmless_token_not_in_answer']} harmless whose answer goes on with another token, "
            f"{s['important_token_is_answer']} important whose token is the answer's own): the recording's bf16 "
            f"drafter pass rounded a near-tie otherwise than the search's; a replay reads the harmless ones' "
            f"token from the answer and leaves those important ones out"
        )
    return lines
