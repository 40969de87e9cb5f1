"""Held-out online prompts beyond the test split: `specroute prompts` writes the task's examples no record
folder recorded, eval decodes a prompts file (refusing any example a router or an alpha learned from), and
an online run grows: raising max_prompts decodes only the new prompts' batches."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from data_gen.plan import assign_split
from data_gen.prompts import unrecorded_prompts
from data_gen.tasks import load_task
from helpers import one_rule_online_eval
from eval.prompts import prompts_file_examples, seen_examples
from router.records import RecordsError, read_examples
from specroute import cli


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts")
    rec = root / "records"
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", f"output={rec}", "max_examples=16"]) == 0
    return root, rec


def test_prompts_are_the_unrecorded_examples_of_every_split_in_task_order(tiny_records, capsys):
    root, rec = tiny_records
    out = root / "prompts.jsonl"
    assert cli.main(["prompts", str(rec), "--output", str(out), "--max", "40"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    recorded = {e["example_id"] for e in read_examples(rec)}
    config = json.loads((rec / "gen_config.json").read_text())
    expected = [ex.example_id for ex in load_task("gsm8k") if ex.example_id not in recorded][:40]
    assert [r["example_id"] for r in rows] == expected
    assert {r["split"] for r in rows} == {"train", "validation", "test"}  # every split, not the test share only
    assert all(r["split"] == assign_split(r["example_id"], config["seed"], config["split_fractions"]) for r in rows)
    assert all(r["prompt"] and r["reference"] and "meta" in r for r in rows)
    assert "40 unrecorded examples" in capsys.readouterr().out
    # excluding a second folder drops its examples too; without --max every unrecorded example is written
    assert len(unrecorded_prompts([str(rec)])) == len(list(load_task("gsm8k"))) - len(recorded)


def test_prompts_command_refuses_bad_input(tiny_records, tmp_path, capsys):
    root, rec = tiny_records
    assert cli.main(["prompts", str(rec), "--output", str(tmp_path / "p.jsonl"), "--max", "0"]) == 2
    assert "--max is how many prompts" in capsys.readouterr().err
    assert cli.main(["prompts", str(tmp_path / "nowhere"), "--output", str(tmp_path / "p.jsonl")]) == 2
    assert "nowhere" in capsys.readouterr().err
    other = tmp_path / "mbpp"
    other.mkdir()
    manifest = json.loads((rec / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "task": "mbpp"}))
    with pytest.raises(RecordsError, match="record different tasks"):
        unrecorded_prompts([str(rec), str(other)])


def test_a_prompts_file_is_checked_against_what_routers_and_alphas_learned_from(tiny_records, tmp_path):
    root, rec = tiny_records
    examples = read_examples(rec)
    train_row = next(e for e in examples if e["split"] == "train")
    test_row = next(e for e in examples if e["split"] == "test")
    seen = seen_examples([str(rec)], {})
    assert train_row["example_id"] in seen and test_row["example_id"] not in seen  # the test split is held out
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(test_row) + "\n\n")
    assert [e["example_id"] for e in prompts_file_examples(str(good), seen)] == [test_row["example_id"]]
    leaky = tmp_path / "leaky.jsonl"
    leaky.write_text(json.dumps(test_row) + "\n" + json.dumps(train_row) + "\n")
    with pytest.raises(RecordsError, match=f"1 of .* learned from: {train_row['example_id']}"):
        prompts_file_examples(str(leaky), seen)
    # a cross-fitted router names the ids it trained on: those are refused as well
    router = SimpleNamespace(cfg=SimpleNamespace(trained_on={"example_ids": {"train": [test_row["example_id"]]}}))
    with pytest.raises(RecordsError, match="router judge's train examples"):
        prompts_file_examples(str(good), seen_examples([str(rec)], {"judge": router}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(RecordsError, match="line 1 is not JSON"):
        prompts_file_examples(str(bad), seen)
    bad.write_text(json.dumps({"example_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(RecordsError, match="line 1 lacks reference, meta"):
        prompts_file_examples(str(bad), seen)
    with pytest.raises(RecordsError, match="specroute prompts .* --output"):
        prompts_file_examples(str(tmp_path / "missing.jsonl"), seen)


def _eval(root, rec, prompts, n, out="eval"):
    return one_rule_online_eval(
        rec, f"prompts={prompts}", f"max_prompts={n}", "max_new_tokens=4", f"output={root / out}"
    )


def test_an_online_run_decodes_a_prompts_file_and_grows_by_its_new_prompts(tiny_records, monkeypatch):
    from eval import online

    root, rec = tiny_records
    prompts = root / "grow.jsonl"
    assert cli.main(["prompts", str(rec), "--output", str(prompts), "--max", "4"]) == 0
    ids = [json.loads(line)["example_id"] for line in prompts.read_text().splitlines()]
    real, calls = online._decode_batch, []

    def counted(pair, method, alpha, ids_, *rest):
        calls.append(method)
        return real(pair, method, alpha, ids_, *rest)

    monkeypatch.setattr(online, "_decode_batch", counted)
    real_score, scored = online._score_outputs, []

    def scores_counted(pair, wanted, *rest):
        scored.extend(example_id for example_id, _ in wanted)
        return real_score(pair, wanted, *rest)

    monkeypatch.setattr(online, "_score_outputs", scores_counted)
    assert cli.main(_eval(root, rec, prompts, 2)) == 0
    first = set(scored)  # the drafter's outputs no other method gave (the loops score their own)
    assert first and first <= set(ids[:2])
    metrics = json.loads((root / "eval" / "metrics.json").read_text())
    assert metrics["online"]["prompts"] == 2 and metrics["online"]["prompts_file"] == str(prompts)
    assert "task examples the records and the routers' records did not learn from" in (
        (root / "eval" / "report.md").read_text()
    )
    point = next((root / "eval" / "online").glob("opt@*.json"))
    assert [e["example_id"] for e in json.loads(point.read_text())["examples"]] == ids[:2]
    # grown to 4 prompts: each point decodes only prompts 3 and 4 (the verifier's first batch is timed again)
    calls.clear(), scored.clear()
    assert cli.main(_eval(root, rec, prompts, 4)) == 0
    assert {m: calls.count(m) for m in set(calls)} == {"opt": 2, "drafter": 2, "verifier": 2 + 1}
    assert not set(scored) & first  # outputs scored before are read back from online/verifier_logprobs.jsonl
    grown = json.loads(point.read_text())
    assert [e["example_id"] for e in grown["examples"]] == ids
    # the same as one run over the 4 prompts from the start
    assert cli.main(_eval(root, rec, prompts, 4, out="eval-once")) == 0
    once = json.loads(next((root / "eval-once" / "online").glob("opt@*.json")).read_text())
    keep = ("example_id", "new_ids", "quality")
    assert [{k: e[k] for k in keep} for e in grown["examples"]] == [{k: e[k] for k in keep} for e in once["examples"]]
    drafter = [json.loads((root / out / "online" / "drafter@0.json").read_text()) for out in ("eval", "eval-once")]
    logprobs = [[e["verifier_logprob"] for e in p["examples"]] for p in drafter]  # scored after decoding
    assert logprobs[0] == pytest.approx(logprobs[1], abs=1e-3)  # in other batches; the first two read back
    assert grown["tokens"] == once["tokens"] and len(grown["batches"]) == 4


def test_alphas_are_matched_on_answer_level_records_with_records_mode_consequence(tmp_path, capsys):
    """Records with consequence rows only (no gold rows): eval reads them with records_mode=consequence and
    matches a rule's alpha on their validation rows; the default (gold) names the missing rows."""
    rec = tmp_path / "answers"
    gen = ["gen", "--config", "configs/gen/tiny.yaml", "max_examples=16", "modes=[consequence]"]
    gen += ["consequence_max_new_tokens=8", "consequence_max_mismatches=1", "split_fractions=[0.4,0.3,0.3]"]
    assert cli.main([*gen, f"output={rec}"]) == 0
    prompts = tmp_path / "p.jsonl"
    assert cli.main(["prompts", str(rec), "--output", str(prompts), "--max", "1"]) == 0
    args = _eval(tmp_path, rec, prompts, 1)
    args[args.index("online_methods=[opt]")] = "online_methods=[kl_gate]"
    assert cli.main(args) == 2
    assert "no gold-mode rows" in capsys.readouterr().err
    assert cli.main([*args, "records_mode=consequence"]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["config"]["records_mode"] == "consequence"
    assert any(p.name.startswith("kl_gate@") for p in (tmp_path / "eval" / "online").glob("*.json"))
    assert cli.main([*args, "records_mode=answers"]) == 2
    assert "records_mode is which rows of the records eval reads: gold, rollout, consequence" in capsys.readouterr().err


def test_an_online_only_run_needs_no_test_split_when_it_decodes_a_prompts_file(tmp_path, capsys):
    """Records without a test split (every recorded problem trained on or matched on, the held-out ones
    left out as a prompts file): offline=false decodes them, offline results are refused by name."""
    rec = tmp_path / "no-test"
    gen = ["gen", "--config", "configs/gen/tiny.yaml", "max_examples=12", "split_fractions=[0.5,0.5,0.0]"]
    assert cli.main([*gen, f"output={rec}"]) == 0
    assert not read_examples(rec, split="test")
    prompts = tmp_path / "p.jsonl"
    assert cli.main(["prompts", str(rec), "--output", str(prompts), "--max", "1"]) == 0
    args = _eval(tmp_path, rec, prompts, 1)
    assert cli.main(args) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["online"]["prompts"] == 1 and metrics["offline"] is None
    args[args.index("offline=false")] = "offline=true"
    assert cli.main(args) == 2
    assert "test split" in capsys.readouterr().err
