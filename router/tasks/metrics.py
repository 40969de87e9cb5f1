"""Real task metrics for generated outputs, keyed by task name.

- gsm8k: exact match of the final number ('the answer is N', else after '####', else the last number);
- mbpp, humaneval: pass@1, the candidate and then its tests run by `router.tasks.sandbox` in an isolated
  sandbox; a pass means the tests ran to their end (an early exit fails, as in the HumanEval harness);
- triviaqa, nq, squad: exact match and token F1 against the answer aliases (SQuAD normalisation).
Each metric takes the generated text and the example's `meta` (written by data_gen into the record
folder's examples file) and returns a dict of scores in [0, 1] (`quality` is the headline one) and
`answer`, what two outputs must share to count as the same outcome (the final number, the
normalised answer, the test run's status) in eval's agreement with the verifier.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation
import string
from collections import Counter
from typing import Callable

from router.tasks.sandbox import resolve_sandbox, run_program

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


ANSWER_IS = re.compile(r"answer is[:\s]*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)


def _number(text: str) -> Decimal | None:
    """The answer number: the one after the first 'the answer is' (the few-shot chain-of-thought
    form), else the first after '####' when the text has one, else the last number. Exact (a Decimal):
    1234567 and 1234568 are two answers, 18 and 18.00 one."""
    stated = ANSWER_IS.search(text)
    if stated:
        return _exact(stated.group(1))
    marked = "####" in text
    found = NUMBER.findall(text.split("####", 1)[1] if marked else text)
    return _exact(found[0 if marked else -1]) if found else None


def _exact(number: str) -> Decimal | None:
    try:
        return Decimal(number.replace(",", ""))
    except InvalidOperation:
        return None


def answer_text(number: Decimal) -> str:
    """The canonical spelling of an answer: integers as integers, decimals without trailing zeros."""
    text = format(number.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def gsm8k_metric(output: str, meta: dict) -> dict:
    """Exact match of the final number of the output with the short answer (compared by value)."""
    got, want = _number(output), _number(str(meta["short_answer"]))
    return {
        "quality": float(got is not None and want is not None and got == want),
        "answer": "" if got is None else answer_text(got),
    }


def normalise_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(pred: str, gold: str) -> float:
    p, g = normalise_answer(pred).split(), normalise_answer(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g or common == 0:
        return float(p == g)
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def qa_metric(output: str, meta: dict) -> dict:
    """Exact match and F1 of the output's first line against every alias (best alias counts)."""
    answer = output.strip().split("\n", 1)[0]
    answer = re.sub(r"^(answer|a)\s*:\s*", "", answer, flags=re.IGNORECASE)
    aliases = meta.get("aliases") or ([meta["reference"].strip()] if meta.get("reference") else [])
    em = max((float(normalise_answer(answer) == normalise_answer(a)) for a in aliases), default=0.0)
    f1 = max((_f1(answer, a) for a in aliases), default=0.0)
    return {"quality": em, "exact_match": em, "f1": f1, "answer": normalise_answer(answer)}


# an opening or closing code fence: ``` or ~~~ (three or more), maybe indented, then an info string
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*?)[ \t]*$")
PYTHON_INFO = ("", "python", "py", "python3", "py3", "pycon", "ipython")


def _fenced_blocks(output: str) -> list[tuple[str, str]]:
    """(info string, code) of each fenced block, in order; a block the output ends inside runs to the end.
    A closing fence is the opening's character, at least as long, with nothing after it (CommonMark); the
    code is dedented by the opening fence's indentation."""
    blocks, lines, i = [], output.split("\n"), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        i += 1
        if not opening:
            continue
        char, size, indent = opening["fence"][0], len(opening["fence"]), len(opening["indent"])
        body = []
        while i < len(lines):
            closing = FENCE.match(lines[i])
            if closing and closing["fence"][0] == char and len(closing["fence"]) >= size and not closing["info"]:
                i += 1
                break
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" \t"))) :])
            i += 1
        while body and not body[-1].strip():  # the newline an unclosed block ends with
            body.pop()
        blocks.append((opening["info"].strip().lower(), "\n".join(body) + "\n"))
    return blocks


def extract_code(output: str) -> str:
    """The first fenced Python block of the output (```python, ```Python, ```py3, ``` python, ~~~, an indented
    fence, a bare fence), else its first fenced block of any language, else the whole output."""
    blocks = _fenced_blocks(output)
    python = [code for info, code in blocks if (info.split() or [""])[0] in PYTHON_INFO]
    if python:
        return python[0]
    return blocks[0][1] if blocks else output


# what a code metric reads from an example's meta, and the type each field must have
CODE_FIELDS = {
    "mbpp": {"tests": "a list of assert statements (strings)"},
    "humaneval": {
        "entry_point": "a function name",
        "test": "test code defining check()",
        "function_prompt": "the prompt",
    },
}


def check_metric_fields(name: str, meta: dict, example_id: str = "") -> None:
    """Refuse an example a code metric cannot judge (a field missing, `tests` given as one string, or no test
    to run: any program would pass it), naming the example, the field and what it must hold, instead of
    scoring it 0, 1 or a KeyError."""
    for field, must in CODE_FIELDS.get(name, {}).items():
        value = meta.get(field)
        ok = (
            isinstance(value, list) and all(isinstance(t, str) for t in value)
            if field == "tests"
            else isinstance(value, str)
        )
        if not ok:
            got = "missing" if value is None else f"a {type(value).__name__}"
            raise ValueError(
                f"example {example_id!r}: the {name} metric needs meta field {field!r} as {must}; it is {got}: "
                f'fix the data file\'s {field!r} column (e.g. tests: ["assert f(1) == 2"])'
            )
        if field in ("tests", "test") and not any(t.strip() for t in ([value] if field == "test" else value)):
            raise ValueError(
                f"example {example_id!r}: the {name} metric's meta field {field!r} holds no test to run "
                f"({value!r}), so any program would pass: give it {must}, or leave the example out"
            )


def mbpp_metric(output: str, meta: dict, timeout_s: float = 10.0, sandbox: str | None = None) -> dict:
    check_metric_fields("mbpp", meta)
    code = extract_code(output)
    # the setup builds the tests' fixtures, which may use the solution's classes (mbpp-367's `Node`): after it
    program = "\n".join([code, meta.get("test_setup_code") or "", *meta["tests"]]) + "\n"
    outcome = run_program(program, timeout_s, sandbox=sandbox)
    return {"quality": float(outcome.passed), "timeout": float(outcome.status == "timeout"), "answer": outcome.status}


def humaneval_program(code: str, meta: dict) -> str:
    """The program the reference harness runs (human-eval's execution.py): prompt + completion + test +
    check(entry_point). A completion that restates the whole function still follows the prompt, so the prompt's
    imports (`from typing import List`) and helpers stay defined; the restated function replaces the prompt's."""
    prompt = meta["function_prompt"]
    if code[:1] not in ("", " ", "\t") and prompt and not prompt.endswith("\n"):
        prompt += "\n"  # a restated function must start on its own line
    return f"{prompt}{code}\n{meta['test']}\ncheck({meta['entry_point']})\n"


def humaneval_metric(output: str, meta: dict, timeout_s: float = 10.0, sandbox: str | None = None) -> dict:
    check_metric_fields("humaneval", meta)
    outcome = run_program(humaneval_program(extract_code(output), meta), timeout_s, sandbox=sandbox)
    return {"quality": float(outcome.passed), "timeout": float(outcome.status == "timeout"), "answer": outcome.status}


METRICS: dict[str, Callable[[str, dict], dict]] = {
    "gsm8k": gsm8k_metric,
    "mbpp": mbpp_metric,
    "humaneval": humaneval_metric,
    "triviaqa": qa_metric,
    "nq": qa_metric,
    "squad": qa_metric,
    "exact_match": qa_metric,  # custom data: `metric: exact_match` scores against meta aliases or the reference
}


CODE_METRICS = ("mbpp", "humaneval")  # run generated programs: need the sandbox


def get_metric(task: str, override: str | None = None, sandbox: str | None = None) -> Callable[[str, dict], dict]:
    """The metric of a task (or the one named in the eval config), or a clear error. Metrics that run
    generated programs check the sandbox now (before any decoding) and use it."""
    name = override or task
    if name not in METRICS:
        raise KeyError(
            f"no task metric for {name!r}: known metrics are {', '.join(METRICS)}; for custom data set "
            f"`metric:` in the eval config (e.g. exact_match with meta['aliases']) or run offline only"
        )
    if name in CODE_METRICS:
        return functools.partial(METRICS[name], sandbox=resolve_sandbox(sandbox))
    return METRICS[name]


def check_metric_settings(metric: str | None, sandbox: str, device: str) -> None:
    """A config's metric (None: the task's), sandbox and device name, checked when the config is built."""
    from router.pair import check_device
    from router.tasks.sandbox import SANDBOXES

    if metric is not None and metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)} (or null: the task's), got {metric!r}")
    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
    check_device(device)
