"""Code metrics refuse examples they cannot judge (router/tasks/metrics.py)."""

import pytest


def test_code_metrics_refuse_examples_they_cannot_judge():
    from router.tasks.metrics import check_metric_fields, mbpp_metric

    check_metric_fields("mbpp", {"tests": ["assert 1 == 1"]}, "ok")
    check_metric_fields("gsm8k", {}, "no fields needed")
    with pytest.raises(ValueError, match=r"example 'e1': the mbpp metric needs meta field 'tests' .* it is a str"):
        check_metric_fields("mbpp", {"tests": "assert f(1) == 2"}, "e1")
    with pytest.raises(ValueError, match=r"'tests' .* it is missing"):
        mbpp_metric("def f(): pass", {}, sandbox="python")
    with pytest.raises(ValueError, match=r"'entry_point' .* it is missing"):
        check_metric_fields("humaneval", {"test": "def check(f): pass", "function_prompt": ""}, "h")
