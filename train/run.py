"""`specroute train`: fit a router on record folders, log to CSV (and W&B), export it.

Writes into `output`: model.safetensors + config.json (the router, loadable with torch alone),
metrics.json (router, sklearn baselines, plug-in rules), tradeoff.csv, train_config.json, and
Lightning's CSV logs and checkpoints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from router.infra.config import ConfigError, check_minimum, config_to_dict
from router.features import FEATURE_NAMES, JUDGE_FEATURE_NAMES
from router.model import ARCHS, HEADS, LearnedRouter, RouterConfig, save_router
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
from train.module import LOSSES, RouterModule
from train.labels import TARGETS


@dataclass
class TrainConfig:
    """What to train. Every field can be set in YAML or as a `key=value` override."""

    records: list = field(default_factory=lambda: ["runs/records/gsm8k"])  # record folders
    mode: str = "gold"  # which recorded trajectories to learn from
    arch: str = "mlp"  # linear | mlp | gru
    head: str = "cascade"  # cascade | token (scores each drafter candidate; target token_label) |
    # judge (decides the drafted token; target greedy_01_gap; judge records)
    width: int = 64
    depth: int = 2
    window: int = 4  # gru context
    hidden_inputs: list = field(default_factory=list)  # [verifier] and/or [drafter]; judge: [after] too
    follow: int = 0  # judge: a window judge reading the next `follow` drafts of the block (records with window >= it)
    follow_block: int = 0  # window judge: cut each training window as a block of this many drafts would (the
    # gamma it decodes at: a draft at block position j has g - 1 - j followers; router/window/follow.py); 0: uncut
    lag: int = 0  # judge: a lag judge reading the features of the `lag` positions before the drafted one
    ensemble: int = (
        1  # > 1: that many members (seeds seed, seed + 1, ...) averaged into one network (train/ensemble.py)
    )
    target: str = "expected_01_gap"  # logloss_gap | expected_01_gap | greedy_01_gap | token_label
    loss: str = "mse"  # mse | cost_sensitive
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 1024
    max_epochs: int = 20
    patience: int = 4  # early stopping on val_area
    seed: int = 0
    max_train_rows: int | None = None
    logger: str = "csv"  # csv | wandb (CSV logs are always written)
    wandb_project: str = "specroute"
    accelerator: str = "cpu"  # Lightning's: cpu | gpu | auto ...
    devices: int = 1  # per node; with strategy ddp each gets its share of the training batches
    strategy: str = "auto"  # Lightning's: auto | ddp | ddp_spawn | fsdp ...
    num_nodes: int = 1
    precision: str = "32-true"  # Lightning's: 32-true | bf16-mixed | 16-mixed ...
    baselines: bool = True  # sklearn logistic regression + gradient boosting
    alpha_grid: list = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0])
    # cross-fitting (router/offline/folds.py): K > 0 trains K routers, fold f on every labelled example
    # outside fold f (all splits) minus an inner validation share, into output/fold-f; eval then scores
    # every example out of fold. 0: train on the records' train split, validate on their validation split
    cross_fit: int = 0
    cross_fit_seed: int = 0
    cross_fit_validation: float = 0.2
    cross_fit_train_share: float = 1.0  # learning curves: each fold trains on this share of its training
    # examples (nested across shares; validation and scored examples unchanged, so curves pair up)
    output: str = "runs/routers/mlp"

    def __post_init__(self):
        if not self.records:
            raise ConfigError("records is empty: name the record folder(s) to train on")
        check_minimum(self, 1, "width", "depth", "window", "max_epochs", "batch_size", "devices", "num_nodes")
        check_minimum(self, 1, "max_train_rows", allow_none=True)
        check_minimum(self, 0, "patience", "weight_decay", "cross_fit", "follow", "lag", "follow_block")
        check_minimum(self, 1, "ensemble")
        if self.ensemble > 1 and self.arch == "gru":
            raise ConfigError("ensemble packs mlp or linear members into one network: use arch mlp (or ensemble 1)")
        if self.follow and self.head != "judge":
            raise ConfigError(
                f"follow (the drafts a window judge reads after its own) needs head: judge, got {self.head}"
            )
        if self.follow_block and not self.follow:
            raise ConfigError(
                f"follow_block={self.follow_block} cuts a window judge's windows: it needs follow > 0 (the drafts read)"
            )
        if self.lag and self.head != "judge" or self.lag > 8:
            raise ConfigError(
                f"lag (positions a lag judge reads before its own) needs head: judge and <= 8, got {self.lag}"
            )
        if self.cross_fit == 1 or not 0 < self.cross_fit_validation < 1:
            raise ConfigError(
                f"cross_fit must be 0 (the records' splits) or K >= 2 folds (got {self.cross_fit}), and "
                f"cross_fit_validation in (0, 1) (got {self.cross_fit_validation})"
            )
        if not 0 < self.cross_fit_train_share <= 1 or (self.cross_fit_train_share < 1 and not self.cross_fit):
            raise ConfigError(
                f"cross_fit_train_share must be in (0, 1] (got {self.cross_fit_train_share}) and below 1 only "
                f"with cross_fit=K: it is the share of each fold's training examples a learning curve uses"
            )
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        choices = {
            "mode": ("gold", "rollout", "consequence"),
            "arch": ARCHS,
            "head": HEADS,
            "loss": LOSSES,
            "target": TARGETS,
            "logger": ("csv", "wandb"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


def _hidden_sizes(cfg: TrainConfig) -> dict:
    return {role: hidden_size(cfg.records[0], role) for role in cfg.hidden_inputs}


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
    warn_if_one_sided(data.train)
    stats = input_stats(data.train)
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
        cfg.hidden_inputs,
        cfg.batch_size,
        cfg.seed,
        cfg.window if cfg.arch == "gru" else 1,
        cfg.head,
        cfg.max_train_rows,
        examples,
        cfg.follow,
        cfg.lag,
        cfg.follow_block,
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
    if cfg.head == "judge":
        train.judge_columns()  # reads the token class table the judge carries into its export
    module = RouterModule(
        config_to_dict(_router_config(cfg, train, manifests, examples)), cfg.loss, cfg.lr, cfg.weight_decay, val, val.y
    )
    if cfg.head == "judge":
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
    return RouterConfig(
        arch=cfg.arch,
        head=cfg.head,
        width=cfg.width,
        depth=cfg.depth,
        window=cfg.window,
        token_candidates=train.cand.q.shape[1],  # score as many candidates as recorded
        hidden_inputs=list(cfg.hidden_inputs),
        hidden_sizes=_hidden_sizes(cfg),
        records_id=",".join(m.id for m in manifests),
        pair=manifests[0].pair,
        alpha_grid=list(cfg.alpha_grid),
        vocab=len(train.token_classes) if cfg.head == "judge" else 0,
        follow=cfg.follow,
        follow_block=cfg.follow_block,
        lag=cfg.lag,
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
    windowed = cfg.arch == "gru"
    pred = router_scores(module.net, val)  # as eval will score it: the same inputs, the same code
    greedy = greedy_areas(val, pred, cfg.head)
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
    if cfg.baselines and not cfg.hidden_inputs and not windowed:
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
    hidden = f" + {cfg.hidden_inputs} hidden" if cfg.hidden_inputs else ""
    n_features = len(JUDGE_FEATURE_NAMES if cfg.head == "judge" else FEATURE_NAMES)
    cut = f" (cut as in blocks of {cfg.follow_block})" if cfg.follow_block else ""
    extra = (f" + {cfg.follow} following drafts{cut}" if cfg.follow else "") + (
        f" + {cfg.lag} lagged positions" if cfg.lag else ""
    )
    rows = [
        ("router", f"{cfg.arch}, {cfg.head} head, on {n_features} features{extra}{hidden}"),
        ("rows", f"train {metrics['train_rows']}, validation {metrics['val_rows']}"),
        ("val area (0 drafter, 1 oracle)" + (", greedy view" if cfg.head == "judge" else ""), f"{r['area']:.4f}"),
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
