"""Label files (data_gen/label_store.py): a consequence recording's labels exported, and replayed into a
new recording with other inputs or more examples, give the rows a fresh search gives, with no search
for the stored examples; a stored label that no longer fits the new pass is dropped and counted; labels
of other settings or another pair are refused."""

import gzip
import shutil
import json
from pathlib import Path

import numpy as np
import pytest

from data_gen.label_store import LabelStore, export_labels
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from router.pair import tiny_pair
from router.infra.config import ConfigError
from router.labels import AGREE, IMPORTANT, UNTESTED
from router.records import RecordsError, load_records, read_manifest
from router.tasks import metrics
from specroute.cli import main as cli
from helpers import length_metric, qa_data, tiny_gen_config

LABEL_COLUMNS = ("example_id", "split", "position", "token", "consequence", "branch_correct", "branch_answer")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(seed=2, noise=0.05)  # several mismatches per answer, some important


@pytest.fixture
def setup(tmp_path, pair, monkeypatch):
    monkeypatch.setitem(metrics.METRICS, "length3", length_metric)
    data = qa_data(tmp_path, 10)

    def record(name, **kw):
        cfg = tiny_gen_config(tmp_path, data, output=str(tmp_path / name), consequence_horizon=4, **kw)
        return cfg, run_gen(cfg, Recorder(cfg, *pair))

    return record


def _rows(folder, columns=LABEL_COLUMNS + ("horizon_score",)):
    ds = load_records(folder, mode="consequence").to_pandas()
    return ds.sort_values(["example_id", "position"]).reset_index(drop=True)[list(columns)]


def test_replayed_labels_equal_a_fresh_search_and_grow_with_new_examples(setup, tmp_path):
    _, fresh = setup("fresh")  # all 10 examples searched: the reference
    setup("first6", max_examples=6)
    header = export_labels(tmp_path / "first6", tmp_path / "labels.jsonl.gz")
    assert header["examples"] == 6 and header["tested"] > 0
    # the 6 labelled examples replayed with window inputs added, the other 4 searched
    _, replay = setup("replay", window=2, labels_from=str(tmp_path / "labels.jsonl.gz"))
    assert _rows(tmp_path / "replay").equals(_rows(tmp_path / "fresh"))
    assert read_manifest(tmp_path / "replay").window == 2
    counts = replay.counts
    assert counts["replayed_examples"] == 6 and counts["replayed_labels"] == header["tested"]
    assert counts["replayed_labels_dropped"] == 0
    assert 0 < counts["consequence_branch_tokens"] < fresh.counts["consequence_branch_tokens"]  # only 4 searched
    assert replay.consequence == fresh.consequence


def test_a_study_replay_without_gold_rows_or_windows_keeps_every_label(setup, tmp_path):
    """docs/usage.md's fast replay for out-of-fold studies: labels of a recording with gold rows and
    window inputs, replayed with `modes: [consequence]` and `window: 0`, give the same consequence rows
    and no gold rows (modes and window are not label settings, so the file is accepted)."""
    setup("full", window=2)
    export_labels(tmp_path / "full", tmp_path / "labels.jsonl.gz")
    _, study = setup("study", modes=["consequence"], window=0, labels_from=str(tmp_path / "labels.jsonl.gz"))
    assert _rows(tmp_path / "study").equals(_rows(tmp_path / "full"))
    manifest = read_manifest(tmp_path / "study")
    assert manifest.modes == ["consequence"] and manifest.window == 0
    assert study.counts["replayed_examples"] == 10 and study.counts["replayed_labels_dropped"] == 0
    assert study.counts.get("consequence_branch_tokens", 0) == 0  # nothing searched


def _first_important(lines: list[str]) -> tuple[int, int]:
    """(line, item) of a label file's first important label: a harmless label's substituted token is the
    answer's own token there (data_gen.label_store.substitutions reads it from the answer)."""
    return next(
        (k, i) for k in range(1, len(lines)) for i, t in enumerate(json.loads(lines[k])["tested"]) if t[1] == IMPORTANT
    )


def test_a_label_that_no_longer_fits_is_dropped_and_counted(setup, tmp_path):
    cfg, _ = setup("first", max_examples=6)
    path = tmp_path / "labels.jsonl.gz"
    export_labels(cfg.output, path)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    k, i = _first_important(lines)
    entry = json.loads(lines[k])
    t, kind, sub, *_ = entry["tested"][i]
    entry["tested"][i][2] = sub + 1  # as if another dtype's drafter had substituted another token
    lines[k] = json.dumps(entry)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    _, replay = setup("replay", max_examples=6, labels_from=str(path))
    assert replay.counts["replayed_labels_dropped"] == 1
    rows = _rows(tmp_path / "replay", LABEL_COLUMNS + ("q_argmax",))
    at = rows[(rows.example_id == entry["example_id"]) & (rows.position == t)].iloc[0]
    # what this pass says there, without a label: the verifier's token stays at an important one
    assert at.consequence == (AGREE if at.q_argmax == at.token else UNTESTED) and at.branch_answer == ""
    before = _rows(cfg.output)
    assert (rows.consequence != before.consequence).sum() == 1


def test_an_export_keeps_what_its_file_knows_beyond_the_folder(setup, tmp_path):
    """Exporting a smaller or replayed folder over an existing label file loses nothing: the file's other
    examples stay, and a label the replay dropped (another CPU's argmax) stays with its substitution."""
    cfg, _ = setup("all")
    path = tmp_path / "labels.jsonl.gz"
    full = export_labels(cfg.output, path)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    k, i = _first_important(lines)
    entry = json.loads(lines[k])
    entry["tested"][i][2] += 1  # as if another machine's drafter had substituted another token there
    moved = entry["tested"][i]
    path.write_bytes(gzip.compress(("\n".join([*lines[:k], json.dumps(entry), *lines[k + 1 :]]) + "\n").encode()))
    setup("first4", max_examples=4, labels_from=str(path))  # drops that label: its argmax differs here
    header = export_labels(tmp_path / "first4", path)
    store = LabelStore(path)
    assert header["examples"] == len(store.entries) == 10 and header["carried"]["examples"] == 6
    assert header["carried"]["tested"] == 1 and header["tested"] == full["tested"]
    assert moved in store.entries[entry["example_id"]]["tested"]
    assert set(store.entries) == {json.loads(line)["example_id"] for line in lines[1:]}
    other, _ = setup("other", max_examples=4, consequence_max_new_tokens=9)
    with pytest.raises(ConfigError, match="other settings"):
        export_labels(other.output, path)
    assert LabelStore(path).header == header  # refused before anything was written


def test_labels_of_other_settings_or_another_pair_are_refused(setup, tmp_path, monkeypatch):
    cfg, _ = setup("first", max_examples=4)
    path = tmp_path / "labels.jsonl.gz"
    export_labels(cfg.output, path)
    other = tiny_gen_config(tmp_path, cfg.data_path, consequence_horizon=4, consequence_max_new_tokens=9)
    with pytest.raises(ConfigError, match="consequence_max_new_tokens: 14 there, 9 here"):
        LabelStore(path).check(other, tiny_pair(seed=2, noise=0.05))
    with pytest.raises(ConfigError, match="verifier"):
        LabelStore(path).check(cfg, tiny_pair(seed=5, noise=0.05))
    with pytest.raises(ConfigError, match="does not exist"):
        LabelStore(tmp_path / "missing.jsonl.gz")
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="is not readable"):
        LabelStore(tmp_path / "bad.jsonl.gz")


def test_the_cli_exports_and_shows_and_explains_a_recording_in_progress(setup, tmp_path, capsys):
    cfg, _ = setup("first", max_examples=4)
    out = tmp_path / "labels" / "l.jsonl.gz"
    assert cli(["labels", "export", cfg.output, str(out)]) == 0
    assert cli(["labels", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "4 examples" in shown and "labels_from=" in shown
    important = sum(t[1] == IMPORTANT for e in LabelStore(out).entries.values() for t in e["tested"])
    assert (
        f"{LabelStore(out).header['important']} important" in shown and important == LabelStore(out).header["important"]
    )
    (Path(cfg.output) / "manifest.json").unlink()
    assert cli(["labels", "export", cfg.output, str(out)]) == 2
    assert "specroute snapshot" in capsys.readouterr().err
    gold = tmp_path / "gold"
    setup("gold", max_examples=4, modes=["gold"])
    with pytest.raises(RecordsError, match="no consequence rows"):
        export_labels(gold, tmp_path / "g.jsonl.gz")


@pytest.mark.e2e
def test_the_background_chain_exports_its_labels_and_replays_them(tmp_path):
    """scripts/label-background.sh: a stage labels, `export` writes its labels (from a snapshot while a
    folder has no manifest), and the next run on a fresh machine replays them and searches only the rest."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "tc.yaml").write_text(
        "task: gsm8k\ndrafter: tiny:drafter\nverifier: tiny:verifier\ndtype: float32\nmax_examples: 8\n"
        "modes: [gold, consequence]\nconsequence_max_new_tokens: 12\nconsequence_max_mismatches: 2\n"
        "max_continuation_tokens: 16\nmax_prompt_tokens: 128\nbatch_size: 4\nexamples_per_shard: 4\n"
    )
    env = dict(
        SPECROUTE_BIN=str(Path(sys.executable).parent),
        LABEL_CONFIGS=str(configs),
        LABEL_RECORDS=str(tmp_path / "records"),
        LABEL_FILES=str(tmp_path / "labels"),
        LABEL_STAGES="tc:4",
        PATH="/usr/bin:/bin",
        HOME=str(tmp_path),
    )
    script = str(repo / "scripts" / "label-background.sh")

    def chain(*args, **extra):
        done = subprocess.run(["bash", script, *args], env={**env, **extra}, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    chain()
    assert len(LabelStore(tmp_path / "labels" / "tc.jsonl.gz").entries) == 4  # a finished stage exports itself
    (tmp_path / "labels" / "tc.jsonl.gz").unlink()
    (tmp_path / "records" / "tc" / "manifest.json").unlink()  # as if the stage were still running
    chain("export")
    store = LabelStore(tmp_path / "labels" / "tc.jsonl.gz")
    assert len(store.entries) == 4 and not (tmp_path / "records" / ".export-tc").exists()
    shutil.rmtree(tmp_path / "records")  # a fresh machine: only the committed label file is left
    committed = gzip.decompress((tmp_path / "labels" / "tc.jsonl.gz").read_bytes()).decode().splitlines()
    chain(LABEL_STAGES="tc:8")
    counts = read_manifest(tmp_path / "records" / "tc").counts
    assert counts["replayed_examples"] == 4 and counts["replayed_labels_dropped"] == 0
    grown = gzip.decompress((tmp_path / "labels" / "tc.jsonl.gz").read_bytes()).decode().splitlines()
    assert grown[1:5] == committed[1:5] and len(grown) == 9  # the 4 committed entries as they were, 4 added
    assert json.loads(grown[0])["added"] == 4


def test_window_rules_join_the_answer_level_measure_where_labels_have_windows(setup, tmp_path):
    """A consequence recording with window inputs: fly is scored at the labelled mismatches beside the
    per-position rules, from the recorded windows, and stays out where the windows are too short."""
    from eval.offline import consequence_catch
    from router.offline.inputs import RecordView
    from router.offline.views import greedy_rule_scores
    from router.rules import get_rule

    width = get_rule("fly").needs.follow
    cfg, _ = setup("wide", window=width, split_fractions=[0.0, 0.0, 1.0])
    view = RecordView([cfg.output], "test", mode="consequence")
    scores = greedy_rule_scores(view)
    windows = view.follow_windows(np.arange(len(view)), width)
    assert np.array_equal(scores["fly"], get_rule("fly").offline_score(windows)) and "entropy_gate" in scores
    caught = consequence_catch([cfg.output], {})
    assert caught is not None and {"fly", "entropy_gate", "token_v2"} <= set(caught["methods"])
    short, _ = setup("short", window=width - 1, split_fractions=[0.0, 0.0, 1.0])
    assert "fly" not in greedy_rule_scores(RecordView([short.output], "test", mode="consequence"))


def test_window_crossfit_study_pairs_judges_on_answer_level_labels(setup, tmp_path, monkeypatch, capsys):
    """studies/window_crossfit.py --labels consequence: both judges learn the answer-level label and are
    paired on the kept shares of important and harmless mismatches, over the tested mismatches."""
    from helpers import study_module

    cfg, _ = setup("cw", window=2)
    study = study_module("window_crossfit")
    args = ["x", "--labels", "consequence", "--records", cfg.output, "--k", "2", "--follow", "2", "--hidden"]
    monkeypatch.setattr("sys.argv", [*args, "--epochs", "1", "--out", str(tmp_path / "cf")])
    study.main()
    result = json.loads((tmp_path / "cf" / "crossfit.json").read_text())
    assert set(result["richer_minus_judge"]) == {"important", "harmless"}
    for measure, by_target in result["richer_minus_judge"].items():
        for t, d in by_target.items():
            summaries = {
                name: result["summaries"][name]["targets"][t]["methods"][name] for name in ("judge-window", "judge")
            }
            assert d["diff"] == pytest.approx(summaries["judge-window"][measure] - summaries["judge"][measure])
            assert d["low"] <= d["diff"] <= d["high"] and d["examples"] == 10
    assert result["summaries"]["judge"]["tested_only"] and result["summaries"]["judge"]["matched"]
    assert "share of the tested IMPORTANT" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", [*args, "--epochs", "1", "--follow-block", "2", "--out", str(tmp_path / "cut")])
    study.main()  # the window judge as it decodes at gamma 2: windows cut in training and scoring
    assert json.loads((tmp_path / "cut" / "crossfit.json").read_text())["follow_block"] == 2
    folds = {
        json.loads(f.read_text())["follow_block"]
        for f in (tmp_path / "cut" / "judge-window").glob("fold-*/config.json")
    }
    assert folds == {2} and {
        json.loads(f.read_text())["follow_block"] for f in (tmp_path / "cut" / "judge").glob("fold-*/config.json")
    } == {0}


def test_short_horizon_only_labels_replay_too(setup, tmp_path):
    """consequence_max_mismatches=0 (the cheap labelling at scale): the answers and every mismatch's
    short-horizon score come back from the file, nothing decoded."""
    cfg, _ = setup("h", consequence_max_mismatches=0)
    export_labels(cfg.output, tmp_path / "h.jsonl.gz")
    _, replay = setup("h2", consequence_max_mismatches=0, labels_from=str(tmp_path / "h.jsonl.gz"))
    assert _rows(tmp_path / "h2").equals(_rows(tmp_path / "h"))
    assert replay.counts["replayed_examples"] == 10 and replay.counts.get("horizon_mismatches", 0) == 0


def test_add_only_keeps_the_files_entries_and_appends_the_new_examples(setup, tmp_path, capsys):
    """`specroute labels export --add-only`: a committed label file grows by the folder's new examples while
    its own entries stay byte for byte (a plain export re-derives them from the folder: here one label the file
    holds differently from the folder's search is taken over by the folder's)."""
    setup("first6", max_examples=6)
    path = tmp_path / "labels.jsonl.gz"
    export_labels(tmp_path / "first6", path)
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    k, i = _first_important(lines)
    entry = json.loads(lines[k])
    entry["tested"][i][4] = "as the file has it"  # the branch's answer as another search stored it
    lines[k] = json.dumps(entry)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    cfg, _ = setup("all")  # all 10 examples searched afresh
    plain = tmp_path / "plain.jsonl.gz"
    shutil.copy(path, plain)
    export_labels(cfg.output, plain)
    assert LabelStore(plain).entries[entry["example_id"]] != entry  # a plain export re-derives it
    assert cli(["labels", "export", cfg.output, str(path), "--add-only"]) == 0
    assert "(4 examples added, the others kept as they were)" in capsys.readouterr().out
    grown = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert grown[1:7] == lines[1:7]  # the file's own entries, unchanged and in their order
    store, fresh = LabelStore(path), LabelStore(plain)
    new = [json.loads(line) for line in grown[7:]]
    assert len(new) == 4 and all(e == fresh.entries[e["example_id"]] for e in new)
    header = store.header
    assert (header["examples"], header["added"], header["carried"]["examples"]) == (10, 4, 6)
    assert header["tested"] == sum(len(e["tested"]) for e in store.entries.values())
