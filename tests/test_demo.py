"""`specroute demo --preset tiny`: the whole pipeline end to end (the CI smoke test), and resume."""

import json

from specroute import cli


def test_tiny_demo_end_to_end_and_rerun_reuses_stages(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "results: online, held-out prompts" in printed and "report.md" in printed
    summary = json.loads((out / "demo_summary.json").read_text())
    assert set(summary["online"]) == {"gsm8k", "mbpp"}
    for task in ("gsm8k", "mbpp"):
        methods = [p["method"] for p in summary["online"][task]["points"]]
        assert methods[:2] == ["verifier", "drafter"] and set(summary["online_methods"]) <= set(methods)
        assert all(p["alpha"] == p["alpha"] for p in summary["online"][task]["points"])  # no NaN alphas
        for plot in ("offline_quality_vs_rejection", "online_quality_vs_latency"):
            assert (out / "eval" / task / f"{plot}.png").stat().st_size > 0
        shift = summary["gold_vs_rollout"][task]
        assert shift["gold"]["positions"] > 0 and shift["rollout"]["positions"] > 0
        assert 0 < shift["gold"]["top1_agreement"] <= 1 and shift["gold"]["mean_tv"] > 0
    assert set(summary["validation_areas"]) == {"mlp", "gru", "token", "judge"}
    for task, views in summary["gap_closed"].items():
        assert set(views) == {"greedy", "t1"} and set(views["greedy"]["routers"]) == {"mlp", "gru", "token", "judge"}
        gc, lo, hi = views["greedy"]["routers"]["judge"]
        assert lo <= hi or gc != gc  # NaN where the tiny random pair leaves no gap to close (never gold)
    router_stamp = (out / "routers" / "mlp" / "model.safetensors").stat().st_mtime
    assert cli.main(["demo", "--preset", "tiny", "--output", str(out)]) == 0
    rerun = capsys.readouterr().out
    assert "nothing to do" in rerun and "reusing it" in rerun
    assert (out / "routers" / "mlp" / "model.safetensors").stat().st_mtime == router_stamp
