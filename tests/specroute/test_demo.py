"""`specroute demo --preset tiny`: the whole pipeline end to end (the CI smoke test), and resume."""

import pytest
import json
from pathlib import Path
import math

from specroute import cli


@pytest.mark.e2e
def test_tiny_demo_end_to_end_and_rerun_reuses_stages(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path / "cache"))  # where the third-party log goes
    out = tmp_path / "demo"
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    _only_the_users_progress(captured.out + captured.err, tmp_path / "cache" / "logs")
    assert "results: online, held-out prompts" in printed and "report.md" in printed
    assert "diff to verifier" in printed and "rej off" in printed  # the paired columns, at the demo's size
    summary = json.loads((out / "demo_summary.json").read_text())
    assert set(summary["online"]) == {"gsm8k", "mbpp"}
    for task in ("gsm8k", "mbpp"):
        methods = [p["method"] for p in summary["online"][task]["points"]]
        assert methods[:2] == ["verifier", "drafter"] and set(summary["online_methods"]) <= set(methods)
        assert all(p["alpha"] == p["alpha"] for p in summary["online"][task]["points"])  # no NaN alphas
        for plot in ("offline_quality_vs_rejection", "online_quality_vs_latency"):
            assert (out / "eval" / task / f"{plot}.png").stat().st_size > 0
        paired = summary["online"][task]["paired"]
        assert [r["method"] for r in paired] == methods
        assert all(len(r["quality_diff_ci"]) == 2 and "same_answer" in r and "offline" in r for r in paired)
        assert "Paired with the verifier" in (out / "eval" / task / "report.md").read_text()
        gamma = json.loads((out / "eval" / task / "gamma.json").read_text())  # the preset's gamma=auto
        assert {
            p["fingerprint"]["gamma"]
            for p in (json.loads(f.read_text()) for f in (out / "eval" / task / "online").glob("*.json"))
        } == {gamma["gamma"]}
        shift = summary["gold_vs_rollout"][task]
        assert shift["gold"]["positions"] > 0 and shift["rollout"]["positions"] > 0
        assert 0 < shift["gold"]["top1_agreement"] <= 1 and shift["gold"]["mean_tv"] > 0
    assert set(summary["validation_areas"]) == {"mlp", "gru", "token", "judge"}
    for task, views in summary["gap_closed"].items():
        assert set(views) == {"greedy", "t1"} and set(views["greedy"]["routers"]) == {"mlp", "gru", "token", "judge"}
        gc, lo, hi = views["greedy"]["routers"]["judge"]
        if math.isnan(gc):  # the tiny random pair may leave no gap to close (it never writes gold): all NaN then
            assert math.isnan(lo) and math.isnan(hi)
        else:
            assert math.isfinite(lo) and lo <= hi
    router_stamp = (out / "routers" / "mlp" / "model.safetensors").stat().st_mtime
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out)]) == 0
    rerun = capsys.readouterr().out
    assert "nothing to do" in rerun and "reusing it" in rerun
    assert (out / "routers" / "mlp" / "model.safetensors").stat().st_mtime == router_stamp
    # a record folder made with another config (an older prompt format, say) is recorded again, and the
    # routers trained on the old records are trained again
    config = out / "records" / "gsm8k" / "gen_config.json"
    made = json.loads(config.read_text())
    config.write_text(json.dumps({**made, "top_k": made["top_k"] + 1}))
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out)]) == 0
    rerun = capsys.readouterr().out
    assert "recorded with another config (differs in ['top_k'])" in rerun
    assert json.loads(config.read_text())["top_k"] == made["top_k"]
    assert (out / "routers" / "mlp" / "model.safetensors").stat().st_mtime != router_stamp


def test_online_estimate_prices_each_batch_at_its_longest_expected_output():
    from router.machine.costs import PairCosts
    from specroute.estimate import online_seconds

    costs = PairCosts(
        batch=2,
        gamma=5,
        drafter_prefill=0.01,
        verifier_prefill=0.03,
        drafter_step=0.1,
        verifier_step=0.3,
        verifier_block=0.5,
        probe_seconds=1.0,
    )
    prompts = [100, 80, 90, 70]
    bound = online_seconds(prompts, 2, 256, costs, 4)
    expected = online_seconds(prompts, 2, 256, costs, 4, output_lengths=[50, 120, 60, 60])
    assert expected < bound
    # a batch costs as much as its longest row: shortening a row that is not the longest changes only the
    # log-probability pass
    shorter = online_seconds(prompts, 2, 256, costs, 4, output_lengths=[10, 120, 60, 60])
    assert shorter < expected and expected - shorter < 40 * 6 * 0.03
    assert online_seconds(prompts, 2, 100, costs, 4, output_lengths=[500] * 4) == online_seconds(
        prompts, 2, 100, costs, 4, output_lengths=[100] * 4
    )  # capped at new_tokens


def test_demo_decoding_options_become_eval_overrides():
    """--gamma replaces the preset's gamma; --draft-stop and --bonus-from are added; options left out
    keep the preset's (and the eval's defaults)."""
    from specroute.demo import PRESETS, with_decoding

    long = PRESETS["long"]
    assert with_decoding(long).eval_extra == long.eval_extra == {"gamma": 5, "bonus_from": "target"}
    assert with_decoding(long, gamma="auto", draft_stop=0.4, bonus_from="verifier").eval_extra == {
        "gamma": "auto",
        "draft_stop": 0.4,
        "bonus_from": "verifier",
    }
    assert with_decoding(long, draft_stop=0.3).eval_extra == {"gamma": 5, "bonus_from": "target", "draft_stop": 0.3}
    assert with_decoding(PRESETS["cpu"], bonus_from="target").eval_extra == {"gamma": "auto", "bonus_from": "target"}


def _only_the_users_progress(text: str, logs) -> None:
    """The main job prints specroute's progress and notes only: no raw UserWarning with its source line, no
    Lightning banner; specroute's notes are one line each, and the third-party log it names holds the rest."""
    for noise in ("UserWarning", "warnings.warn(", "GPU available", "TPU available", "Tip:", "Trainer.fit"):
        assert noise not in text, noise
    notes = [line for line in text.splitlines() if "[specroute] note:" in line]
    assert notes and all(line.startswith("[specroute] note: ") for line in notes)  # e.g. prompts truncated
    named = [line for line in text.splitlines() if line.startswith("[specroute] third-party messages")]
    assert len(named) == 1 and str(logs) in named[0]
    log = Path(named[0].rsplit(" are in ", 1)[1])
    assert log.parent == logs and "GPU available" in log.read_text()  # Lightning's banner, kept
