"""LightningModule wrapping a RouterNet: losses, optimiser, and per-epoch validation metrics."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F

from router.model import RouterConfig, RouterNet
from train.config import LOSSES
from train.validation import router_metrics


class RouterModule(L.LightningModule):
    """Fits RouterNet to per-token gaps: squared error on the gap, or cost-sensitive classification
    (defer iff gap > 0, each row weighted by |gap|: mistakes cost what they lose)."""

    def __init__(
        self,
        router: dict,
        loss: str = "mse",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        val_view=None,
        val_gap: np.ndarray | None = None,
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
        self.save_hyperparameters(ignore=["val_view", "val_gap"])
        self.net = RouterNet(RouterConfig(**router))
        self.loss_name, self.lr, self.weight_decay = loss, lr, weight_decay
        self.val_view, self.val_gap = val_view, val_gap  # a router.offline.inputs.RecordView and its labels
        self._val_preds: list[torch.Tensor] = []
        self._val_idx: list[torch.Tensor] = []

    def _loss(self, pred: torch.Tensor, gap: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Weighted mean loss; weights are 1 per position, or q(v) per token-head candidate."""
        if self.loss_name == "mse":
            per_row = (pred - gap) ** 2
        else:
            weight = weight * gap.abs()
            per_row = F.binary_cross_entropy_with_logits(pred, (gap > 0).float(), reduction="none")
        return (per_row * weight).sum() / weight.sum().clamp_min(1e-8)

    def training_step(self, batch, _):
        x, gap, weight, _idx = batch
        loss = self._loss(self.net(x), gap, weight)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(gap))
        return loss

    def validation_step(self, batch, _):
        x, gap, weight, idx = batch
        pred = self.net(x)  # (B,) or (B, K)
        self.log("val_loss", self._loss(pred, gap, weight), prog_bar=True, batch_size=len(gap))
        self._val_preds.append(pred.detach().cpu())
        self._val_idx.append(idx.cpu())

    def on_validation_epoch_end(self):
        if not self._val_preds or self.val_view is None:
            return
        idx = torch.cat(self._val_idx).numpy()
        pred = np.zeros(self.val_gap.shape, dtype=np.float64)
        pred[idx] = torch.cat(self._val_preds).double().numpy()
        self._val_preds, self._val_idx = [], []
        metrics = router_metrics(pred, self.val_gap, self.val_view, regression=self.loss_name == "mse")
        self.log_dict({f"val_{k}": float(v) for k, v in metrics.items()}, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
