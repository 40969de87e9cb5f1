"""`specroute generate` refuses a folder as its output before loading models."""

import pytest

from specroute import cli


def test_generate_refuses_a_folder_as_output_before_loading_models(tmp_path):
    with pytest.raises(SystemExit, match="is a folder"):
        cli.main(
            ["generate", "--prompt", "hi", "--drafter", "no/such", "--verifier", "no/such", "--output", str(tmp_path)]
        )
    with pytest.raises(SystemExit, match="temperature must be >= 0"):
        cli.main(["generate", "--prompt", "hi", "--temperature", "nan", "--output", str(tmp_path / "r.json")])
