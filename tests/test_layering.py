"""The layering design.md rests on: router/ imports no stage (nor lightning / wandb), no stage imports
another, and the public API imports."""

from __future__ import annotations

import ast
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


def test_router_top_level_holds_only_the_method():
    top = {p.stem for p in (ROOT / "router").glob("*.py")} - {"__init__"}
    assert top == {"rules", "sampling", "decoding", "features", "records", "model", "pair", "reduce"}


def test_public_api_of_design_md_imports():
    from router.decoding import generate
    from router.model import load_router
    from router.records import load_records
    from router.rules import RULES, get_rule
    from router.sampling import speculative_block

    assert callable(generate) and callable(load_router) and callable(load_records)
    assert callable(speculative_block) and isinstance(RULES, tuple) and "opt" in RULES
    with pytest.raises(KeyError, match="opt"):
        get_rule("no-such-rule")
