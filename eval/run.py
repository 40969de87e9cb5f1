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
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from eval.config import EvalConfig
from eval.gamma import resolve_gamma
from eval.grid import BASELINES, online_grid
from eval.models import dtype_note, load_eval_pair
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
from eval.online import add_verifier_logprobs, prepare_ends, prepare_prompts, run_grid
from eval.paired import paired_table, pairwise_table
from eval.plots import offline_plots, online_plots
from eval.prompts import online_examples
from eval.points import OnlinePoint, add_relative_latency, table_forms, timed_on, timing_warnings
from eval.report import print_eval_summary, write_report
from eval.tables import write_curves_csv, write_per_prompt_csv
from router.backends import DEFAULT_ENGINE
from router.loop.options import DECODE_FIELDS
from router.infra import clock
from router.infra.config import ConfigError, config_to_dict
from router.infra.console import wandb_offline
from router.infra.distributed import Ranks, barrier, start
from router.infra.files import output_lock, write_json
from router.machine.hardware import machine_kind, resolve_dtype
from router.offline.folds import is_cross_fitted
from router.offline.inputs import RecordView
from router.pair import one_pair
from router.records import Manifest, RecordsError, read_examples, read_manifest
from router.rules import rule_names
from router.tasks.metrics import check_metric_fields, get_metric
from router.tasks.prompts import context_length, default_stops, prompt_limit


@dataclass
class Online:
    """What the online grid measured: its points and how they were decoded (metrics.json's `online`)."""

    points: list[OnlinePoint]
    info: dict  # prompts, batch size, dtype, where timed, stop strings, shared prefix, log-prob seconds


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
    manifests = one_pair([read_manifest(f) for f in cfg.records], cfg.records)
    task = _task_of(manifests) if cfg.online else ",".join(sorted({m.task for m in manifests}))
    crossed = [r for r in cfg.routers if is_cross_fitted(r)]  # scored out of fold, offline (eval/crossfit.py)
    plain = [r for r in cfg.routers if r not in crossed]
    routers = load_routers(plain, taken=(*rule_names(), *BASELINES, *REFERENCE_METHODS))
    held_out = _held_out_view(cfg)
    curves, greedy = method_curves(held_out, routers), greedy_curves(held_out, routers)
    pair, gamma = None, None
    if cfg.gamma == "auto":  # resolved once, before anything uses it: every point decodes with one gamma
        pair, gamma = _auto_gamma(cfg, manifests[0], out, ranks)
        cfg = replace(cfg, gamma=gamma.gamma)
    online = None
    if cfg.online:
        match, verifier_rejection = _matching_view(cfg, held_out, curves, greedy, routers)
        online, pair = _run_online(cfg, manifests[0], task, match, verifier_rejection, routers, pair, ranks)
    if not ranks.main:  # rank 0 writes the results; the other ranks return them once written
        barrier()
        return json.loads((out / "metrics.json").read_text())
    cost_ratio, source = _cost_ratio(cfg, online, pair, manifests[0]) if (cfg.offline or online) else (None, None)
    rows = curve_rows(curves, cfg.gamma, cost_ratio) if cfg.offline else []
    metrics = {
        "task": task,
        "config": config_to_dict(cfg),
        "offline": _offline_results(cfg, held_out, curves, routers, cost_ratio, source, crossed)
        if cfg.offline
        else None,
        "online": _online_results(cfg, online, out, curves, greedy, cost_ratio) if online else None,
        "gamma": gamma.as_dict() if gamma else {"gamma": cfg.gamma, "source": "the config"},
    }
    _write_outputs(cfg, out, metrics, rows, online, started)
    barrier()
    return metrics


def _held_out_view(cfg: EvalConfig) -> RecordView:
    """The records' test split; an online-only run with a prompts file on records without one (their test
    problems left out as its prompts) reads the match split, where its alphas and offline rejections come from."""
    try:
        return load_held_out(cfg.records, mode=cfg.records_mode)
    except RecordsError as err:
        if cfg.offline or not cfg.online or not cfg.prompts or cfg.match_split == "test":
            raise RecordsError(f"{err} (an online-only run with a prompts file needs none: offline=false)") from None
        return load_held_out(cfg.records, split=cfg.match_split, mode=cfg.records_mode)


def _matching_view(
    cfg: EvalConfig, held_out: RecordView, curves: dict, greedy: dict, routers: dict
) -> tuple[dict, float]:
    """The curves online alphas are matched on (on the records' `match_split`: validation by default, so
    no alpha is chosen on the examples results are reported on), and the verifier's own rejection in that
    view: greedy decoding meets argmax drafts (rejected where they differ from the verifier's), sampling
    the expected TV(q, pi). On the test split the curves computed for the offline results are reused."""
    greedy_view, view = cfg.temperature <= 0, held_out
    if cfg.match_split != "test":
        try:
            view = load_held_out(cfg.records, split=cfg.match_split, mode=cfg.records_mode)
        except RecordsError:  # no rows in that split (the folders themselves were read already)
            view = None
        if view is None or len(view) == 0:  # nothing to match on: eval.grid refuses a method that needs it
            return {}, float("nan")
        curves = greedy = (greedy_curves if greedy_view else method_curves)(view, routers)  # the one view used
    if greedy_view:
        return greedy, float(np.mean(view.cols["q_argmax"] != view.cols["p_argmax"]))
    return curves, float(np.mean(view.cols["tv"]))


def _auto_gamma(cfg: EvalConfig, manifest: Manifest, out: Path, ranks: Ranks):
    """gamma: auto, chosen by rank 0 and read back from gamma.json by the others."""
    pair = load_eval_pair(cfg, manifest)
    if ranks.main:
        gamma = resolve_gamma(out, pair, cfg.records, cfg.batch_size, cfg.temperature)
    barrier()
    if not ranks.main:
        gamma = resolve_gamma(out, pair, cfg.records, cfg.batch_size, cfg.temperature)
    return pair, gamma


def _offline_results(
    cfg: EvalConfig, held_out, curves: dict, routers: dict, cost_ratio: float, source: str, crossed: list
) -> dict:
    from eval.crossfit import out_of_fold_results

    return {
        "out_of_fold": out_of_fold_results(crossed, cfg.records, cfg.bootstrap),
        "positions": len(held_out.cols["tv"]),
        "cost_ratio": cost_ratio,
        "cost_ratio_source": source,
        "summary": summarise(curves, held_out, cfg.gamma, cost_ratio),
        "views": compare_views(cfg.records, held_out, routers, cfg.bootstrap),
        "consequence": consequence_catch(cfg.records, routers),
    }


def _online_results(cfg: EvalConfig, online: Online, out: Path, curves: dict, greedy: dict, cost_ratio) -> dict:
    """metrics.json's `online`: the points (per-prompt rows in online_per_prompt.csv), their table
    forms and their paired comparisons."""
    per_prompt = {p.name: p.examples for p in online.points}
    write_per_prompt_csv(out / "online_per_prompt.csv", per_prompt)
    paired = paired_table(
        per_prompt, online.points, curves, greedy, cfg.gamma, cost_ratio, cfg.bootstrap, cfg.batch_size
    )
    return {
        **online.info,
        "points": [p.summary() for p in online.points],
        "tables": table_forms(online.points),
        "paired": paired,
        "pairwise": pairwise_table(per_prompt, online.points, cfg.paired_with, cfg.bootstrap),
    }


def _write_outputs(cfg: EvalConfig, out: Path, metrics: dict, rows: list[dict], online: Online | None, started):
    """curves.csv, the plots, metrics.json, report.md (and wandb), then the terminal summary."""
    points = online.points if online else []
    online_rows = [
        {
            "stage": "online",
            "method": p.method,
            "alpha": p.alpha,
            "rejection": p.rejection_rate,
            "quality": p.quality,
            "top1": math.nan,
            "relative_latency": p.relative_latency,
        }
        for p in points
    ]
    write_curves_csv(out / "curves.csv", rows + online_rows)
    offline = metrics["offline"]
    plots = offline_plots(out, rows, offline["summary"], metrics["task"]) if offline else []
    plots += online_plots(out, points, metrics["task"]) if online else []
    metrics["seconds"] = clock.now() - started
    write_json(out / "metrics.json", metrics)
    write_report(out / "report.md", cfg, metrics, plots)
    if cfg.logger == "wandb":
        _log_wandb(cfg, metrics, out, plots)
    print_eval_summary(metrics, out)


def _task_of(manifests: list[Manifest]) -> str:
    tasks = {m.task for m in manifests}
    if len(tasks) > 1:
        raise ConfigError(
            f"online evaluation needs one task per run, these records hold {sorted(tasks)}: "
            f"run `specroute eval` once per task"
        )
    return tasks.pop()


def _fingerprint(cfg: EvalConfig, manifest: Manifest, prompts, routers: dict, stops: list) -> dict:
    """What a finished online point depends on; a point file with another fingerprint is redone."""
    weights = {
        name: hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()[:16]
        for name, folder in ((Path(f).name, f) for f in cfg.routers)
        if name in routers  # cross-fitted folders are scored offline only
    }  # a retrained router invalidates old points
    return {
        "models": manifest.models,
        "prompts": [p.example_id for p in prompts],
        "routers": weights,
        "dtype": resolve_dtype(cfg.dtype, cfg.device).name,  # latency (and near-ties) depend on it
        **({"engine": cfg.engine, "threads": cfg.threads} if cfg.engine != DEFAULT_ENGINE else {}),  # as points were
        "machine": machine_kind(cfg.device),  # latencies measured on two machines are not comparable
        "stop": stops,
        "gammas": dict(cfg.gammas),  # narrowed to each point's own block size (eval.points.point_fingerprint)
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
    from router.loop.baselines import generate_autoregressive

    ids = torch.tensor([prompt_ids])
    spt = {}
    for role, model in (("drafter", pair.drafter), ("verifier", pair.verifier)):
        out = generate_autoregressive(model, ids, max_new_tokens=16, role=role)
        spt[role] = out.stats["wall_seconds"] / max(out.stats["new_tokens"], 1)
    return spt["drafter"] / spt["verifier"]


def _run_online(
    cfg: EvalConfig,
    manifest: Manifest,
    task: str,
    match: dict,
    verifier_rejection: float,
    routers: dict,
    pair=None,
    ranks: Ranks = Ranks(),
) -> tuple[Online | None, object]:
    """The online grid on held-out prompts; returns what it measured (None on ranks other than 0)
    and the (loaded) pair."""
    metric = get_metric(task, cfg.metric, cfg.sandbox)
    examples = online_examples(cfg, routers)
    for e in examples[: cfg.max_prompts]:  # every prompt judgeable before any model loads
        check_metric_fields(cfg.metric or task, e["meta"], e["example_id"])
    grid = online_grid(cfg, match, verifier_rejection, routers)  # checked before loading any model
    pair = pair or load_eval_pair(cfg, manifest)
    served = getattr(pair, "served", None)  # a served engine reserves max_model_len tokens per request
    context = served.max_model_len if served else context_length(pair.drafter, pair.verifier)
    limit = prompt_limit(context, cfg.max_new_tokens, manifest.config.get("max_prompt_tokens"))
    chat = manifest.config.get("chat", False)
    prompts = prepare_prompts(pair.tokenizer, examples, chat, cfg.max_prompts, limit)
    stops = default_stops(task, chat) if cfg.stop is None else list(cfg.stop)
    ends = prepare_ends(pair, prompts, stops)
    folder = Path(cfg.output) / "online"
    fingerprint = _fingerprint(cfg, manifest, prompts, routers, stops)
    points = run_grid(pair, grid, prompts, cfg, metric, routers, folder, fingerprint, ends, ranks)
    if served:
        served.close()  # its memory back before the teacher-forced scoring
    if points is None:
        return None, pair
    scoring_seconds = add_verifier_logprobs(pair, points, prompts, ends, folder, cfg.batch_size, fingerprint)
    add_relative_latency(points)
    info = {
        "prompts": len(prompts),
        "batch_size": cfg.batch_size,
        "recorded_test_prompts": sum(e["recorded"] for e in examples[: len(prompts)]),
        "prompts_file": cfg.prompts,
        "dtype": dtype_note(cfg, [manifest], pair),
        "timed_on": timed_on(points, fingerprint),
        "timing_warnings": timing_warnings(points),
        "stop": stops,
        "logprob_seconds": scoring_seconds,
        "shared_prefix": {
            "tokens": len(ends.prefix) if ends.prefix else 0,
            "seconds": ends.prefix.seconds if ends.prefix else 0.0,
        },
    }
    return Online(points, info), pair


def _cost_ratio(cfg: EvalConfig, online: Online | None, pair, manifest: Manifest) -> tuple[float, str]:
    if cfg.cost_ratio is not None:
        return float(cfg.cost_ratio), "from the config"
    if online:
        spt = {p.method: p.seconds_per_token for p in online.points if p.method in ("drafter", "verifier")}
        if spt.get("verifier"):
            return spt["drafter"] / spt["verifier"], "measured: drafter-only vs verifier-only in the online run"
    pair = pair or load_eval_pair(cfg, manifest)
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
