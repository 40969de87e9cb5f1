"""The documents a user reads stay true: every path they name exists, the reference is generated
from the code, and every shipped YAML config loads into its stage's config class."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(
    r"(?<![\w./-])((?:router|data_gen|train|eval|specroute|benchmarks|studies|scripts|tests|configs)"
    r"/[\w./-]*\.(?:py|sh|yaml))\b"
)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_code_path_a_document_names_exists(doc):
    missing = sorted({p for p in PATH.findall(doc.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def test_the_path_check_sees_a_missing_path():
    assert PATH.findall("see `router/estimate.py` and configs/gen/tiny.yaml") == [
        "router/estimate.py",
        "configs/gen/tiny.yaml",
    ]


def test_readme_is_a_short_users_document():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert sum(line.startswith("|") for line in text.splitlines()) <= 32
    assert not re.search(r"\bissue \d+", text), "issue numbers belong in the tracker, not the README"
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in text


def test_reference_is_generated_from_the_code():
    from specroute.reference import reference_markdown

    assert (ROOT / "docs" / "reference.md").read_text() == reference_markdown(), (
        "docs/reference.md is stale: run `python -m specroute.reference > docs/reference.md`"
    )


def test_reference_lists_every_field_of_every_config():
    import dataclasses

    from data_gen.config import GenConfig
    from eval.config import EvalConfig
    from train.run import TrainConfig

    text = (ROOT / "docs" / "reference.md").read_text()
    for cls in (GenConfig, TrainConfig, EvalConfig):
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name} missing from docs/reference.md"


def _config_class(stage: str):
    if stage == "gen":
        from data_gen.config import GenConfig

        return GenConfig
    if stage == "train":
        from train.run import TrainConfig

        return TrainConfig
    from eval.config import EvalConfig

    return EvalConfig


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_loads(path):
    from router.infra.config import load_config

    cfg = load_config(_config_class(path.parent.name), path)
    assert cfg.output, f"{path} names no output folder"


def test_readme_python_runs_as_written():
    """The tour's decoding snippet and the add-a-rule snippet run as they stand in the README (the
    router snippet needs a trained folder: test_router_model covers load_router + generate)."""
    from router.rules import get_rule, unregister_rule

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    tour = next(b for b in blocks if "load_pair(" in b)
    rule = next(b for b in blocks if "register_rule(" in b)
    space: dict = {}
    exec(tour, space)  # noqa: S102 - the README's own code
    assert space["out"].stats["new_tokens"] > 0
    try:
        exec(rule, space)  # noqa: S102
        assert get_rule("ratio").form == "cascade"
        out = space["generate"](space["drafter"], space["verifier"], space["ids"], rule="ratio", alpha=0.5)
        assert out.stats["new_tokens"] > 0
    finally:
        unregister_rule("ratio")


def test_readme_router_decoding_runs_as_written(tmp_path, monkeypatch):
    """The "Decoding with a trained router" snippet runs as it stands, on a router folder made for
    the tiny pair at the path it names (specroute's API, the folder route, the in-process route)."""
    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router
    from router.pair import load_pair, pair_identity

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    tour = next(b for b in blocks if "load_pair(" in b)
    snippet = next(b for b in blocks if "cascade_generate" in b)
    monkeypatch.chdir(tmp_path)
    drafter, verifier, tok = load_pair("tiny:drafter", "tiny:verifier")
    pair = pair_identity(drafter, verifier, None)
    save_router(LearnedRouter(RouterNet(RouterConfig(pair=pair))), tmp_path / "runs/routers/tiny-mlp")
    space: dict = {}
    exec(tour, space)  # noqa: S102 - the README's own code
    exec(snippet, space)  # noqa: S102
    assert space["seqs"].shape[0] == 1 and space["res"].stats["new_tokens"] > 0
    assert space["out"].sequences.shape[0] == 1
