"""specroute eval stage: learned routers against every plug-in rule, offline on held-out records
and online in the real decoding loop, scored with the tasks' own metrics.

run.py (`specroute eval`, run_eval) reads config.py (EvalConfig) -> offline.py (every method's curve
and summary from records, routers scored through router.offline.inputs) -> grid.py (the online
(method, alpha) points; gamma.py chooses gamma: auto) -> online.py (the decoding grid, resumable per
point, each one a points.py OnlinePoint; answers scored by router.tasks.metrics) -> paired.py
(every point against the verifier, prompt by prompt) -> tables.py, plots.py, report.py and
online_report.py (curves.csv, plots, report.md, the terminal summary). Method: docs/method.md.
"""
