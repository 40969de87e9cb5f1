"""`specroute train`: fit a router on record folders, log to CSV (and W&B), export it.

Writes into `output`: model.safetensors + config.json (the router, loadable with torch alone),
metrics.json (router, sklearn baselines, plug-in rules), tradeoff.csv, train_config.json, and
Lightning's CSV logs and checkpoints.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from router.inputs import judge_inputs
from router.backends import DEFAULT_ENGINE
from router.infra.config import config_to_dict
from router.features import FEATURE_NAMES, JUDGE_FEATURE_NAMES
from router.model import LearnedRouter, RouterConfig, save_router
from router.pair import one_pair
from router.records import Manifest, read_manifest
from router.infra.console import summary_table, wandb_offline
from router.infra.quiet import reroute
from router.infra.files import output_lock, write_csv, write_json
from router.offline.inputs import router_scores
from router.offline.views import greedy_areas
from train.data import RecordDataModule, RecordSplit, hidden_size, input_stats, warn_if_one_sided
from train.ensemble import merge_members
from train.validation import plugin_areas, router_metrics, tradeoff_table
from train.config import TrainConfig
from train.module import RouterModule


def _hidden_sizes(cfg: TrainConfig) -> dict:
    return {role: hidden_size(cfg.records[0], role) for role in cfg.router.hidden_inputs}


def _loggers(cfg: TrainConfig, out: Path):
    from lightning.pytorch.loggers import CSVLogger

    loggers = [CSVLogger(str(out), name="logs")]
    if cfg.logger == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(
            WandbLogger(
                project=cfg.wandb_project,
                save_dir=str(out),
                offline=wandb_offline(),
                config=config_to_dict(cfg),
                log_model=False,
            )
        )
    elif cfg.logger != "csv":
        raise ValueError(f"logger must be csv or wandb, got {cfg.logger!r}")
    return loggers


def run_train(cfg: TrainConfig) -> dict:
    """`specroute train`: holds a lock on cfg.output for the whole run (a second writer is refused)."""
    with output_lock(cfg.output, "train"):
        return _run_train(cfg)


def _run_train(cfg: TrainConfig) -> dict:
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train_config.json", config_to_dict(cfg))
    if cfg.cross_fit:
        from train.crossfit import train_folds

        return train_folds(cfg, out, fit_router)
    return fit_router(cfg, out)


def fit_router(cfg: TrainConfig, out: Path, examples: dict | None = None) -> dict:
    """Fit one router into `out` on the records' train split (validated on their validation split),
    or, given examples {"train": ids, "validation": ids} (a cross-fitting fold), on those examples. With
    ensemble N > 1, N members (seeds seed .. seed + N - 1, each in out/members/) averaged into one network
    (train/ensemble.py)."""
    data = _data_module(cfg, examples)
    # read once for all members: the pair, the splits and the input standardisation they share
    manifests = one_pair([read_manifest(f) for f in cfg.records], cfg.records)
    data.setup("fit")
    stats = input_stats(data.train)  # reads every input first: records missing one are refused before any note
    warn_if_one_sided(data.train)
    if cfg.ensemble <= 1:
        fitted = _fit_member(cfg, out, examples, data, manifests, stats)
        return _finish(cfg, *fitted, out) if fitted else {}
    members = []
    for i in range(cfg.ensemble):
        member = dataclasses.replace(cfg, seed=cfg.seed + i, ensemble=1)
        # each member only reshuffles the shared splits' batches with its own seed
        where = out / "members" / f"seed-{member.seed}"
        fitted = _fit_member(member, where, examples, data.reseeded(member.seed), manifests, stats)
        if fitted is None:  # under DDP rank 0 exports
            return {}
        members.append(fitted)
    module, train, val, trainer = members[0]
    module.net = merge_members([m[0].net for m in members])
    module.net.cfg.trained_on["ensemble"] = {
        "members": cfg.ensemble,
        "seeds": [cfg.seed + i for i in range(cfg.ensemble)],
    }
    return _finish(cfg, module, train, val, trainer, out)


def _data_module(cfg: TrainConfig, examples: dict | None) -> RecordDataModule:
    """The records' train and validation rows as batches (a cross-fitting fold's examples if given)."""
    return RecordDataModule(
        cfg.records,
        cfg.mode,
        cfg.target,
        cfg.router.hidden_inputs,
        cfg.batch_size,
        cfg.seed,
        cfg.router.window if cfg.router.arch == "gru" else 1,
        cfg.router.head,
        cfg.max_train_rows,
        examples,
        cfg.router,
    )


def _fit_member(
    cfg: TrainConfig,
    out: Path,
    examples: dict | None,
    data: RecordDataModule,
    manifests: list[Manifest],
    stats: tuple[np.ndarray, np.ndarray],
):
    """(module with its best checkpoint loaded, train split, validation split, trainer) of one network
    trained with cfg.seed on `data` (set up); None on a DDP rank other than 0."""
    import lightning as L

    L.seed_everything(cfg.seed, verbose=False)
    train, val = data.train, data.val
    if cfg.router.head == "judge":
        train.judge_columns()  # reads the token class table the judge carries into its export
    module = RouterModule(
        config_to_dict(_router_config(cfg, train, manifests, examples)), cfg.loss, cfg.lr, cfg.weight_decay, val, val.y
    )
    if cfg.router.head == "judge":
        module.net.token_classes.copy_(torch.from_numpy(train.token_classes))
    module.net.mean.copy_(torch.from_numpy(stats[0]))
    module.net.std.copy_(torch.from_numpy(stats[1]))
    trainer, ckpt = _trainer(cfg, out)
    trainer.fit(module, datamodule=data)
    if not trainer.is_global_zero:
        return None
    if ckpt.best_model_path:
        module.load_state_dict(torch.load(ckpt.best_model_path, weights_only=False)["state_dict"])
    return module, train, val, trainer


def _router_config(cfg: TrainConfig, train: RecordSplit, manifests: list[Manifest], examples=None) -> RouterConfig:
    """What the exported router is: its network, its inputs, and the records and pair it learned."""
    return RouterConfig.built(
        cfg.router,
        token_candidates=train.cand.q.shape[1],  # score as many candidates as recorded
        hidden_sizes=_hidden_sizes(cfg),
        records_id=",".join(m.id for m in manifests),
        pair=manifests[0].pair,
        alpha_grid=list(cfg.alpha_grid),
        vocab=len(train.token_classes) if cfg.router.head == "judge" else 0,
        trained_on=_trained_on(cfg, train, manifests, examples),
    )


def _trained_on(cfg: TrainConfig, train: RecordSplit, manifests: list[Manifest], examples=None) -> dict:
    """What the router learned from, for its model card and eval's leakage check: records, tasks,
    models, label, size and (cross-fitting) the example ids it was trained and validated on."""
    return {
        "example_ids": examples or {"train": "the records' train split", "validation": "their validation split"},
        "records": [str(r) for r in cfg.records],
        "tasks": sorted({m.task for m in manifests}),
        "models": {role: manifests[0].models.get(role, {}).get("name") for role in ("drafter", "verifier")},
        "engine": sorted(
            {m.dtype.get("engine", DEFAULT_ENGINE) for m in manifests}
        ),  # what computed the records' numbers
        "target": cfg.target,
        "loss": cfg.loss,
        "train_rows": len(train),
        "examples": {m.id: m.splits for m in manifests},
    }


def _trainer(cfg: TrainConfig, out: Path):
    """The Lightning trainer (early stopping and the best checkpoint on the validation area)."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    reroute()  # Lightning's banner lines (accelerators, tips) to the command's log, not the user's terminal
    ckpt = ModelCheckpoint(dirpath=str(out / "checkpoints"), monitor="val_area", mode="max", save_top_k=1)
    trainer = L.Trainer(
        max_epochs=cfg.max_epochs,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        strategy=cfg.strategy,
        num_nodes=cfg.num_nodes,
        precision=cfg.precision,
        logger=_loggers(cfg, out),
        num_sanity_val_steps=0,
        callbacks=[ckpt, EarlyStopping(monitor="val_area", mode="max", patience=cfg.patience)],
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    return trainer, ckpt


def _finish(cfg: TrainConfig, module: RouterModule, train: RecordSplit, val: RecordSplit, trainer, out: Path) -> dict:
    """Score the fitted router on the validation split, export it, write its metrics and trade-off table."""
    windowed = cfg.router.arch == "gru"
    pred = router_scores(module.net, val)  # as eval will score it: the same inputs, the same code
    greedy = greedy_areas(val, pred, cfg.router.head)
    metrics = {
        "router": {
            **router_metrics(pred, val.y, val, regression=cfg.loss == "mse"),
            "greedy_area": greedy.pop("router"),
        },
        "plugins": plugin_areas(val),
        "plugins_greedy": greedy,
        "epochs": trainer.current_epoch,
        "train_rows": len(train),
        "val_rows": len(val),
    }
    if cfg.baselines and not cfg.router.hidden_inputs and not windowed:
        from train.baselines import sklearn_baselines

        metrics["baselines"] = sklearn_baselines(train, val, cfg.seed)
    module.net.cfg.metrics = metrics
    save_router(LearnedRouter(module.net, name=out.name), out)
    write_json(out / "metrics.json", metrics)
    table = tradeoff_table(pred, val)
    write_csv(out / "tradeoff.csv", ["method", "rejection", "quality"], table)
    _log_wandb(trainer, table, out)
    print_train_summary(cfg, metrics)
    return metrics


def _log_wandb(trainer, table: list[dict], out: Path) -> None:
    """Curve as a W&B table + plot and the exported router as an artifact (when W&B is on)."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            run = logger.experiment
            wb_table = wandb.Table(
                columns=["method", "rejection", "quality"],
                data=[[r["method"], r["rejection"], r["quality"]] for r in table],
            )
            run.log(
                {
                    "tradeoff": wb_table,
                    "tradeoff_plot": wandb.plot.scatter(wb_table, "rejection", "quality", title="quality vs rejection"),
                }
            )
            artifact = wandb.Artifact(f"router-{out.name}", type="router")
            artifact.add_file(str(out / "model.safetensors"))
            artifact.add_file(str(out / "config.json"))
            run.log_artifact(artifact)
            run.finish()


def print_train_summary(cfg: TrainConfig, metrics: dict) -> None:
    r, pl = metrics["router"], metrics["plugins"]
    hidden = f" + {cfg.router.hidden_inputs} hidden" if cfg.router.hidden_inputs else ""
    n_features = len(JUDGE_FEATURE_NAMES if cfg.router.head == "judge" else FEATURE_NAMES)
    extra = "".join(f" + {spec.describe(cfg.router) or spec.name}" for spec in judge_inputs(cfg.router))
    rows = [
        ("router", f"{cfg.router.arch}, {cfg.router.head} head, on {n_features} features{extra}{hidden}"),
        ("rows", f"train {metrics['train_rows']}, validation {metrics['val_rows']}"),
        (
            "val area (0 drafter, 1 oracle)" + (", greedy view" if cfg.router.head == "judge" else ""),
            f"{r['area']:.4f}",
        ),
        (
            "best plug-in area",
            f"{pl['best_plugin']:.4f} ("
            + ", ".join(f"{name} {area:.4f}" for name, area in pl.items() if name != "best_plugin")
            + ")",
        ),
        ("val ROC-AUC vs oracle", f"{r['auc']:.4f}"),
        ("val calibration error", f"{r['calibration']:.4f}"),
    ]
    rows.append(
        ("val greedy-view area", f"{r['greedy_area']:.4f} (best rule {max(metrics['plugins_greedy'].values()):.4f})")
    )
    for name, b in metrics.get("baselines", {}).items():
        rows.append((f"sklearn {name} area", f"{b['area']:.4f}"))
    print("\n" + summary_table(rows) + f"\n  router written to {cfg.output}")
