"""Online points: one finished (method, alpha) point of the online grid, as `online/<point>.json`
holds it, and what is computed across points (latency relative to the verifier, the paper's two
table forms, where they were timed).

A point file is written atomically when its last prompt is decoded; `read_points` refuses a file
of another `POINT_FORMAT` (or with fields this specroute does not know) with the command that
remakes it, so no reader needs defaults for fields an older format lacked.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from router.infra.files import write_bytes

POINT_FORMAT = 3  # the format of online/<point>.json files; another format is refused (see read_points)
REFERENCE = "verifier@0"  # the point every other is compared with, prompt by prompt

# where a point was timed: a point from another machine is redone, unless every point of the grid was
# finished on one machine (a complete set is reused whole, so no table mixes two machines' latencies)
MACHINE_KEYS = ("machine", "dtype")


def point_name(method: str, alpha: float) -> str:
    return f"{method}@{alpha:g}"


@dataclass
class OnlinePoint:
    """One (method, alpha) point: its mean scores, summed measurements and every prompt's outcome
    (`examples`: example_id, text, tokens, new_ids, the metric's keys, the verifier's log-prob)."""

    method: str
    alpha: float
    prompts: int
    batch_size: int
    scores: dict  # the metric's per-prompt keys averaged over prompts: quality, and e.g. passed
    tokens: int
    seconds: float
    model_seconds: float
    time_parts: dict  # drafter/verifier/bonus-drafter/rule seconds summed over batches (eval/paired.py)
    batches: list  # per decoding call: its seconds and its longest row's tokens
    seconds_per_token: float
    verifier_calls_per_token: float
    rejection_rate: float  # NaN where nothing was drafted (verifier-only)
    outside_model_fraction: float
    examples: list = field(repr=False)
    fingerprint: dict = field(default_factory=dict, repr=False)  # what the point depends on (eval/online.py)
    recheck: dict = field(default_factory=dict)  # the reference: its first batch timed again at the end
    relative_latency: float = math.nan  # seconds per token / the verifier point's, set by add_relative_latency

    @property
    def name(self) -> str:
        return point_name(self.method, self.alpha)

    @property
    def quality(self) -> float:
        return self.scores["quality"]

    def summary(self) -> dict:
        """The point for metrics.json and tables: every measurement, scores flat, no per-prompt rows."""
        out = {k: v for k, v in asdict(self).items() if k not in ("examples", "fingerprint", "scores")}
        return {**out, **self.scores}

    def write(self, path: Path) -> None:
        """Atomically; relative_latency stays out (it is computed against the run's verifier point)."""
        data = {**asdict(self), "format": POINT_FORMAT}
        del data["relative_latency"]
        write_bytes(path, json.dumps(data, indent=1, default=float).encode())

    @classmethod
    def from_file(cls, path: Path) -> OnlinePoint | None:
        """The point a file holds; None (with a note naming it) when the file is damaged, so the
        point is decoded again; a ValueError with the fix when it holds another format's point."""
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:  # cut short or garbled (a disk error, an edit): redo the point
            print(f"[specroute] {path} is damaged ({err}): decoding that point again")
            return None
        known = {f.name for f in fields(cls)}
        if data.pop("format", None) != POINT_FORMAT or set(data) - known:
            raise ValueError(
                f"{path} holds an online point of another format than this specroute's ({POINT_FORMAT}): "
                f"decode it again into a fresh folder (`specroute eval ... output=<new folder>`) or delete "
                f"{path.parent}"
            )
        point = cls(**data)
        wrong = receipt_problems(point)
        if wrong:
            raise ValueError(
                f"{path} disagrees with its own per-prompt and per-batch receipts ({'; '.join(wrong)}): it was "
                f"edited or damaged, so its numbers cannot be trusted; delete it and rerun the same `specroute eval` "
                f"command to decode that point again"
            )
        return point


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def receipt_problems(point: OnlinePoint) -> list[str]:
    """Where a point's sums disagree with what it also holds per prompt (`examples`) and per decoding call
    (`batches`): prompts, tokens, seconds, seconds per token, model seconds and every mean score."""
    examples, wrong = point.examples, []
    if point.prompts != len(examples):
        wrong.append(f"prompts {point.prompts}, but {len(examples)} prompts' outcomes")
    tokens = sum(int(e.get("tokens", 0)) for e in examples)
    if point.tokens != tokens:
        wrong.append(f"tokens {point.tokens}, but its prompts' tokens sum to {tokens}")
    seconds = sum(float(b.get("seconds", 0.0)) for b in point.batches)
    if not _same(point.seconds, seconds):
        wrong.append(f"seconds {point.seconds:g}, but its batches sum to {seconds:g}")
    if not _same(point.seconds_per_token, point.seconds / max(point.tokens, 1)):
        wrong.append(f"seconds_per_token {point.seconds_per_token:g} is not seconds / tokens")
    parts = sum(point.time_parts.get(k, 0.0) for k in ("drafter_seconds", "verifier_seconds"))
    if not _same(point.model_seconds, parts):
        wrong.append(f"model_seconds {point.model_seconds:g}, but drafter + verifier seconds are {parts:g}")
    for key, mean in point.scores.items():
        values = [float(e[key]) for e in examples if key in e]
        if len(values) != len(examples) or not examples or not _same(mean, sum(values) / len(values)):
            wrong.append(f"scores[{key!r}] {mean:g} is not the mean of its prompts' {key!r}")
    return wrong


def read_points(paths: list[Path]) -> list[OnlinePoint | None]:
    """The finished point files (None where a point is not finished or its file is damaged), refusing
    files of another format."""
    return [OnlinePoint.from_file(path) if path.exists() else None for path in paths]


def add_relative_latency(points: list[OnlinePoint]) -> None:
    """Seconds per token relative to verifier-only in the same run (the 'verifier' point)."""
    ref = next((p for p in points if p.method == "verifier"), None)
    base = ref.seconds_per_token if ref else math.nan
    for p in points:
        p.relative_latency = p.seconds_per_token / base if base and base > 0 else math.nan


def table_forms(points: list[OnlinePoint]) -> dict:
    """The paper's two table forms per method: (a) lowest relative latency with quality at least
    the verifier's, (b) best quality at no more than the verifier's latency."""
    ref = next((p for p in points if p.method == "verifier"), None)
    if ref is None:
        return {}
    out = {}
    for method in dict.fromkeys(p.method for p in points):
        mine = [p for p in points if p.method == method]
        matched = [p for p in mine if p.quality >= ref.quality - 1e-12]
        fast = [p for p in mine if p.relative_latency <= 1.0 + 1e-9]
        a = min(matched, key=lambda p: p.relative_latency) if matched else None
        b = max(fast, key=lambda p: p.quality) if fast else None
        out[method] = {
            "a_latency_at_verifier_quality": a.relative_latency if a else math.nan,
            "a_alpha": a.alpha if a else math.nan,
            "b_quality_at_verifier_latency": b.quality if b else math.nan,
            "b_alpha": b.alpha if b else math.nan,
        }
    return out


SLACK = 0.9  # a point may be timed at most 10% faster per token than the drafter alone (noise)
RECHECK = 1.25  # the reference batch timed again at the end may differ by this factor either way
# reused from an earlier run, nothing spreads a change over the methods: the retimed batch may differ less
RECHECK_REUSED = 1.05


def timing_warnings(points: list[OnlinePoint]) -> list[str]:
    """Plain sentences for timings that cannot be right: a method faster per token than the drafter
    alone at the same batch size (every method pays at least the drafter's steps), or the reference
    batch timed again at the end disagreeing with its first timing (the machine's speed changed)."""
    out = []
    drafter = next((p for p in points if p.method == "drafter"), None)
    if drafter is not None:
        for p in points:
            if p.method != "drafter" and p.seconds_per_token < SLACK * drafter.seconds_per_token:
                out.append(
                    f"{p.name}: {p.seconds_per_token * 1e3:.1f} ms per token, faster than the drafter alone "
                    f"({drafter.seconds_per_token * 1e3:.1f} ms): no method can be; its timing is implausible"
                )
    ref = next((p for p in points if p.name == REFERENCE and p.recheck), None)
    if ref is not None:
        first, again = ref.recheck["first_seconds"], ref.recheck["again_seconds"]
        ratio = again / first if first > 0 else math.inf
        if ref.recheck.get("reused"):
            if not 1 / RECHECK_REUSED <= ratio <= RECHECK_REUSED:
                out.append(
                    f"{ref.name} was reused from an earlier run and its first batch, timed again in this one, took "
                    f"{again:.2f} s against {first:.2f} s then ({ratio:.2f}x): the points decoded in this run are "
                    f"timed on a machine of another speed than the reference, so their latencies relative to it "
                    f"are off by about that factor (ratios between this run's points are not); for one-run timings "
                    f"use a fresh output folder"
                )
        elif not 1 / RECHECK <= ratio <= RECHECK:
            out.append(
                f"{ref.name}'s first batch took {first:.2f} s when first timed and {again:.2f} s when timed again "
                f"at the end ({ratio:.2f}x): the machine's speed changed during the run, so the latencies of "
                f"{', '.join(p.name for p in points)} may be skewed (methods were interleaved batch by batch, "
                f"which spreads a change over all of them); rerun on a quiet machine"
            )
    return out


def timed_on(points: list[OnlinePoint], here: dict) -> dict:
    """The machine and dtype the points were timed on (one, by run_grid's rule), and whether that is another
    machine than `here` (this run's fingerprint): a complete set reused whole (complete_elsewhere)."""
    fp = points[0].fingerprint if points else {}
    timed = {k: fp.get(k) for k in MACHINE_KEYS}
    return {**timed, "elsewhere": bool(points) and timed != {k: here.get(k) for k in MACHINE_KEYS}}


def complete_elsewhere(done: list[OnlinePoint | None], fingerprints: list[dict]) -> dict | None:
    """The machine and dtype every finished point was timed on, when all points are finished, agree
    with their fingerprints but for those, and were timed on one other machine; else None."""
    if not done or any(p is None for p in done):
        return None
    if not all(
        same_fingerprint(p.fingerprint, {k: v for k, v in fp.items() if k not in MACHINE_KEYS})
        for p, fp in zip(done, fingerprints)
    ):
        return None
    timed = {tuple(p.fingerprint[k] for k in MACHINE_KEYS) for p in done}
    here = tuple(fingerprints[0][k] for k in MACHINE_KEYS)
    if len(timed) != 1 or here in timed:
        return None
    return dict(zip(MACHINE_KEYS, timed.pop()))


def same_fingerprint(done: dict | None, now: dict) -> bool:
    """A finished point is reused only if everything it depends on is unchanged. `routers` holds the
    weights of the router the point decodes with (none for rules and baselines)."""
    return done is not None and all(done.get(k) == v for k, v in now.items())


def point_fingerprint(fingerprint: dict, method: str) -> dict:
    """The run's fingerprint narrowed to what one point depends on: of the routers, only its own
    (adding or retraining another router leaves the point valid), and its own block size (`gammas`)."""
    routers = fingerprint.get("routers", {})
    narrowed = {k: v for k, v in fingerprint.items() if k != "gammas"}  # of the block sizes, only its own
    if method in fingerprint.get("gammas", {}):
        narrowed["gamma"] = fingerprint["gammas"][method]
    return {**narrowed, "routers": {method: routers[method]} if method in routers else {}}
