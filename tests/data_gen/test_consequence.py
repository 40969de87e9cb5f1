"""Consequence labels (data_gen/consequence.py): the batched search equals a plain one-example-at-a-
time search, the recorder writes its labels into the record schema and resumes exactly, and
routers trained on them decode."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_gen.consequence import ConsequenceSearch
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from router.tasks import metrics
from router.decoding import generate
from router.loop.common import eos_ids
from router.model import load_router
from router.loop.prefix import SharedPrefix
from router.labels import AGREE, HARMLESS, IMPORTANT, UNTESTED
from router.records import load_records, read_manifest
from router.pair import tiny_pair
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train
from helpers import (
    CONSEQUENCE_BUDGET,
    CONSEQUENCE_MISMATCHES,
    length_metric,
    qa_data,
    study_module,
    tiny_gen_config,
)

BUDGET, MISMATCHES = CONSEQUENCE_BUDGET, CONSEQUENCE_MISMATCHES


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(seed=2, noise=0.05)  # a drafter that often disagrees: several mismatches per answer


def plain_search(drafter, verifier, tok, prompt):
    """The search written out for one example with Hugging Face generate and plain forwards."""
    eos = eos_ids(verifier)

    def greedy(ids, n):
        x = torch.tensor([ids])
        out = verifier.generate(
            x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0
        )[0, len(ids) :].tolist()
        return out[: next((i + 1 for i, t in enumerate(out) if t in eos), len(out))]

    def argmax_along(answer):
        logits = drafter(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : len(prompt) + len(answer) - 1]
        return logits[:, :259].argmax(-1).tolist()

    def correct(tokens):
        return int(length_metric(tok.decode(tokens, skip_special_tokens=True), {})["quality"])

    answer = greedy(prompt, BUDGET)
    verdict, labels, pos = correct(answer), {}, 0
    while len(labels) < MISMATCHES:
        am = argmax_along(answer)
        t = next((t for t in range(pos, len(answer)) if am[t] != answer[t]), None)
        if t is None:
            break
        start = answer[:t] + [am[t]]
        tail = [] if am[t] in eos or len(start) >= BUDGET else greedy(prompt + start, BUDGET - len(start))
        if correct(start + tail) == verdict:
            labels[t], answer = HARMLESS, start + tail
        else:
            labels[t] = IMPORTANT
        pos = t + 1
    return answer, verdict, labels


@torch.no_grad()
def test_batched_search_equals_the_plain_search(pair):
    drafter, verifier, tok = pair
    shared = [7, 9, 11, 13] * 10
    prompts = [shared + [20 + i, 30 + 2 * i, 40 + 3 * i] for i in range(6)]
    for prefix, lookup in ((None, 4), (SharedPrefix.common(prompts), 4), (None, 0), (SharedPrefix.common(prompts), 2)):
        search = ConsequenceSearch(
            drafter,
            verifier,
            tok,
            length_metric,
            [],
            259,
            0,
            BUDGET,
            MISMATCHES,
            batch_size=4,
            prefix=prefix,
            lookup=lookup,
        )
        found = search.run(prompts, [{}] * len(prompts))
        kinds = set()
        for prompt, s in zip(prompts, found):
            answer, verdict, labels = plain_search(drafter, verifier, tok, prompt)
            assert (s.tokens, s.correct, s.labels) == (answer, verdict, labels)
            kinds |= set(labels.values())
            for t, kind in labels.items():  # the branch's verdict is what decided the label
                assert (s.branches[t][1] == s.correct) == (kind == HARMLESS)
        assert kinds == {HARMLESS, IMPORTANT}  # the test exercises both outcomes
        assert search.branch_tokens > 0
        # looked-up drafts: several branch tokens per verifier pass (plain decoding: one per pass, plus prefill)
        assert (search.branch_verifier_passes < search.branch_tokens) == (lookup > 0)


@pytest.fixture
def recorded(tmp_path, pair, monkeypatch):
    monkeypatch.setitem(metrics.METRICS, "length3", length_metric)
    cfg = tiny_gen_config(tmp_path, qa_data(tmp_path, 10))
    manifest = run_gen(cfg, Recorder(cfg, *pair))
    return cfg, manifest


def test_recorder_writes_consequence_rows_and_resumes_exactly(recorded, pair):
    cfg, manifest = recorded
    drafter, verifier, tok = pair
    ds = load_records(cfg.output)
    cons = ds.filter(lambda r: r["mode"] == "consequence")
    gold = ds.filter(lambda r: r["mode"] == "gold")
    assert set(gold["consequence"]) == {UNTESTED} and set(gold["branch_correct"]) == {-1}
    labels = np.asarray(cons["consequence"])
    assert set(labels) <= {AGREE, HARMLESS, IMPORTANT, UNTESTED} and IMPORTANT in labels
    # each example's labels are the plain search's, and AGREE exactly where the drafter's argmax is the token
    for ex_id in sorted(set(cons["example_id"])):
        rows = cons.filter(lambda r: r["example_id"] == ex_id)
        prompt = Recorder(cfg, *pair).prompt_ids(next(e for e in _examples(cfg) if e.example_id == ex_id))
        answer, verdict, found = plain_search(drafter, verifier, tok, prompt)
        assert rows["token"] == answer and set(rows["answer_correct"]) == {verdict}
        for t, (label, q_arg, token) in enumerate(zip(rows["consequence"], rows["q_argmax"], rows["token"])):
            assert label == found.get(t, AGREE if q_arg == token else UNTESTED)
            assert (rows["branch_answer"][t] != "") == (t in found)
    counts = manifest.consequence
    assert counts["important"] == int((labels == IMPORTANT).sum()) and counts["examples"] == len(
        set(cons["example_id"])
    )
    # resume: a lost shard is recorded again, identical to the first time
    before = load_records(cfg.output).to_pandas()
    shard = sorted(p for p in (Path(cfg.output)).glob("train-*.arrow"))[0]
    shard.unlink()
    (Path(cfg.output) / "manifest.json").unlink()
    run_gen(cfg, Recorder(cfg, *pair))
    after = load_records(cfg.output).to_pandas()
    assert before.equals(after)
    assert read_manifest(cfg.output).consequence == counts


def _examples(cfg):
    from data_gen.tasks import load_task

    return list(
        load_task(
            "custom",
            path=cfg.data_path,
            prompt_field=cfg.prompt_field,
            reference_field=cfg.reference_field,
            id_field=cfg.id_field,
        )
    )


@pytest.mark.parametrize("head", ["cascade", "judge"])
def test_routers_train_on_consequence_labels_and_decode(recorded, pair, tmp_path, head):
    cfg, _ = recorded
    out = tmp_path / f"router-{head}"
    train = TrainConfig(
        records=[cfg.output],
        mode="consequence",
        target="consequence",
        max_epochs=2,
        batch_size=64,
        output=str(out),
        router=RouterArch(head=head),
    )
    run_train(train)
    router = load_router(out)
    drafter, verifier, _ = pair
    ids = torch.tensor([[5, 17, 33, 41, 8]])
    got = generate(drafter, verifier, ids, rule=router, alpha=0.5, gamma=3, max_new_tokens=10)
    assert got.stats["new_tokens"] == 10
    with pytest.raises(Exception, match="consequence"):
        run_train(TrainConfig(records=[cfg.output], mode="gold", target="consequence", output=str(tmp_path / "x")))
    with pytest.raises(Exception, match="consequence"):
        run_train(
            TrainConfig(
                records=[cfg.output],
                mode="consequence",
                target="consequence",
                output=str(tmp_path / "y"),
                router=RouterArch(head="token"),
            )
        )


def test_eval_reports_the_important_mismatches_each_method_catches(recorded, tmp_path):
    from specroute import cli

    cfg, _ = recorded
    # the fixture's split puts nothing in test: evaluate on its validation rows as "test" by re-splitting
    test_cfg = tiny_gen_config(
        tmp_path, cfg.data_path, output=str(tmp_path / "rec-test"), split_fractions=[0.5, 0.2, 0.3]
    )
    run_gen(test_cfg, Recorder(test_cfg, *tiny_pair(seed=2, noise=0.05)))
    router = tmp_path / "cons-mlp"
    run_train(
        TrainConfig(
            records=[test_cfg.output],
            mode="consequence",
            target="consequence",
            max_epochs=2,
            batch_size=64,
            output=str(router),
        )
    )
    out = tmp_path / "eval"
    assert (
        cli.main(
            [
                "eval",
                "--config",
                "configs/eval/tiny.yaml",
                f"records=[{test_cfg.output}]",
                "online=false",
                f"routers=[{router}]",
                f"output={out}",
                "cost_ratio=0.3",  # the records' models are not what tiny:* loads: nothing to measure on
            ]
        )
        == 0
    )
    catch = json.loads((out / "metrics.json").read_text())["offline"]["consequence"]
    assert catch["important"] > 0 and {"oracle", "opt", "token_v2", "cons-mlp"} <= set(catch["methods"])
    oracle = catch["methods"]["oracle"]
    assert max(oracle["caught"]) == 1.0 and all(0 <= c <= 1 for m in catch["methods"].values() for c in m["caught"])
    assert "Important mismatches caught" in (out / "report.md").read_text()


def test_consequence_labels_join_an_existing_evaluation(recorded, pair, tmp_path, monkeypatch):
    """Labels recorded later for the same examples (a consequence-only folder) join an evaluation of
    the gold records: records=[gold, consequence] keeps the gold folder's prompts and curves, adds
    the catch table, and a router trained on the labels adds only its own online points."""
    import router.backends.torch_models as tiny_module  # where load_pair builds the tiny pair
    from specroute import cli

    monkeypatch.setattr(tiny_module, "tiny_pair", lambda *a, **k: pair)  # eval decodes the pair the records hold
    cfg, _ = recorded
    split = [0.5, 0.2, 0.3]
    gold = tiny_gen_config(
        tmp_path, cfg.data_path, output=str(tmp_path / "gold"), modes=["gold"], split_fractions=split
    )
    labels = tiny_gen_config(
        tmp_path, cfg.data_path, output=str(tmp_path / "labels"), modes=["consequence"], split_fractions=split
    )
    for c in (gold, labels):
        run_gen(c, Recorder(c, *pair))
    router = tmp_path / "cons-judge"
    run_train(
        TrainConfig(
            records=[labels.output],
            mode="consequence",
            target="consequence",
            max_epochs=2,
            batch_size=64,
            output=str(router),
            router=RouterArch(head="judge", hidden_inputs=["after"]),
        )
    )
    base = [
        "eval",
        "--config",
        "configs/eval/tiny.yaml",
        f"output={tmp_path / 'eval'}",
        "max_prompts=2",
        "max_new_tokens=6",
        "metric=length3",
    ]
    assert cli.main([*base, f"records=[{gold.output}]", "routers=[]", "online_methods=[opt]"]) == 0
    online = tmp_path / "eval" / "online"
    stamps = {f.name: f.stat().st_mtime for f in online.glob("*.json")}
    before = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert (
        cli.main(
            [
                *base,
                f"records=[{gold.output},{labels.output}]",
                f"routers=[{router}]",
                "online_methods=[opt,cons-judge]",
            ]
        )
        == 0
    )
    after = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert (
        after["offline"]["consequence"]["important"] > 0 and "cons-judge" in after["offline"]["consequence"]["methods"]
    )
    kept = {name: stamp for name, stamp in stamps.items() if name != "verifier@0.json"}  # its first batch retimed
    assert {f.name: f.stat().st_mtime for f in online.iterdir() if f.name in kept} == kept  # kept
    assert any(f.name.startswith("cons-judge@") for f in online.iterdir())
    points = [json.loads(f.read_text()) for f in online.glob("*.json")]  # the points (not their batch journals)
    prompts = [[e["example_id"] for e in p["examples"]] for p in points]
    assert len(points) > len(stamps) and all(p == prompts[0] for p in prompts)  # the gold folder's prompts, every point
    assert after["offline"]["summary"]["methods"]["opt"] == before["offline"]["summary"]["methods"]["opt"]


def test_the_search_reports_its_rounds(pair):
    drafter, verifier, tok = pair
    prompts = [[7, 9, 11, 13, 20 + i] for i in range(3)]
    search = ConsequenceSearch(drafter, verifier, tok, length_metric, [], 259, 0, BUDGET, MISMATCHES, batch_size=4)
    said = []
    search.report = said.append
    found = search.run(prompts, [{}] * 3)
    assert said[0] == "answering 3" and said[1].startswith("round 1: ")
    assert len(said) - 1 == max(s.tested for s in found) <= MISMATCHES  # one line per round that decoded branches


def test_horizon_study_scores_every_tested_mismatch(recorded, pair, tmp_path):
    """studies/horizon_labels.py: a SelfJudge score per tested mismatch, against the full-answer label."""
    cfg, manifest = recorded
    study = study_module("horizon_labels")
    assert study.main([cfg.output, "--out", str(tmp_path / "hz")], recorder=Recorder(cfg, *pair)) == 0
    result = json.loads((tmp_path / "hz" / "horizon.json").read_text())
    counts = manifest.consequence
    assert (
        result["mismatches"] == counts["harmless"] + counts["important"] and result["important"] == counts["important"]
    )
    assert set(result["horizons"]) == {"0", "5", "10", "20"}
    rows = (tmp_path / "hz" / "horizon.csv").read_text().splitlines()
    assert len(rows) == result["mismatches"] + 1 and rows[0].startswith("example_id,position,important,score_0")


def test_short_horizon_scores_are_recorded_at_every_mismatch(tmp_path, pair, monkeypatch):
    """consequence_horizon=H: every mismatch of a searched answer gets SelfJudge's score (tested by the
    full search or not), NaN elsewhere; an important or untested one equals a direct computation on the
    recorded answer; the costs are counted; a judge trains on the scores and decodes."""
    from data_gen.horizon import horizon_scores
    from data_gen.plan import load_examples

    monkeypatch.setitem(metrics.METRICS, "length3", length_metric)
    cfg = tiny_gen_config(tmp_path, qa_data(tmp_path, 6), consequence_horizon=5)
    recorder = Recorder(cfg, *pair)
    manifest = run_gen(cfg, recorder)
    cons = load_records(cfg.output, mode="consequence")
    label, score = np.asarray(cons["consequence"]), np.asarray(cons["horizon_score"])
    mismatch = np.isin(label, [HARMLESS, IMPORTANT, UNTESTED])
    assert np.isfinite(score[mismatch]).all() and np.isnan(score[~mismatch]).all() and mismatch.any()
    assert np.isnan(np.asarray(load_records(cfg.output, mode="gold")["horizon_score"])).all()
    counts = manifest.counts
    assert counts["horizon_mismatches"] == int(mismatch.sum()) and counts["horizon_seconds"] > 0
    assert counts["consequence_seconds"] > 0  # the full search is timed too
    examples = {ex.example_id: ex for ex in load_examples(cfg)}
    ids, pos, tok, q_arg = (np.asarray(cons[c]) for c in ("example_id", "position", "token", "q_argmax"))
    # untested mismatches follow the search's last substitution: the recorded answer is the verifier's own there
    row = int(np.nonzero(label == UNTESTED)[0][0])
    rows = np.nonzero(ids == ids[row])[0]
    answer = tok[rows[np.argsort(pos[rows])]].tolist()
    prompt = recorder.prepare(examples[ids[row]], "consequence")[0]
    direct = horizon_scores(pair[1], prompt, answer, [(int(pos[row]), int(q_arg[row]))], (5,))
    assert abs(direct[0, 0] - score[row]) < 1e-4
    out = tmp_path / "judge-horizon"
    run_train(
        TrainConfig(
            records=[cfg.output],
            mode="consequence",
            target="horizon_score",
            loss="mse",
            max_epochs=2,
            batch_size=64,
            output=str(out),
            router=RouterArch(head="judge"),
        )
    )
    got = generate(
        pair[0],
        pair[1],
        torch.tensor([[5, 17, 33, 41, 8]]),
        rule=load_router(out),
        alpha=0.5,
        gamma=3,
        max_new_tokens=8,
    )
    assert got.stats["new_tokens"] == 8


def test_horizon_only_labelling_scores_every_mismatch_without_branches(tmp_path, pair, monkeypatch):
    """consequence_max_mismatches=0 with consequence_horizon=H: no branch is decoded, every mismatch is
    UNTESTED with its short-horizon score, and the first mismatch of each answer scores as in a folder
    that also runs the full search (the answer is the same up to there). 0 and 0 is refused."""
    monkeypatch.setitem(metrics.METRICS, "length3", length_metric)
    data = qa_data(tmp_path, 6)
    full = tiny_gen_config(tmp_path, data, consequence_horizon=5, output=str(tmp_path / "full"))
    run_gen(full, Recorder(full, *pair))
    cheap = tiny_gen_config(
        tmp_path,
        data,
        consequence_horizon=5,
        consequence_max_mismatches=0,
        modes=["consequence"],
        output=str(tmp_path / "cheap"),
    )
    manifest = run_gen(cheap, Recorder(cheap, *pair))
    assert manifest.counts["consequence_branch_tokens"] == 0
    assert manifest.counts["consequence_important"] == manifest.counts["consequence_harmless"] == 0
    got, want = load_records(cheap.output), load_records(full.output, mode="consequence")
    label, score = np.asarray(got["consequence"]), np.asarray(got["horizon_score"])
    assert set(np.unique(label)) <= {AGREE, UNTESTED} and (label == UNTESTED).any()
    assert np.isfinite(score[label == UNTESTED]).all() and np.isnan(score[label == AGREE]).all()

    def first_mismatch(rec, mismatch_labels):
        ids, pos, lab, sc = (np.asarray(rec[c]) for c in ("example_id", "position", "consequence", "horizon_score"))
        out = {}
        for i in np.argsort(pos, kind="stable"):
            if lab[i] in mismatch_labels and ids[i] not in out:
                out[ids[i]] = (int(pos[i]), float(sc[i]))
        return out

    cheap_first = first_mismatch(got, (UNTESTED,))
    full_first = first_mismatch(want, (HARMLESS, IMPORTANT, UNTESTED))
    assert cheap_first.keys() == full_first.keys() and cheap_first
    for ex, (t, s) in cheap_first.items():
        assert full_first[ex][0] == t and abs(full_first[ex][1] - s) < 1e-4
    with pytest.raises(ValueError, match="label nothing"):
        tiny_gen_config(tmp_path, data, consequence_max_mismatches=0)


def test_label_agreement_study_compares_mismatches_tested_on_the_same_answer(recorded, pair, tmp_path):
    """studies/label_agreement.py: a folder against itself agrees everywhere; a re-join variant on the
    same examples is compared only where both tested a mismatch on the same answer."""
    cfg, manifest = recorded
    study = study_module("label_agreement")
    assert study.main([cfg.output, cfg.output, "--out", str(tmp_path / "self")]) == 0
    same = json.loads((tmp_path / "self" / "agreement.json").read_text())
    tested = manifest.consequence["important"] + manifest.consequence["harmless"]
    assert same["compared"] == same["of_reference"] == tested and same["agreement"] == 1.0
    assert same["confusion"]["both_important"] == manifest.consequence["important"]
    cheap = tiny_gen_config(tmp_path, Path(cfg.data_path), consequence_rejoin=2, output=str(tmp_path / "rejoin"))
    run_gen(cheap, Recorder(cheap, *pair))
    assert study.main([cfg.output, cheap.output, "--out", str(tmp_path / "rj")]) == 0
    got = json.loads((tmp_path / "rj" / "agreement.json").read_text())
    assert 0 < got["compared"] <= tested and sum(got["confusion"].values()) == got["compared"]
    assert got["costs"]["candidate"]["rejoined_branches"] == read_manifest(cheap.output).counts.get(
        "consequence_rejoined_branches", 0
    )
    # a short-horizon-only folder is compared by its scores: ROC-AUC against the reference's verdicts
    scores = tiny_gen_config(
        tmp_path,
        Path(cfg.data_path),
        consequence_max_mismatches=0,
        consequence_horizon=3,
        modes=["consequence"],
        output=str(tmp_path / "horizon"),
    )
    run_gen(scores, Recorder(scores, *pair))
    assert study.main([cfg.output, scores.output, "--out", str(tmp_path / "hz")]) == 0
    by_score = json.loads((tmp_path / "hz" / "agreement.json").read_text())
    assert 0 < by_score["compared"] <= tested and by_score["costs"]["candidate"]["horizon_seconds_per_mismatch"] > 0
    assert np.isnan(by_score["auc"]) or 0 <= by_score["auc"] <= 1
    lines = (tmp_path / "hz" / "agreement.csv").read_text().splitlines()
    assert len(lines) == by_score["compared"] + 1 and lines[0].endswith("score")
