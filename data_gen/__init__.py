"""specroute data_gen stage: record drafter/verifier token distributions and gold continuations on
task data, into record folders (Arrow shards + manifest.json, router.records).

run.py (`specroute gen`, run_gen) reads config.py (GenConfig) -> plan.py (the task's examples from
tasks.py, their splits, shards and batches; the examples files) -> recorder.py (the models, one batch
of examples -> record rows: scoring.py teacher-forces both models, consequence.py searches answers,
judge.py adds the verifier's view of the drafts) -> record_folder.py (start, resume or grow a folder; shards
written atomically; the manifest written last).
"""
