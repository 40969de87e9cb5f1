"""Consequence labels: which drafter/verifier mismatches change the answer.

Gold-token labels call every mismatch with the reference an error, even a harmless rephrasing.
This search labels mismatches by what they do to the answer, as AutoJudge does
(garipovroma/autojudge, `find_important_tokens.py`): decode the verifier's greedy answer; along it,
find where the drafter's argmax (teacher-forced on the answer so far) differs from the answer's
token; substitute the drafter's token there and let the verifier finish the answer greedily. The
mismatch is IMPORTANT if the task metric's verdict (correct or not) changes, HARMLESS otherwise.
At a harmless mismatch the drafter's token is kept and the search goes on along the new answer;
at an important one the verifier's token stays. Each example gets at most `max_mismatches`
branches; later mismatches stay UNTESTED (labels in `router.records`).

Everything is batched: the verifier's answers, the branches of every example still searching (in
groups of `batch_size`, each continuing from the shared prompt prefix's KV cache) and the drafter's
teacher-forced argmaxes. Costs per example: one greedy answer, one branch per tested mismatch (each
up to the answer budget) and a drafter pass after each harmless one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from router.loop.baselines import generate_autoregressive
from router.decoding import generate
from router.loop.layout import left_pad, model_device
from router.loop.lookup import LookupDrafter
from router.loop.common import eos_ids
from router.loop.prefix import SharedPrefix
from router.tasks.prompts import StopStrings, cut_at_stop
from router.labels import AGREE, CONSEQUENCE_LABELS, HARMLESS, IMPORTANT, UNTESTED
from router.loop.teacher import forward_tail, tail_layout
from data_gen.rejoin import RejoinStop


@dataclass
class Searched:
    """One example's search: the final answer and what was found along it."""

    tokens: list[int]  # the verifier's answer, harmless substitutions kept
    correct: int  # the metric's verdict on the verifier's own answer
    answer: str  # its answer (final number, test status, ...)
    labels: dict[int, int] = field(default_factory=dict)  # position -> HARMLESS | IMPORTANT
    branches: dict[int, tuple[str, int]] = field(default_factory=dict)  # position -> (answer, correct)
    argmax: np.ndarray | None = None  # the drafter's argmax along `tokens`
    # position -> (the verifier's token, its continuation) at every tested mismatch, as they stood when it
    # was tested: what a short-horizon label (data_gen/horizon.py) reads there, since `tokens` may later
    # go on after d (a harmless substitution there) or after a substitution a few tokens on
    originals: dict[int, tuple[int, list[int]]] = field(default_factory=dict)
    # position -> the drafter's token the branch substituted there (the search's own drafter pass)
    substituted: dict[int, int] = field(default_factory=dict)
    next_position: int = 0  # where the search for the next mismatch starts

    @property
    def tested(self) -> int:
        return len(self.labels)


ORIGINAL_TOKENS = 32  # the verifier's continuation kept at each tested mismatch (short-horizon labels)
LOOKUP_STOP = 0.5  # a block of looked-up drafts ends where no row has a proposal (router.loop.lookup)


class ConsequenceSearch:
    """The search over a batch of prompts (token ids) with their metric fields (`meta`). `lookup`:
    drafts per verifier pass when branches are decoded with drafts looked up in the answer they
    depart from (0: plain greedy decoding; the tokens are the same either way)."""

    def __init__(
        self,
        drafter,
        verifier,
        tokenizer,
        metric: Callable[[str, dict], dict],
        stops: list[str],
        vocab: int,
        pad_id: int,
        max_new_tokens: int,
        max_mismatches: int,
        batch_size: int,
        prefix: SharedPrefix | None = None,
        lookup: int = 4,
        rejoin: int = 0,
    ):
        self.drafter, self.verifier, self.tok, self.metric = drafter, verifier, tokenizer, metric
        self.stops, self.vocab, self.pad_id, self.prefix = list(stops), vocab, pad_id, prefix
        self.stop = StopStrings.build(tokenizer, self.stops) if self.stops else None
        self.eos = eos_ids(verifier)
        self.max_new_tokens, self.max_mismatches, self.batch_size = max_new_tokens, max_mismatches, batch_size
        self.lookup = lookup
        self.rejoin = rejoin  # > 0: a branch ends once it repeats this many tokens of its answer (data_gen/rejoin.py)
        self.rejoined_branches = 0  # branches ended that way
        self.spliced_tokens = 0  # answer tokens spliced on instead of decoded
        self.report: Callable[[str], None] | None = None  # progress lines (the recorder's bar shows them)
        self.branch_tokens = 0  # verifier tokens decoded in branches (the search's main cost)
        self.branch_verifier_passes = 0  # verifier forwards per branch those tokens took, summed over branches
        # continuations drawn at this temperature instead of greedily (data_gen/noise.py re-draws labels so);
        # the search itself is greedy: its labels are defined by the verifier's greedy answer
        self.temperature, self.seed = 0.0, 0

    def run(self, prompts: list[list[int]], metas: list[dict]) -> list[Searched]:
        self._say(f"answering {len(prompts)}")
        answers = self.continue_answers(prompts, [self.max_new_tokens] * len(prompts))
        found = [Searched(a, *self.judge(a, m)) for a, m in zip(answers, metas)]
        self._refresh_argmax(prompts, found, range(len(found)))
        for round_ in range(1, self.max_mismatches + 2):
            todo = [(i, t) for i, s in enumerate(found) if (t := self._next_mismatch(s)) is not None]
            if not todo:
                return found
            self._say(f"round {round_}: {len(todo)} branches, {sum(s.tested for s in found)} mismatches tested")
            starts = [found[i].tokens[:t] + [int(found[i].argmax[t])] for i, t in todo]
            tails = self.continue_answers(
                [prompts[i] + start for (i, _), start in zip(todo, starts)],
                [self.max_new_tokens - len(start) for start in starts],
                ended=starts,
                references=[found[i].tokens for i, _ in todo],
                departures=[t for _, t in todo],
            )
            changed = []
            for (i, t), start, tail in zip(todo, starts, tails):
                s = found[i]
                branch = start + tail
                correct, answer = self.judge(branch, metas[i])
                s.branches[t] = (answer, correct)
                s.next_position = t + 1
                s.originals[t] = (s.tokens[t], s.tokens[t + 1 : t + 1 + ORIGINAL_TOKENS])
                s.substituted[t] = start[-1]
                if correct == s.correct:  # harmless: keep the drafter's token, search on along the new answer
                    s.labels[t] = HARMLESS
                    if branch != s.tokens:
                        s.tokens = branch
                        changed.append(i)
                else:
                    s.labels[t] = IMPORTANT
            self._refresh_argmax(prompts, found, changed)
        return found  # not reached: every round tests a mismatch of each example in it, at most max_mismatches

    def _say(self, text: str) -> None:
        if self.report is not None:
            self.report(text)

    def _next_mismatch(self, s: Searched) -> int | None:
        """The first position from next_position on where the drafter's argmax is not the answer's
        token (None when there is none, or the example's branch budget is spent)."""
        if s.tested >= self.max_mismatches:
            return None
        differs = np.nonzero(s.argmax[s.next_position :] != np.asarray(s.tokens[s.next_position :]))[0]
        return int(s.next_position + differs[0]) if len(differs) else None

    def judge(self, tokens: list[int], meta: dict) -> tuple[int, str]:
        """(1 if the answer is correct else 0, its answer) by the task metric, on the text up to the
        first stop string, as eval scores an output."""
        text = cut_at_stop(self.tok.decode(tokens, skip_special_tokens=True), self.stops)
        scores = self.metric(text, meta)
        return int(scores["quality"] >= 1.0), str(scores.get("answer", ""))

    def continue_answers(
        self,
        starts: list[list[int]],
        budgets: list[int],
        ended: list[list[int]] | None = None,
        references: list[list[int]] | None = None,
        departures: list[int] | None = None,
    ) -> list[list[int]]:
        """The verifier's greedy continuation (or one drawn at `temperature`) of each start (prompt + answer so far), up to its budget,
        ending at EOS or a stop string, in batches. A start whose answer already ended (its last
        token is EOS, or a stop string closes it, or no budget is left) gets no continuation. With
        `references` (the answer each branch departs from) and `lookup` gamma, the branches are
        decoded speculatively with drafts looked up in their references (router.loop.lookup): the same
        tokens, fewer verifier passes where a branch rejoins its answer. With `rejoin` R and the
        `departures` (the answer position each branch substitutes), a branch stops once it repeats R
        tokens of its reference and the reference's remainder is spliced on (data_gen/rejoin.py)."""
        out: list[list[int]] = [[] for _ in starts]
        live = [i for i, b in enumerate(budgets) if b > 0 and not (ended and self._closed(ended[i]))]
        device = model_device(self.verifier)
        for lo in range(0, len(live), self.batch_size):
            rows = live[lo : lo + self.batch_size]
            ids, mask = left_pad([starts[i] for i in rows], self.pad_id)
            stop = self.stop
            if references is not None and self.rejoin:
                stop = RejoinStop(
                    self.stop,
                    [references[i] for i in rows],
                    [ended[i] for i in rows],
                    [departures[i] for i in rows],
                    self.rejoin,
                )
            common = dict(
                max_new_tokens=max(budgets[i] for i in rows),
                attention_mask=mask.to(device),
                stop=stop,
                prefix=self.prefix,  # generate reads it where every row starts with it, else prefills
            )
            if references is not None and self.lookup and self.temperature == 0:
                drafts = LookupDrafter([references[i] for i in rows], [len(starts[i]) - len(ended[i]) for i in rows])
                gen = generate(
                    drafts,
                    self.verifier,
                    ids.to(device),
                    rule="lossless",
                    gamma=self.lookup,
                    temperature=0.0,
                    draft_stop=LOOKUP_STOP,
                    **common,
                )
            else:
                drawn = dict(temperature=self.temperature, seed=self.seed + lo)  # temperature 0: greedy
                gen = generate_autoregressive(self.verifier, ids.to(device), role="verifier", **drawn, **common)
            for b, (i, new) in enumerate(zip(rows, gen.new_tokens())):
                new = new[: budgets[i]]
                self.branch_tokens += len(new) if ended else 0  # decoded ones: spliced tokens cost nothing
                if isinstance(stop, RejoinStop) and b in stop.rejoined:
                    self.rejoined_branches += 1
                    spliced = stop.remainder(b)[: max(0, budgets[i] - len(new))]
                    self.spliced_tokens += len(spliced)
                    new += spliced
                out[i] = new
            self.branch_verifier_passes += gen.stats["verifier_row_forwards"] if ended else 0
        return out

    def _closed(self, answer: list[int]) -> bool:
        if answer and answer[-1] in self.eos:
            return True
        if not self.stops:
            return False
        text = self.tok.decode(answer, skip_special_tokens=True)
        return cut_at_stop(text, self.stops) != text

    @torch.inference_mode()
    def _refresh_argmax(self, prompts: list[list[int]], found: list[Searched], which) -> None:
        """The drafter's argmax at every position of each listed example's answer (teacher-forced)."""
        which = [i for i in which if found[i].tokens]
        for i in (i for i, s in enumerate(found) if not s.tokens):
            found[i].argmax = np.zeros(0, dtype=np.int64)
        device = model_device(self.drafter)
        for lo in range(0, len(which), self.batch_size):
            rows = which[lo : lo + self.batch_size]
            answers = [found[i].tokens for i in rows]
            layout, prefix, keep = tail_layout([prompts[i] for i in rows], answers, self.pad_id, device, self.prefix)
            logits, _, _ = forward_tail(self.drafter, layout, keep, self.vocab, hidden=False, prefix=prefix)
            for b, i in enumerate(rows):
                n = len(answers[b])
                found[i].argmax = logits[b, keep - n - 1 : keep - 1].argmax(-1).cpu().numpy()  # (n,)


def consequence_columns(s: Searched, q_argmax: np.ndarray, counts: dict | None = None) -> dict:
    """Per-position record columns of one searched answer: the label (tested mismatches as found,
    AGREE where the drafter's argmax is the token, UNTESTED at the other mismatches), the branch's
    correctness and answer where one was decoded, and the verifier's own answer's correctness.

    A label belongs to the token its branch substituted: it is written only where this recording's
    drafter argmax `q_argmax` is that token. The search's drafter pass and the recording's are separate
    (other batches, other padding), and in bf16 they may round a near-tie differently; there the row is what
    the recording's pass says (counted in `counts["consequence_labels_dropped"]`)."""
    n = len(s.tokens)
    label = np.where(np.asarray(q_argmax) == np.asarray(s.tokens), AGREE, UNTESTED).astype(np.int8)
    branch_correct = np.full(n, -1, dtype=np.int8)
    branch_answer = [""] * n
    kept = {
        t: kind
        for t, kind in s.labels.items()
        if t < len(q_argmax) and s.substituted.get(t, int(q_argmax[t])) == int(q_argmax[t])
    }
    if counts is not None and len(kept) < len(s.labels):
        counts["consequence_labels_dropped"] = counts.get("consequence_labels_dropped", 0) + len(s.labels) - len(kept)
    for t, kind in kept.items():
        label[t] = kind
        branch_answer[t], branch_correct[t] = s.branches[t]
    return {
        "consequence": label,
        "branch_correct": branch_correct,
        "branch_answer": branch_answer,
        "answer_correct": np.full(n, s.correct, dtype=np.int8),
    }


def untested_columns(n: int) -> dict:
    """The consequence columns of rows the search did not make (gold or rollout rows in a folder
    that also records consequence labels): every position UNTESTED."""
    return {
        "consequence": np.full(n, UNTESTED, dtype=np.int8),
        "branch_correct": np.full(n, -1, dtype=np.int8),
        "branch_answer": [""] * n,
        "answer_correct": np.full(n, -1, dtype=np.int8),
    }


def label_counts(ds) -> dict:
    """Counts of the consequence labels in a shard's consequence rows, and of its searched examples
    and their verifier answers judged correct."""
    if "consequence" not in ds.column_names:
        return {}
    mode = np.asarray(ds["mode"]) == "consequence"
    label = np.asarray(ds["consequence"])[mode]
    ids, correct = np.asarray(ds["example_id"])[mode], np.asarray(ds["answer_correct"])[mode]
    first = np.unique(ids, return_index=True)[1]
    counts = {name: int((label == value).sum()) for name, value in CONSEQUENCE_LABELS.items()}
    return {**counts, "examples": len(first), "answers_correct": int((correct[first] == 1).sum())}


def summary_line(counts: dict) -> str:
    """One line for the recording summary: how many mismatches mattered."""
    tested = counts["important"] + counts["harmless"]
    share = counts["important"] / tested if tested else float("nan")
    return (
        f"{counts['important']} important / {tested} tested mismatches ({share:.3f}), {counts['untested']} "
        f"untested; verifier answers correct {counts['answers_correct']}/{counts['examples']}"
    )
