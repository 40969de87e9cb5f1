"""The layering specroute rests on (router/__init__.py): router/ imports no stage (nor lightning / wandb), no stage imports
another, no module takes part in an import cycle, functions stay short, and the public API imports."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data_gen", "train", "eval")


def imported_roots(path: Path) -> set[str]:
    """Top-level packages a module imports anywhere (function bodies included)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def modules_of(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", modules_of("router"), ids=lambda p: str(p.relative_to(ROOT)))
def test_router_imports_no_stage_nor_training_stack(path):
    bad = imported_roots(path) & {*STAGES, "specroute", "lightning", "wandb", "pytorch_lightning"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("stage", STAGES)
def test_stages_do_not_import_each_other(stage):
    others = set(STAGES) - {stage} | {"specroute"}
    for path in modules_of(stage):
        bad = imported_roots(path) & others
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_layering_check_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from eval.run import run_eval\n    import wandb\n")
    assert imported_roots(probe) == {"eval", "wandb"}


PACKAGES = ("router", *STAGES, "specroute")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere (function bodies included: a late import hides a
    cycle from Python, not from this graph); `from a.b import c` counts a.b.c when that is a module."""
    modules = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {owner(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".rstrip(".")
                edges |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else owner(base) for a in node.names}
        graph[name] = edges - {None, name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_late_and_relative_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg.b import g\n")  # a late import
    (tmp_path / "pkg" / "b.py").write_text("from .c import h\n")  # a relative one
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "d.py").write_text("from pkg import a\n")  # no cycle through d
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_public_api_of_design_md_imports():
    from router.decoding import generate
    from router.model import load_router
    from router.records import load_records
    from router.rules import RULES, get_rule
    from router.sampling import speculative_block

    assert callable(generate) and callable(load_router) and callable(load_records)
    # RULES: the names, as a live read-only sequence equal to the tuple of registered names
    assert callable(speculative_block) and RULES == tuple(RULES) and "opt" in RULES
    with pytest.raises(KeyError, match="opt"):
        get_rule("no-such-rule")


# The 60-line limit on function bodies (docstring excluded) is a test: a longer function holds more than one
# step. File length is not a rule (code goes where its idea lives): tests/conftest.py prints a size report of
# the product files over SIZE_REPORT_LINES at the end of every run. Scripts under benchmarks/ and studies/ are
# left out: their main() functions are argument parsing and report printing, read top to bottom.
MAX_FUNCTION_LINES, SIZE_REPORT_LINES = 60, 400


def _function_lengths(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            doc = (
                body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
            )
            length = node.end_lineno - node.lineno + 1 - (doc.end_lineno - doc.lineno + 1 if doc else 0)
            yield node.name, length


@pytest.mark.parametrize("package", PACKAGES)
def test_functions_stay_small(package):
    for path in modules_of(package):
        long = [(f, n) for f, n in _function_lengths(path) if n > MAX_FUNCTION_LINES]
        assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def long_files() -> list[tuple[str, int]]:
    """Product files over SIZE_REPORT_LINES lines, longest first (the size report, not a failure)."""
    sizes = [(str(p.relative_to(ROOT)), len(p.read_text().splitlines())) for pkg in PACKAGES for p in modules_of(pkg)]
    return sorted(((name, n) for name, n in sizes if n > SIZE_REPORT_LINES), key=lambda item: -item[1])


def test_the_size_check_counts_bodies_without_docstrings(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f():\n    """doc\n    more"""\n    a = 1\n    return a\n')
    assert list(_function_lengths(probe)) == [("f", 3)]


SCRIPT_FOLDERS = ("benchmarks", "studies", "scripts")


def test_no_script_name_stands_for_a_package():
    """Run as `python benchmarks/x.py`, a script's folder comes first on sys.path: a script named like a package
    (eval.py, train.py, vllm.py) would be imported in that package's place by every other import."""
    import importlib.util

    packages = {"router", "data_gen", "train", "eval", "specroute"}
    clashes = []
    for folder in SCRIPT_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            stem = path.stem
            spec = importlib.util.find_spec(stem)
            other = spec is not None and Path(spec.origin or "").resolve() != path.resolve()  # not the script itself
            if stem in packages or stem in sys.stdlib_module_names or other:
                clashes.append(f"{folder}/{path.name}")
    assert not clashes, f"these scripts shadow a package or module of that name: {clashes}"


def test_no_script_patches_sys_path():
    """The scripts run as modules from the repository's top (`python -m benchmarks.NAME`) or with specroute
    installed: none edits sys.path to find the packages."""
    patched = [
        str(path.relative_to(ROOT))
        for folder in (*SCRIPT_FOLDERS, "router", "data_gen", "train", "eval", "specroute")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if re.search(r"sys\.path\.(insert|append)|sys\.path\s*\+?=", path.read_text())
    ]
    assert not patched, patched


def _engine_names_in_code(path: Path) -> list[str]:
    """String literals that are a non-default engine's name, and names of one engine's own objects."""
    import io
    import tokenize

    from router.backends import DEFAULT_ENGINE, ENGINES

    names = {n for n in ENGINES if n != DEFAULT_ENGINE}
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING and tok.string.strip("\"'") in names:
            found.append(f"{tok.string} line {tok.start[0]}")
        elif tok.type == tokenize.NAME and re.search(r"(?i)llamacpp|llama_cpp|vllm", tok.string):
            found.append(f"{tok.string} line {tok.start[0]}")
    return found


def test_no_product_module_outside_the_backends_names_an_engine():
    """Engines are declared in router/backends/ and asked through it; the vLLM plugin (router/vllm/) runs
    policies inside vLLM's own loop and is its own place."""
    allowed = (ROOT / "router" / "backends", ROOT / "router" / "vllm")
    found = {
        str(path.relative_to(ROOT)): hits
        for pkg in PACKAGES
        for path in modules_of(pkg)
        if not any(path.is_relative_to(a) for a in allowed) and (hits := _engine_names_in_code(path))
    }
    assert not found, found


def test_the_engine_name_check_sees_a_literal_and_an_engine_object(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if cfg.engine == "llamacpp":\n    from router.backends.llamacpp import is_llamacpp\n')
    assert len(_engine_names_in_code(probe)) == 3
    probe.write_text('engine = DEFAULT_ENGINE  # llamacpp in a comment is prose\nnote = "runs on llama.cpp"\n')
    assert _engine_names_in_code(probe) == []


def test_the_unit_tier_names_only_test_modules_that_exist():
    """A moved or renamed module would silently drop out of `pytest -m unit`."""
    from conftest import UNIT_MODULES

    root = Path(__file__).resolve().parents[1]
    missing = sorted(name for name in UNIT_MODULES if not (root / name).is_file())
    assert not missing, f"conftest.UNIT_MODULES names missing files: {missing}"
