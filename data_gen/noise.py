"""Answer-level labels re-drawn: how much of a greedy consequence label is the token, and how much is chance.

A consequence label (data_gen/consequence.py) comes from two greedy continuations: the verifier's answer with
its own token at a mismatch, and the one with the drafter's token there. Each is one draw of what the
verifier could have written next. This module re-draws them: at a sample of tested mismatches it lets the
verifier finish the answer K times at a temperature > 0 from both sides (after the verifier's token v and
after the draft d, on the same answer so far) and judges every continuation with the task metric. Per
mismatch that gives K verdicts per side; eval/noise_ceiling.py turns them into flip probabilities, the
greedy label's agreement with its re-draw, the best AUC a predictor of the greedy label can reach, and the
share of the flip probability that the problem alone explains (docs/method.md, "The labels' noise ceiling").

The mismatches come from a consequence recording (`specroute gen`, modes [consequence]): a row's answer so
far is its trajectory's tokens before it (the answer as it stood when the mismatch was tested: later
substitutions only change later tokens), d is the row's drafter argmax and v the verifier's argmax there.
Sampling is resumable: results go to a JSON-lines file, rewritten atomically after every batch, and a rerun
with the same settings samples only the mismatches not yet in it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from router.infra.files import write_bytes
from router.labels import HARM, RESCUE, SIGNED_LABELS, signed_consequence
from router.records import RecordsError


@dataclass(frozen=True)
class Mismatch:
    """One tested mismatch of a consequence recording: where it is, the two tokens, and its greedy label."""

    example_id: str
    position: int  # in the answer
    row: int  # its row among the recording's consequence rows (features are read from there)
    draft: int  # the drafter's argmax d
    verifier_token: int  # the verifier's argmax v
    sign: int  # HARM / NEUTRAL / RESCUE: the greedy label, signed (router.labels.signed_consequence)
    answer_correct: int  # the verifier's greedy answer's verdict (1/0)

    @property
    def key(self) -> str:
        return f"{self.example_id}@{self.position}"


def labelled_mismatches(ds) -> tuple[list[Mismatch], dict[str, list[int]]]:
    """The tested mismatches of consequence rows `ds` (a records Dataset, trajectories in position order),
    and each example's answer tokens (its rows' tokens)."""
    cols = {c: np.asarray(ds[c]) for c in ("example_id", "position", "token", "q_argmax", "p_argmax")}
    signs = signed_consequence(ds["consequence"], ds["answer_correct"])
    answers: dict[str, list[int]] = {}
    for ex, pos, tok in zip(cols["example_id"], cols["position"], cols["token"]):
        answer = answers.setdefault(str(ex), [])
        if pos != len(answer):
            raise RecordsError(f"rows of {ex} are not in position order (position {pos} after {len(answer)})")
        answer.append(int(tok))
    correct = np.asarray(ds["answer_correct"])
    found = [
        Mismatch(str(cols["example_id"][i]), int(cols["position"][i]), int(i), int(cols["q_argmax"][i]),
                 int(cols["p_argmax"][i]), int(signs[i]), int(correct[i]))
        for i in np.nonzero(np.isin(signs, list(SIGNED_LABELS.values())))[0]
    ]  # fmt: skip
    return found, answers


# Problems are sampled, not mismatches: the problem random effect needs several mismatches per problem. A
# problem holds harms only (the verifier's answer is right) or rescues only (it is wrong), so four strata
# cover them: right with a harm, right without, wrong with a rescue, wrong without.
STRATA = ("right_harmed", "right_unharmed", "wrong_rescued", "wrong_unrescued")


def problem_stratum(signs: list[int], answer_correct: int) -> str:
    """The stratum of a problem from its tested mismatches' signs and its answer's verdict."""
    if answer_correct == 1:
        return "right_harmed" if HARM in signs else "right_unharmed"
    return "wrong_rescued" if RESCUE in signs else "wrong_unrescued"


def problem_strata(mismatches: list[Mismatch]) -> tuple[dict[str, list[Mismatch]], dict[str, str]]:
    """The mismatches of each problem, and each problem's stratum."""
    by_problem: dict[str, list[Mismatch]] = {}
    for m in mismatches:
        by_problem.setdefault(m.example_id, []).append(m)
    return by_problem, {
        ex: problem_stratum([m.sign for m in group], group[0].answer_correct) for ex, group in by_problem.items()
    }


def sample_problems(mismatches: list[Mismatch], per_stratum: int, seed: int = 0) -> tuple[list[Mismatch], dict]:
    """Every tested mismatch of up to `per_stratum` problems of each stratum (STRATA), drawn with `seed`, and
    per stratum its problems in the recording and in the sample (the weights that carry sample figures to the
    recording's population). A larger `per_stratum` with the same seed keeps the smaller one's problems."""
    by_problem, stratum_of = problem_strata(mismatches)
    strata: dict[str, list[str]] = {name: [] for name in STRATA}
    for ex in sorted(by_problem):
        strata[stratum_of[ex]].append(ex)
    rng = np.random.default_rng(seed)
    chosen, sizes = [], {}
    for name in STRATA:
        order = rng.permutation(len(strata[name]))  # one permutation per stratum: its prefix is the sample
        picked = [strata[name][i] for i in order[:per_stratum]]
        sizes[name] = {"problems": len(strata[name]), "sampled": len(picked)}
        chosen += [m for ex in picked for m in by_problem[ex]]
    return sorted(chosen, key=lambda m: (m.example_id, m.position)), sizes


@dataclass
class Redrawn:
    """K verdicts (1 correct, 0 wrong) of continuations sampled after the draft and after the verifier's token."""

    key: str
    sign: int
    draft_correct: list[int]
    verifier_correct: list[int]


def read_redrawn(path: Path, settings: dict) -> dict[str, Redrawn]:
    """The re-drawn mismatches of an earlier run with the same settings ({} when there is none); another
    run's file is refused (mixing temperatures or K would mix definitions)."""
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    if head.get("settings") != settings:
        raise RecordsError(
            f"{path} was sampled with {head.get('settings')}, this run asks for {settings}: "
            f"use another --out folder, or the same settings to resume it"
        )
    return {r["key"]: Redrawn(**r) for r in map(json.loads, lines[1:])}


def write_redrawn(path: Path, settings: dict, done: dict[str, Redrawn]) -> None:
    """All re-drawn mismatches so far, atomically (an interrupted run loses at most the batch in flight)."""
    lines = [json.dumps({"settings": settings})] + [json.dumps(asdict(r)) for r in done.values()]
    write_bytes(path, ("\n".join(lines) + "\n").encode())


class LabelRedraw:
    """Samples K continuations per side at each mismatch with a consequence search's verifier, metric and
    stop strings (`search`, a data_gen.consequence.ConsequenceSearch whose temperature it sets)."""

    def __init__(self, search, k: int, temperature: float, seed: int = 0):
        if k < 2 or temperature <= 0:
            raise ValueError(
                f"a re-draw needs k >= 2 samples at a temperature > 0 (got k={k}, temperature={temperature})"
            )
        self.search, self.k = search, k
        search.temperature, search.seed = temperature, seed

    def redraw(self, items: list[Mismatch], prompts: dict, answers: dict, metas: dict) -> list[Redrawn]:
        """Verdicts of K continuations after d and K after v for each mismatch (2K rows per mismatch, decoded in
        the search's batches)."""
        starts, budgets, owners = [], [], []
        for m in items:
            before = answers[m.example_id][: m.position]
            for token in (m.draft, m.verifier_token):
                start = before + [token]
                starts += [start] * self.k
                budgets += [self.search.max_new_tokens - len(start)] * self.k
                owners += [m] * self.k
        tails = self.search.continue_answers(
            [prompts[m.example_id] + s for m, s in zip(owners, starts)], budgets, ended=starts
        )
        verdicts = [self.search.judge(s + t, metas[m.example_id])[0] for m, s, t in zip(owners, starts, tails)]
        out = []
        for i, m in enumerate(items):
            block = verdicts[2 * self.k * i : 2 * self.k * (i + 1)]
            out.append(Redrawn(m.key, m.sign, block[: self.k], block[self.k :]))
        return out
