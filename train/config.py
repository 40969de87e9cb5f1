"""`specroute train`'s configuration: `TrainConfig`, the data and optimisation of one training run around the
architecture of the router it builds (`router: RouterArch`, router/model.py), litgpt style.

In YAML and as `key=value` overrides the architecture's keys are written either flat (`head: judge`,
`width=32`, as before) or dotted (`router.head=judge`) or as a mapping (`router: {head: judge}`);
router/infra/config.py resolves all three. In Python: `TrainConfig(router=RouterArch(head="judge"), ...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.infra.config import ConfigError, check_listed_once, check_minimum
from router.model import RouterArch
from router.records import RECORD_MODES
from train.labels import TARGETS

LOSSES = ("mse", "cost_sensitive")  # train/module.py implements each


@dataclass
class TrainConfig:
    """What to train. Every field can be set in YAML or as a `key=value` override; the architecture's too."""

    records: list = field(default_factory=lambda: ["runs/records/gsm8k"])  # record folders
    mode: str = "gold"  # which recorded trajectories to learn from
    router: RouterArch = field(default_factory=RouterArch)  # the architecture (arch, head, width, depth, window,
    # hidden_inputs, follow, follow_block, lag, running: router/model.py), its keys also written flat
    ensemble: int = 1  # > 1: that many members (seeds seed, seed + 1, ...) averaged into one network
    # (train/ensemble.py)
    target: str = "expected_01_gap"  # logloss_gap | expected_01_gap | greedy_01_gap | token_label | consequence |
    # signed | horizon_score (train/labels.py)
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
        check_listed_once("records", self.records)
        check_minimum(self, 1, "max_epochs", "batch_size", "devices", "num_nodes")
        check_minimum(self, 1, "max_train_rows", allow_none=True)
        check_minimum(self, 0, "patience", "weight_decay", "cross_fit")
        if not isinstance(self.router, RouterArch):
            raise ConfigError(f"router must be a RouterArch (router/model.py), got {type(self.router).__name__}")
        check_minimum(self, 1, "ensemble")
        if self.ensemble > 1 and self.router.arch == "gru":
            raise ConfigError("ensemble packs mlp or linear members into one network: use arch mlp (or ensemble 1)")
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
            "mode": RECORD_MODES,
            "loss": LOSSES,
            "target": TARGETS,
            "logger": ("csv", "wandb"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        check_accelerator(self.accelerator)


ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")  # Lightning's names for what trains the router


def check_accelerator(accelerator: str) -> None:
    """Refuse an accelerator this machine does not have by name (Lightning would end in its own traceback)."""
    if accelerator not in ACCELERATORS:
        raise ConfigError(f"accelerator must be one of {', '.join(ACCELERATORS)}, got {accelerator!r}")
    import torch

    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"accelerator={accelerator}, but this machine has no CUDA device: use accelerator=cpu")
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("accelerator=mps, but this machine has no Apple GPU: use accelerator=cpu")
