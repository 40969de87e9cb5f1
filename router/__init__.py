"""specroute core, importable without lightning or wandb, and importing no stage.

The method and the public API sit at the top of this package (policy.py, view.py, rules.py, targets.py,
sampling.py, decoding.py, features.py, records.py, model.py, pair.py); the machinery is in subfolders by role.
What each file and folder holds: docs/design.md, "The folders" (the one folder map). Method: docs/method.md.
"""
