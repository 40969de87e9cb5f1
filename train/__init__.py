"""specroute train stage: fit small router networks on record folders (PyTorch Lightning, CSV or
W&B logs) and export them for decoding.

run.py (`specroute train`, TrainConfig, run_train) -> data.py (batches over the core's
router.offline.inputs, with labels.py's per-token labels) -> module.py (the LightningModule) -> validation.py (AUC, calibration and the
trade-off area against every registered rule) -> baselines.py (scikit-learn on the same inputs).
The router is saved with router.model.save_router. Method: docs/method.md.
"""
