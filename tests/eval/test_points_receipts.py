"""A point file at odds with its receipts is refused (eval/points.py)."""

from __future__ import annotations

import json

import pytest


def test_a_point_file_at_odds_with_its_receipts_is_refused(tmp_path):
    from eval.points import read_points
    from tests.helpers import online_point

    path = tmp_path / "opt@0.5.json"
    online_point("opt", 0.5).write(path)
    assert read_points([path])[0].tokens == 3
    for field, value, named in [
        ("tokens", 1036, "tokens 1036, but its prompts' tokens sum to 3"),
        ("seconds", 9.0, "seconds 9, but its batches sum to 1"),
        ("scores", {"quality": 0.25}, "scores['quality'] 0.25"),
        ("prompts", 2, "prompts 2"),
    ]:
        data = json.loads(path.read_text())
        path.with_name("edited.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(ValueError, match="disagrees with its own") as err:
            read_points([path.with_name("edited.json")])
        assert named in str(err.value) and "delete it and rerun" in str(err.value)
