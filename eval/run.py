"""`specroute eval`: learned routers against every plug-in rule, offline on records and online.

Writes into `output`: metrics.json (config, offline summary, online points, their paired comparison
with the verifier (eval/paired.py) and tables), curves.csv (offline curve points and online points),
online_per_prompt.csv (every point's outcome per prompt), PNG plots, report.md, eval_config.json and
online/ (one file per finished (method, alpha) point, outputs and outcomes per prompt included: a
rerun resumes from them).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from router.tasks.sandbox import SANDBOXES
from router.tasks.metrics import get_metric
from eval.offline import (
    REFERENCE_METHODS,
    compare_views,
    consequence_catch,
    curve_rows,
    greedy_curves,
    load_held_out,
    load_routers,
    method_curves,
    summarise,
)
from eval.online import (
    BASELINES,
    DEFAULT_ALPHAS,
    add_relative_latency,
    add_verifier_logprobs,
    alphas_at_rejection,
    known_method,
    point_name,
    prepare_ends,
    prepare_prompts,
    run_grid,
    table_forms,
    timed_on,
)
from eval.paired import pairwise_table, paired_table
from eval.report import offline_plots, online_plots, write_curves_csv, write_per_prompt_csv, write_report
from router.infra import clock
from router.machine.calibrate import GammaChoice, calibrate_gamma, machine_of
from router.infra.config import ConfigError, check_minimum, config_to_dict
from router.infra.distributed import Ranks, barrier, ranks as this_rank, start
from router.machine.hardware import DTYPE_CHOICES, machine_kind, resolve_dtype
from router.engine.options import DECODE_FIELDS, DecodeOptions
from router.tasks.prompts import context_length, default_stops, prompt_limit
from router.records import Manifest, RecordsError, read_examples, read_heldout, read_manifest
from router.infra.console import summary_table, wandb_offline
from router.infra.files import output_lock, write_json
from router.offline.views import VIEW_TITLES
from router.rules import get_rule, online_rules, rule_names


@dataclass
class EvalConfig(DecodeOptions):
    """What to evaluate. Every field can be set in YAML or as a `key=value` override; the decoding
    knobs (temperature, top_p, seed, max_new_tokens, stop, gamma, draft_stop, bonus_from) are
    DecodeOptions' (router/engine/options.py: their defaults, help and checks). eval: stop null takes
    the prompt format's; gamma auto is chosen once per run from the pair's measured costs and the
    records' acceptance rate (gamma.json)."""

    name: str = "eval"
    records: list = field(default_factory=lambda: ["runs/records/gsm8k"])  # their test split is held out
    routers: list = field(default_factory=list)  # router folders (specroute train outputs)
    offline: bool = True
    online: bool = True
    online_methods: list | None = None  # default: every plug-in rule, every router, the baselines
    alphas: dict = field(default_factory=dict)  # per-method online alpha grids, e.g. {opt: [0, 0.5]}
    # online alphas: where each method's offline rejection is closest to these fractions of the verifier's
    # own (lossless) rejection, in the view the decoding uses: greedy (temperature 0: drafts are argmaxes,
    # rejected where they differ from the verifier's) or temperature 1 (rejection TV(q, pi))
    online_rejection_targets: list = field(default_factory=lambda: [0.25, 0.5, 0.75])
    paired_with: list = field(default_factory=list)  # online methods every point is also paired with, prompt by
    #   prompt (e.g. [judge, token_v2]); the verifier always is
    max_prompts: int = 10  # held-out prompts: the records' test examples, then (when more are asked)
    unrecorded_prompts: bool = True  #   the task's further examples its split rule puts in test
    batch_size: int = 1  # prompts per decoding call (1: per-prompt latency, as served)
    drafter: str | None = None  # default: the records' drafter
    verifier: str | None = None  # default: the records' verifier
    dtype: str = "auto"  # auto (bf16 where native, else float32), float32, bfloat16, float16
    device: str = "cpu"
    verifier_device_map: str | None = None  # e.g. auto: the verifier spread over the GPUs (accelerate)
    cost_ratio: float | None = None  # drafter/verifier seconds per token; default measured
    bootstrap: int = 1000  # replicates (over test examples) of the offline views' intervals
    metric: str | None = None  # default: the task's metric
    sandbox: str = "auto"  # code tasks: auto/bwrap (isolated; refused without bubblewrap) or python
    logger: str = "csv"  # csv | wandb
    wandb_project: str = "specroute"
    output: str = "runs/eval/eval"

    def __post_init__(self):
        if not self.records:
            raise ConfigError("records is empty: name the record folder(s) to evaluate on")
        super().__post_init__()  # the decoding knobs' one check
        check_minimum(self, 1, "max_prompts", "batch_size", "bootstrap")
        if self.cost_ratio is not None and not self.cost_ratio > 0:
            raise ConfigError(f"cost_ratio (drafter/verifier seconds per token) must be > 0, got {self.cost_ratio}")
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.sandbox not in SANDBOXES:
            raise ConfigError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {self.sandbox!r}")
        if self.logger not in ("csv", "wandb"):
            raise ConfigError(f"logger must be csv or wandb, got {self.logger!r}")


def _task_of(manifests: list[Manifest]) -> str:
    tasks = {m.task for m in manifests}
    if len(tasks) > 1:
        raise ConfigError(
            f"online evaluation needs one task per run, these records hold {sorted(tasks)}: "
            f"run `specroute eval` once per task"
        )
    return tasks.pop()


def _online_grid(cfg: EvalConfig, curves: dict, verifier_rejection: float, routers: dict) -> list[tuple[str, float]]:
    methods = cfg.online_methods or [*online_rules(), *routers, "token_cascade", "sequence_cascade"]
    unknown = [m for m in methods if not known_method(m, routers)]
    if unknown:
        raise ConfigError(
            f"unknown online methods {unknown}: use rule names {list(rule_names())}, router folder names "
            f"{list(routers)} or baselines {list(BASELINES)}"
        )
    stray = sorted(set(cfg.alphas) - set(methods))
    if stray:
        raise ConfigError(
            f"alphas are set for {stray}, which are not among the online methods {methods}: "
            f"add them to online_methods or drop their alphas"
        )
    unpaired = [m for m in cfg.paired_with if m not in (*methods, "verifier", "drafter")]
    if unpaired:
        raise ConfigError(
            f"paired_with names {unpaired}, which are not decoded online (online methods: {methods}, "
            f"plus verifier and drafter): add them to online_methods or drop them from paired_with"
        )
    grid = [("verifier", 0.0), ("drafter", 0.0)]  # the references, measured first
    targets = [f * verifier_rejection for f in cfg.online_rejection_targets]
    for m in methods:
        if m in ("verifier", "drafter"):
            continue
        if m in cfg.alphas:
            alphas = list(cfg.alphas[m])
        elif m in rule_names() and get_rule(m).alpha_range is None:  # lossless: alpha unused
            alphas = [0.0]
        elif m in curves:  # matched to the offline rejection targets
            rng = get_rule(m).alpha_range if m in rule_names() else None
            alphas = alphas_at_rejection(curves[m].threshold, curves[m].rejection, targets, rng)
        else:
            alphas = DEFAULT_ALPHAS[m]
        if m in rule_names():
            for a in alphas:  # refuse before any model call, not halfway through the grid
                get_rule(m).check_alpha(float(a))
        grid += [(m, float(a)) for a in alphas]
    return grid


def _load_pair(cfg: EvalConfig, manifest: Manifest):
    from router.pair import load_pair

    drafter = cfg.drafter or manifest.spec("drafter")
    verifier = cfg.verifier or manifest.spec("verifier")
    return load_pair(drafter, verifier, cfg.dtype, this_rank().device(cfg.device), cfg.verifier_device_map)


def dtype_note(cfg: EvalConfig, manifests: list[Manifest]) -> dict:
    """This run's dtype (and why), and whether the records were made in another one. Allowed: the
    pair's identity (its weight fingerprints) does not depend on the dtype, so records made in
    bf16 and an eval in float32 are the same pair; offline curves come from the records' numbers,
    online points from this run's, and the report says so."""
    choice = resolve_dtype(cfg.dtype, cfg.device)
    recorded = sorted({m.dtype.get("dtype", "unrecorded") for m in manifests})
    note = {**choice.as_dict(), "records_dtype": recorded}
    if recorded != [choice.name]:
        note["mixed"] = (
            f"records made in {', '.join(recorded)}, online decoding in {choice.name}: the same pair "
            f"(weight fingerprints do not depend on dtype); offline curves use the records' numbers"
        )
        print(f"[specroute] note: {note['mixed']}")
    return note


def _fingerprint(cfg: EvalConfig, manifest: Manifest, prompts, routers: dict, stops: list) -> dict:
    """What a finished online point depends on; a point file with another fingerprint is redone."""
    weights = {
        name: hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()[:16]
        for name, folder in zip(routers, cfg.routers)
    }  # a retrained router invalidates old points
    return {
        "models": manifest.models,
        "prompts": [p.example_id for p in prompts],
        "routers": weights,
        "dtype": resolve_dtype(cfg.dtype, cfg.device).name,  # latency (and near-ties) depend on it
        "machine": machine_kind(cfg.device),  # latencies measured on two machines are not comparable
        "stop": stops,
        **{
            k: getattr(cfg, k)
            for k in (
                *(f for f in DECODE_FIELDS if f != "stop"),  # the resolved stop strings are above
                "verifier_device_map",
                "metric",
                "batch_size",
                "drafter",
                "verifier",
                "device",
            )
        },
    }


def _measure_cost_ratio(pair, prompt_ids: list[int]) -> float:
    """Drafter/verifier seconds per token over 16 greedy tokens each (offline-only runs)."""
    from router.engine.baselines import generate_autoregressive

    ids = torch.tensor([prompt_ids])
    spt = {}
    for role, model in (("drafter", pair.drafter), ("verifier", pair.verifier)):
        out = generate_autoregressive(model, ids, max_new_tokens=16, role=role)
        spt[role] = out.stats["wall_seconds"] / max(out.stats["new_tokens"], 1)
    return spt["drafter"] / spt["verifier"]


def run_eval(cfg: EvalConfig) -> dict:
    """`specroute eval`: holds a lock on cfg.output for the whole run (a second writer is refused)."""
    with output_lock(cfg.output, "eval"):
        return _run_eval(cfg)


def _run_eval(cfg: EvalConfig) -> dict:
    started = clock.now()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    ranks = start(cfg.device)  # under torchrun: online points shared out by rank, rank 0 reports
    if ranks.main:
        write_json(out / "eval_config.json", config_to_dict(cfg))
    manifests = [read_manifest(f) for f in cfg.records]
    task = _task_of(manifests) if cfg.online else ",".join(sorted({m.task for m in manifests}))
    routers = load_routers(cfg.routers, taken=(*rule_names(), *BASELINES, *REFERENCE_METHODS))
    held_out = load_held_out(cfg.records)
    curves = method_curves(held_out, routers)
    greedy = greedy_curves(held_out, routers)
    if cfg.temperature <= 0:  # greedy decoding: operating points matched in the greedy view, as it decodes
        match, verifier_rejection = greedy, float(np.mean(held_out.cols["q_argmax"] != held_out.cols["p_argmax"]))
    else:
        match, verifier_rejection = curves, float(np.mean(held_out.cols["tv"]))
    pair, gamma = None, None
    if cfg.gamma == "auto":  # resolved once, before anything uses it: every point decodes with one gamma
        pair = _load_pair(cfg, manifests[0])
        if ranks.main:
            gamma = resolve_gamma(out, pair, cfg.records, cfg.batch_size, cfg.temperature)
        barrier()
        if not ranks.main:  # rank 0's choice, read back from gamma.json
            gamma = resolve_gamma(out, pair, cfg.records, cfg.batch_size, cfg.temperature)
        cfg = replace(cfg, gamma=gamma.gamma)
    online, pair = (
        _run_online(cfg, manifests[0], task, match, verifier_rejection, routers, pair, ranks)
        if cfg.online
        else (None, pair)
    )
    if not ranks.main:  # rank 0 writes the results; the other ranks return them once written
        barrier()
        return json.loads((out / "metrics.json").read_text())
    offline = None
    rows = []
    cost_ratio, source = _cost_ratio(cfg, online, pair, manifests[0]) if (cfg.offline or online) else (None, None)
    if cfg.offline:
        offline = {
            "positions": len(held_out.cols["tv"]),
            "cost_ratio": cost_ratio,
            "cost_ratio_source": source,
            "summary": summarise(curves, held_out, cfg.gamma, cost_ratio),
            "views": compare_views(cfg.records, held_out, routers, cfg.bootstrap),
            "consequence": consequence_catch(cfg.records, routers),
        }
        rows = curve_rows(curves, cfg.gamma, cost_ratio)
    if online:
        per_prompt = online.pop("per_prompt")
        write_per_prompt_csv(out / "online_per_prompt.csv", per_prompt)
        online["paired"] = paired_table(
            per_prompt, online["points"], curves, greedy, cfg.gamma, cost_ratio, cfg.bootstrap, cfg.batch_size
        )
        online["pairwise"] = pairwise_table(per_prompt, online["points"], cfg.paired_with, cfg.bootstrap)
    online_rows = [
        {
            "stage": "online",
            "method": p["method"],
            "alpha": p["alpha"],
            "rejection": p["rejection_rate"],
            "quality": p["quality"],
            "top1": math.nan,
            "relative_latency": p["relative_latency"],
        }
        for p in (online or {}).get("points", [])
    ]
    write_curves_csv(out / "curves.csv", rows + online_rows)
    plots = (offline_plots(out, rows, offline["summary"], task) if offline else []) + (
        online_plots(out, online["points"], task) if online else []
    )
    metrics = {
        "task": task,
        "config": config_to_dict(cfg),
        "offline": offline,
        "online": online,
        "gamma": gamma.as_dict() if gamma else {"gamma": cfg.gamma, "source": "the config"},
        "seconds": clock.now() - started,
    }
    write_json(out / "metrics.json", metrics)
    write_report(out / "report.md", cfg, offline, online, plots, metrics["gamma"])
    if cfg.logger == "wandb":
        _log_wandb(cfg, metrics, out, plots)
    print_eval_summary(metrics, out)
    barrier()
    return metrics


def _run_online(
    cfg: EvalConfig,
    manifest: Manifest,
    task: str,
    match: dict,
    verifier_rejection: float,
    routers: dict,
    pair=None,
    ranks: Ranks = Ranks(),
) -> tuple[dict | None, tuple]:
    """The online grid on held-out prompts; returns its results (None on ranks other than 0) and the
    (loaded) pair."""
    metric = get_metric(task, cfg.metric, cfg.sandbox)
    examples = online_examples(cfg)
    grid = _online_grid(cfg, match, verifier_rejection, routers)  # checked before loading any model
    pair = pair or _load_pair(cfg, manifest)
    limit = prompt_limit(
        context_length(pair.drafter, pair.verifier), cfg.max_new_tokens, manifest.config.get("max_prompt_tokens")
    )
    chat = manifest.config.get("chat", False)
    prompts = prepare_prompts(pair.tokenizer, examples, chat, cfg.max_prompts, limit)
    stops = default_stops(task, chat) if cfg.stop is None else list(cfg.stop)
    ends = prepare_ends(pair, prompts, stops)
    folder = Path(cfg.output) / "online"
    points = run_grid(
        pair,
        grid,
        prompts,
        cfg,
        metric,
        routers,
        folder,
        _fingerprint(cfg, manifest, prompts, routers, stops),
        ends,
        ranks,
    )
    if points is None:
        return None, pair
    scoring_seconds = add_verifier_logprobs(pair, points, prompts, ends, folder, cfg.batch_size)
    add_relative_latency(points)
    online = {
        "prompts": len(prompts),
        "batch_size": cfg.batch_size,
        "recorded_test_prompts": sum(e["recorded"] for e in examples[: len(prompts)]),
        "dtype": dtype_note(cfg, [manifest]),
        "timed_on": timed_on(points),
        "stop": stops,
        "logprob_seconds": scoring_seconds,
        "shared_prefix": {
            "tokens": len(ends.prefix) if ends.prefix else 0,
            "seconds": ends.prefix.seconds if ends.prefix else 0.0,
        },
        "points": [{k: v for k, v in p.items() if k != "examples"} for p in points],
        "tables": table_forms(points),
        "per_prompt": {point_name(p["method"], p["alpha"]): p["examples"] for p in points},
    }
    return online, pair


def records_acceptance(records: list, temperature: float) -> float:
    """How often the verifier keeps the drafter's token, on the records' validation split (train
    when there is none): argmax agreement for greedy decoding, else sum min(p, q) = 1 - TV, the
    acceptance probability of exact speculative sampling."""
    from router.records import load_records

    rows = []
    for folder in records:
        for split in ("validation", "train"):
            ds = load_records(folder, split=split)
            if len(ds):
                rows.append(ds.select_columns(["q_argmax", "p_argmax", "tv"]).with_format("numpy")[:])
                break
    if not rows:
        raise RecordsError(f"{records} have no validation or train rows to measure the acceptance rate on")
    if temperature <= 0:
        return float(np.mean(np.concatenate([r["q_argmax"] == r["p_argmax"] for r in rows])))
    return float(1 - np.mean(np.concatenate([r["tv"] for r in rows])))


def resolve_gamma(out: Path, pair, records: list, batch: int, temperature: float) -> GammaChoice:
    """gamma: auto. The choice in out/gamma.json when it was made on this machine, in this dtype, at
    this batch size (a rerun resumes with the same gamma); else a fresh calibration, saved there."""
    drafter, verifier, _ = pair
    path = out / "gamma.json"
    if path.exists():
        done = GammaChoice.from_dict(json.loads(path.read_text()))
        if (done.machine, done.dtype, done.batch) == (*machine_of(verifier), batch):
            print(f"[specroute] {done.summary()} (from {path})")
            return done
    print("[specroute] gamma: auto: measuring the pair's costs on this machine ...", flush=True)
    choice = calibrate_gamma(drafter, verifier, batch, records_acceptance(records, temperature))
    write_json(path, choice.as_dict())
    print(f"[specroute] {choice.summary()}")
    return choice


def online_examples(cfg: EvalConfig) -> list[dict]:
    """Held-out examples for online decoding: the records' test split, then (unrecorded_prompts) the
    task's further examples the recording's split rule puts in test, up to max_prompts."""
    examples = [{**e, "recorded": True} for e in read_examples(cfg.records[0], split="test")]
    if len(examples) < cfg.max_prompts and cfg.unrecorded_prompts:
        more = read_heldout(cfg.records[0])[: cfg.max_prompts - len(examples)]
        examples += [{**e, "recorded": False} for e in more]
    if not examples:
        raise RecordsError(f"{cfg.records[0]} has no test examples: record more examples")
    return examples


def _cost_ratio(cfg: EvalConfig, online: dict | None, pair, manifest: Manifest) -> tuple[float, str]:
    if cfg.cost_ratio is not None:
        return float(cfg.cost_ratio), "from the config"
    if online:
        spt = {p["method"]: p["seconds_per_token"] for p in online["points"] if p["method"] in ("drafter", "verifier")}
        if spt.get("verifier"):
            return spt["drafter"] / spt["verifier"], "measured: drafter-only vs verifier-only in the online run"
    pair = pair or _load_pair(cfg, manifest)
    examples = read_examples(cfg.records[0], split="test")
    ids = pair.tokenizer.encode(examples[0]["prompt"], add_special_tokens=False)[-256:] if examples else [1, 2, 3]
    return _measure_cost_ratio(pair, ids), "measured: 16 greedy tokens of each model"


def _log_wandb(cfg: EvalConfig, metrics: dict, out: Path, plots: list[Path]) -> None:
    import wandb

    run = wandb.init(
        project=cfg.wandb_project,
        name=cfg.name,
        dir=str(out),
        config=config_to_dict(cfg),
        mode="offline" if wandb_offline() else "online",
        job_type="eval",
    )
    if metrics["offline"]:
        summary = metrics["offline"]["summary"]["methods"]
        keys = sorted({k for v in summary.values() for k in v})
        run.log(
            {
                "offline_summary": wandb.Table(
                    columns=["method", *keys], data=[[m, *[v.get(k) for k in keys]] for m, v in summary.items()]
                )
            }
        )
    if metrics["online"]:
        pts = metrics["online"]["points"]
        cols = ["method", "alpha", "quality", "relative_latency", "verifier_calls_per_token", "rejection_rate"]
        run.log({"online_points": wandb.Table(columns=cols, data=[[p[c] for c in cols] for p in pts])})
    run.log({p.stem: wandb.Image(str(p)) for p in plots})
    run.finish()


def view_lines(views: dict) -> list[str]:
    """Gap closed per view for the best rule's rivals: the routers, the oracle and the other rules."""
    lines = []
    for view, v in views.items():
        lines.append(
            f"\n{VIEW_TITLES[view]}: gap closed vs {v['best_rule']} (chosen on validation), test, "
            f"95% interval over {v['examples']} examples"
        )
        for name, m in sorted(v["methods"].items(), key=lambda kv: -np.nan_to_num(kv[1]["gap_closed"], nan=-9)):
            lo, hi = m["gap_closed_ci"]
            lines.append(f"  {name:<20}{m['gap_closed']:>9.3f}  [{lo:.3f}, {hi:.3f}]   area {m['normalised_area']:.4f}")
    return lines


def online_lines(online: dict) -> list[str]:
    """The online table: quality, difference to the verifier with its 95% interval over prompts,
    agreement with the verifier, latency, and rejection offline (greedy view) vs online."""
    w = max([16, *(len(r["method"]) + 2 for r in online.get("paired", []))])  # long router names stay apart
    lines = [
        f"online, {online['prompts']} held-out prompts, batch {online.get('batch_size', 1)}; diff: 95% paired "
        f"bootstrap interval over prompts; rel. lat: seconds per token vs the verifier; row lat: per token of "
        f"each batch's longest row; rej off/on: rejection predicted by the records (greedy) / measured",
        f"{'method':<{w}}{'alpha':>8}{'quality [95% CI]':>24}{'diff to verifier':>26}{'same out':>10}"
        f"{'same ans':>10}{'logp/tok':>10}{'rel. lat':>10}{'row lat':>9}{'rej off':>9}{'rej on':>8}",
    ]
    for r in online.get("paired", []):
        lo, hi = r.get("quality_diff_ci", [math.nan, math.nan])
        q_lo, q_hi = r.get("quality_ci", [math.nan, math.nan])
        lines.append(
            f"{r['method']:<{w}}{r['alpha']:>8.3g}{r.get('quality', math.nan):>9.3f} [{q_lo:.3f}, {q_hi:.3f}]"
            f"{r.get('quality_diff', math.nan):>+11.3f} [{lo:+.3f}, {hi:+.3f}]"
            f"{r.get('identical_output', math.nan):>10.3f}{r.get('same_answer', math.nan):>10.3f}"
            f"{r.get('verifier_logprob', math.nan):>10.3f}{r['relative_latency']:>10.3f}"
            f"{r.get('relative_row_latency', math.nan):>9.3f}"
            f"{r['offline']['greedy_rejection']:>9.3f}{r['offline']['measured_rejection']:>8.3f}"
        )
    return lines + pairwise_lines(online.get("pairwise", []))


def pairwise_lines(pairwise: list[dict]) -> list[str]:
    """`paired_with`: each point against another method's point on the same prompts."""
    if not pairwise:
        return []
    w, v = (max(len(r[k]) for r in pairwise) + 2 for k in ("point", "against"))  # long router names stay apart
    lines = [
        "",
        "paired with other methods (diff: point - other, 95% paired bootstrap interval over prompts; "
        "lat ratio: point / other seconds per token)",
        f"{'point':<{w}}{'against':<{v}}{'diff [95% CI]':>26}{'McNemar p':>11}{'lat ratio':>11}",
    ]
    for r in pairwise:
        lo, hi = r["quality_diff_ci"]
        lines.append(
            f"{r['point']:<{w}}{r['against']:<{v}}{r['quality_diff']:>+10.3f} [{lo:+.3f}, {hi:+.3f}]"
            f"{r['mcnemar_p']:>11.4g}{r['latency_ratio']:>11.3f}"
        )
    return lines


def _gamma_line(gamma: dict) -> str:
    if "latency" not in gamma:
        return f"{gamma.get('gamma')} ({gamma.get('source', 'the config')})"
    return (
        f"{gamma['gamma']} (auto: expected {gamma['latency'][gamma['gamma']]:.3f}x the verifier per token at "
        f"acceptance {gamma['acceptance']:.3f}{'' if gamma['pays'] else '; speculation does not pay here'})"
    )


def print_eval_summary(metrics: dict, out: Path) -> None:
    lines = []
    if metrics["online"]:
        lines += online_lines(metrics["online"])
    if metrics["offline"]:
        lines += view_lines(metrics["offline"]["views"])
        s = metrics["offline"]["summary"]["methods"]
        lines.append(f"\n{'offline method':<22}{'area':>8}{'best quality':>14}{'latency @ verifier quality':>28}")
        for m, v in sorted(s.items(), key=lambda kv: -np.nan_to_num(kv[1]["area"], nan=-np.inf)):
            lines.append(f"{m:<22}{v['area']:>8.4f}{v['best_quality']:>14.4f}{v['latency_at_verifier_quality']:>28.3f}")
    rows = [
        ("task", metrics["task"]),
        ("gamma", _gamma_line(metrics.get("gamma", {}))),
        ("seconds", f"{metrics['seconds']:.1f}"),
        ("report", str(out / "report.md")),
        ("metrics", str(out / "metrics.json")),
    ]
    print("\n" + "\n".join(lines) + "\n\n" + summary_table(rows))
