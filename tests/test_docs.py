"""The documents a user reads stay true: every path they name exists, the reference is generated
from the code, and every shipped YAML config loads into its stage's config class."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_TOPS = "router|data_gen|train|eval|specroute|benchmarks|studies|scripts|tests|configs|docs|data"
PATH = re.compile(rf"(?<![\w./-])((?:{_TOPS})/[\w./-]*\.(?:py|sh|yaml|md|json|gz))\b")
FOLDER = re.compile(rf"(?<![\w./-])((?:{_TOPS})/(?:[\w-]+/)*)(?![\w.-])")  # e.g. router/window/
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # markdown links and images
# the product's code and scripts, whose docstrings and comments name files too
CODE = sorted(
    p
    for top in ("router", "data_gen", "train", "eval", "specroute", "benchmarks", "studies", "scripts")
    for p in (ROOT / top).rglob("*")
    if p.suffix in (".py", ".sh")
)


BARE_MD = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")  # "design.md": a document named without its folder
WRITTEN_MD = {"report.md"}  # documents the stages write into their output folders, not the repository's


def named_but_missing(text: str) -> list[str]:
    """Files and folders of the repository a text names (paths from the top, or a bare document name found at
    the top or in docs/) that do not exist."""
    missing = {p for p in PATH.findall(text) + FOLDER.findall(text) if not (ROOT / p).exists()}
    missing |= {
        m
        for m in set(BARE_MD.findall(text)) - WRITTEN_MD
        if not (ROOT / m).exists() and not (ROOT / "docs" / m).exists()
    }
    return sorted(missing)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_and_link_a_document_names_exists(doc):
    text = doc.read_text()
    missing = named_but_missing(text)
    missing += [link for link in LINK.findall(text) if "://" not in link and not (doc.parent / link).exists()]
    assert not missing, f"{doc.name} names paths or links that do not exist: {missing}"


@pytest.mark.parametrize(
    "top", ["router", "data_gen", "train", "eval", "specroute", "benchmarks", "studies", "scripts"]
)
def test_every_path_a_docstring_or_comment_names_exists(top):
    missing = {
        str(p.relative_to(ROOT)): named_but_missing(p.read_text()) for p in CODE if p.parts[len(ROOT.parts)] == top
    }
    assert not {k: v for k, v in missing.items() if v}


def test_the_path_check_sees_missing_paths_folders_and_links():
    assert named_but_missing(
        "see `router/estimate.py`, configs/gen/tiny.yaml, router/window/, router/gone/, method.md and layout.md"
    ) == ["layout.md", "router/estimate.py", "router/gone/"]
    assert LINK.findall("[a](docs/method.md) and ![b](results/x.png#top) and [c](https://x.org)") == [
        "docs/method.md",
        "results/x.png",
        "https://x.org",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_documents_hold_no_issue_numbers_or_tracker_history(doc):
    found = re.findall(r"(?i)\bissue(?:'s)?\b[^.\n]{0,20}", doc.read_text())
    assert not found, f"{doc.name}: the tracker's words belong in the tracker: {found}"


def test_readme_is_a_short_users_document():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert sum(line.startswith("|") for line in text.splitlines()) <= 32
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in text


def test_reference_is_generated_from_the_code():
    from specroute.reference import reference_markdown

    assert (ROOT / "docs" / "reference.md").read_text() == reference_markdown(), (
        "docs/reference.md is stale: run `python -m specroute.reference --write`"
    )


@pytest.mark.parametrize("doc", ["README.md", "docs/rules.md"])
def test_the_rule_tables_are_generated_from_the_registry(doc):
    from specroute.reference import rules_table, with_rules_table

    text = (ROOT / doc).read_text()
    assert with_rules_table(text, doc) == text, (
        f"{doc}'s rule table is stale: run `python -m specroute.reference --write`"
    )
    assert "\n".join(rules_table()) in text and text.count("| `token_v2` |") == 1


def test_a_registered_rule_appears_in_the_generated_table():
    from router.policy import Rule
    from router.rules import register_rule, unregister_rule
    from specroute.reference import rules_table

    register_rule(Rule("halfway", "fixed", None, "pi = (p + q) / 2 | a test rule", pi=lambda q, p, *_: (p + q) / 2))
    try:
        assert "| `halfway` | fixed | unused | pi = (p + q) / 2 \\| a test rule |" in rules_table()
    finally:
        unregister_rule("halfway")
    assert not any("halfway" in row for row in rules_table())


def test_results_show_what_holds_now_and_link_every_archive():
    """docs/results.md keeps the current figures (short); every earlier run lives in a topic archive it links."""
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(text.splitlines()) <= 300
    archives = sorted((ROOT / "docs" / "results" / "archive").glob("*.md"))
    topics = re.findall(r"^## (.+)$", text, flags=re.M)
    assert archives and len(topics) == len(archives)
    for archive in archives:
        assert f"](results/archive/{archive.name})" in text, f"docs/results.md does not link {archive.name}"
        assert "](../../results.md#" in archive.read_text()


def test_reference_lists_every_field_of_every_config():
    import dataclasses

    from data_gen.config import GenConfig
    from eval.config import EvalConfig
    from router.model import RouterArch
    from train.config import TrainConfig

    text = (ROOT / "docs" / "reference.md").read_text()
    for cls in (GenConfig, TrainConfig, RouterArch, EvalConfig):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
                assert f"`{cls.__name__}.{f.name}`" in text, f"{cls.__name__}.{f.name} has no section"
                continue
            assert f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name} missing from docs/reference.md"


def _config_class(stage: str):
    if stage == "gen":
        from data_gen.config import GenConfig

        return GenConfig
    if stage == "train":
        from train.config import TrainConfig

        return TrainConfig
    from eval.config import EvalConfig

    return EvalConfig


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
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


def test_the_policy_interface_snippet_runs_as_written():
    """docs/rules.md's hand-written policy decodes through generate, keeping exactly the drafts it says."""
    import torch

    from router.loop.common import shared_vocab
    from router.pair import tiny_pair

    snippet = re.findall(r"```python\n(.*?)```", (ROOT / "docs/rules.md").read_text(), re.S)
    snippet = next(b for b in snippet if "class KeepConfidentDrafts" in b)
    drafter, verifier, _ = tiny_pair(seed=2)
    space = {"drafter": drafter, "verifier": verifier, "ids": torch.tensor([[5, 17, 33, 41, 8]])}
    exec(snippet, space)  # noqa: S102 - the document's own code
    out = space["out"]
    assert out.stats["new_tokens"] > 0 and out.stats["rule"] == "keep_confident"
    # every kept draft is one the verifier gave at least 0.2 or its own greedy choice (verified, then kept)
    new = out.sequences[0, 5:]
    vocab = shared_vocab(drafter, verifier)  # the loop's distributions are over the shared vocabulary
    p_raw = verifier(out.sequences).logits[0, 4:-1, :vocab].float().softmax(-1)  # (new, V) at each new token
    drafted = p_raw.gather(-1, new[:, None])[:, 0]
    kept = out.sources[0] == 0
    allowed = (drafted >= 0.2 - 1e-4) | (new == p_raw.argmax(-1))
    assert bool(allowed[kept].all())
    assert bool((kept & (new != p_raw.argmax(-1))).any()), "it kept no draft the verifier would not choose"


def test_code_and_tests_hold_no_tracker_history():
    """Why code is as it is belongs in its comments; which ticket asked for it belongs in the tracker."""
    folders = ("router", "eval", "train", "data_gen", "specroute", "tests", "benchmarks", "studies")
    found = [
        f"{path.relative_to(ROOT)}: {hit}"
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
        for hit in re.findall(r"(?i)\bissues? #?\d+", path.read_text())
    ]
    assert not found, found


def test_the_one_folder_map_names_every_folder():
    """docs/design.md's table is the folder map: every product folder and every folder of router/ is in it."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## The folders") :].split("\n## ")[0]
    folders = ["router", "data_gen", "train", "eval", "specroute", "configs", "benchmarks", "studies", "tests", "docs"]
    folders += [f"router/{p.name}" for p in sorted((ROOT / "router").iterdir()) if (p / "__init__.py").exists()]
    missing = [f for f in folders if f"`{f}/`" not in table]
    assert not missing, f"docs/design.md's folder map leaves out {missing}"


def test_the_studies_index_lists_every_study():
    index = (ROOT / "studies" / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", index, flags=re.M))
    scripts = {p.stem for p in (ROOT / "studies").glob("*.py")}
    assert listed == scripts, f"studies/README.md lists {sorted(listed - scripts)} / misses {sorted(scripts - listed)}"
    for link in re.findall(r"\]\(([^)]+)\)", index):
        assert (ROOT / "studies" / link).exists(), link
