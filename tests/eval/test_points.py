"""Online points are redone when what they depend on changes, reused whole from another machine, and their files refuse another format (eval/points.py)."""

import json

import pytest
from helpers import online_point

from eval.points import complete_elsewhere, point_fingerprint, same_fingerprint


def _point(fingerprint: dict):
    return online_point("opt", 0.5, fingerprint=fingerprint)


def test_online_points_are_redone_when_device_or_models_change():
    now = {"models": {"d": 1}, "dtype": "float32", "drafter": None, "verifier": None, "device": "cpu", "gamma": 5}
    assert same_fingerprint(dict(now), now)
    assert not same_fingerprint(now, {**now, "device": "cuda"})
    assert not same_fingerprint(now, {**now, "drafter": "./other-drafter"})
    assert not same_fingerprint({**now, "dtype": "bfloat16"}, now)
    assert not same_fingerprint({k: v for k, v in now.items() if k != "device"}, now)  # a key missing: redone
    assert not same_fingerprint(None, now)


def test_point_files_round_trip_and_another_format_is_refused_with_the_fix(tmp_path):
    from dataclasses import replace

    from eval.points import read_points

    good, old, odd = tmp_path / "opt@0.5.json", tmp_path / "opt@0.7.json", tmp_path / "opt@0.9.json"
    _point({"gamma": 4}).write(good)
    back, missing = read_points([good, tmp_path / "missing.json"])
    assert back == replace(_point({"gamma": 4}), relative_latency=back.relative_latency) and missing is None
    data = json.loads(good.read_text())
    old.write_text(json.dumps({k: v for k, v in data.items() if k != "format"}))  # before points had a format
    odd.write_text(json.dumps({**data, "quality": 1.0}))  # a field this specroute does not know
    for path in (old, odd):
        with pytest.raises(ValueError, match=r"another format .* output=<new folder>"):
            read_points([good, path])


def test_a_complete_set_of_points_from_another_machine_is_reused_whole():
    """Latencies of two machines never meet in one table: a partial set from another machine is
    redone, a complete one (every point, one machine, everything else unchanged) is kept whole."""
    now = {"models": {"d": 1}, "gamma": 5, "machine": "AMD EPYC x2", "dtype": "float32"}
    there = {**now, "machine": "Intel Xeon (AMX) x2", "dtype": "bfloat16"}
    points = [_point(there), _point(there)]
    both = [now, now]
    assert complete_elsewhere(points, both) == {"machine": "Intel Xeon (AMX) x2", "dtype": "bfloat16"}
    assert complete_elsewhere([points[0], None], both) is None  # one point missing: redo the other machine's
    assert complete_elsewhere([points[0], _point({**there, "machine": "third"})], both) is None
    assert complete_elsewhere([points[0], _point({**there, "gamma": 4})], both) is None
    assert complete_elsewhere([_point(now)] * 2, both) is None  # same machine: the usual resume
    assert complete_elsewhere([], []) is None
    # the report says so when, and only when, the points were timed elsewhere than this run's fingerprint
    from eval.online_report import _notes
    from eval.points import timed_on

    for timed, here, said in ((there, now, True), (now, now, False)):
        online = {"dtype": {"dtype": "gguf", "engine": "llamacpp"}, "timing_warnings": [], "timed_on": {}}
        online["timed_on"] = timed_on([_point(timed)], here)
        note = "Note: every online point was timed by an earlier run on Intel Xeon (AMX) x2 (llama.cpp)"
        assert online["timed_on"]["elsewhere"] is said and any(note in n for n in _notes(online)) is said


def test_a_point_depends_on_its_own_router_only():
    """Adding or retraining a router redoes that router's points only."""
    run = {"models": {"d": 1}, "gamma": 5, "routers": {"mlp": "aa", "judge": "bb"}}
    rule, mlp = point_fingerprint(run, "token_v2"), point_fingerprint(run, "mlp")
    assert rule["routers"] == {} and mlp["routers"] == {"mlp": "aa"}
    assert same_fingerprint(rule, point_fingerprint({**run, "routers": {"mlp": "zz", "new": "cc"}}, "token_v2"))
    assert not same_fingerprint(mlp, point_fingerprint({**run, "routers": {"mlp": "zz"}}, "mlp"))
    judge = point_fingerprint(run, "judge")
    assert same_fingerprint(judge, point_fingerprint({**run, "routers": {"mlp": "zz", "judge": "bb"}}, "judge"))
    assert not same_fingerprint(judge, point_fingerprint({**run, "routers": {"judge": "retrained"}}, "judge"))
