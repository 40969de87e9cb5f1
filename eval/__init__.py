"""specroute eval stage: learned routers against every plug-in rule, offline on held-out records
and online in the real decoding loop, scored with the tasks' own metrics.

run.py (`specroute eval`, EvalConfig, run_eval) -> offline.py (every method's curve and summary
from records, routers scored through router.offline.inputs) -> online.py (the decoding grid,
resumable per point; answers scored by router.tasks.metrics: GSM8K, MBPP/HumanEval in router.tasks.sandbox, QA) ->
report.py (curves.csv, plots, report.md). Method: docs/method.md.
"""
