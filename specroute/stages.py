"""The demo's stages: each runs in this process through its own run function with its config object
(`run_stage` prints the equivalent `specroute` command line), and they meet only through folders on
disk; a finished stage is reused when its folder is current.
"""

from __future__ import annotations

import json
from pathlib import Path

from router.backends import DEFAULT_ENGINE, bridge, get_engine
from specroute.presets import ROUTERS, Preset


def _stage_functions(command: str):
    """(config class, run function) of a stage, imported when first used."""
    if command == "gen":
        from data_gen.config import GenConfig
        from data_gen.run import run_gen

        return GenConfig, run_gen
    if command == "train":
        from train.config import TrainConfig
        from train.run import run_train

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
    from data_gen.record_folder import config_changes
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


def router_done(folder: Path, records_id: str | None = None) -> bool:
    """Trained, and (when records_id is given) on exactly these records."""
    if not ((folder / "metrics.json").exists() and (folder / "model.safetensors").exists()):
        return False
    if records_id is None:
        return True
    from router.model import load_router

    return load_router(folder).cfg.records_id == records_id


def train(out: Path, p: Preset, folders: dict) -> dict:
    from router.records import read_manifest

    records = [str(f["gold"]) for f in folders.values()]
    records_id = ",".join(read_manifest(f["gold"]).id for f in folders.values())
    trained = {}
    for name, extra in ROUTERS.items():
        folder = out / "routers" / name
        if not router_done(folder, records_id):  # not trained yet, or trained on other records
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


def choose_online_methods(trained: dict, out: Path, engine: str = DEFAULT_ENGINE) -> list[str]:
    """The best learned router that can decode (gru routers are offline-only; in vLLM, one whose inputs the
    plugin can give) and the best plug-in rule of each form, by *validation* area in the greedy view (online
    decoding is greedy; the test split stays untouched for the comparison), plus lossless."""
    from router.model import load_router
    from router.rules import rules_of_form

    # greedy-view area first; the temperature-1 area breaks ties (e.g. a pair that never writes gold)
    decodable = [n for n in trained if _decodes(load_router(out / "routers" / n), engine)]
    best_router = max(decodable, key=lambda n: (trained[n]["router"]["greedy_area"], trained[n]["router"]["area"]))
    first = next(iter(trained.values()))
    greedy, t1 = first["plugins_greedy"], first["plugins"]  # validation areas of every rule with an offline score
    best_rules = [
        max((n for n in rules_of_form(form) if n in greedy), key=lambda n: (greedy[n], t1.get(n, 0.0)))
        for form in ("cascade", "token")
        if any(n in greedy for n in rules_of_form(form))
    ]
    return [best_router, *best_rules, "lossless"]  # lossless: standard speculative decoding, the reference


def _decodes(router, engine: str) -> bool:
    if get_engine(engine).loop:
        return not router.offline_only
    return bridge(engine).decodes(router)  # what the served engine's loop can decide with


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
