"""An empty config is refused, not run as the default job (router/infra/config.py through the CLI)."""

from __future__ import annotations

import pytest

from specroute import cli


@pytest.mark.parametrize("content", ["", "# only a comment\n", "{}\n"])
def test_an_empty_config_is_refused_not_run_as_the_default_job(tmp_path, capsys, content):
    empty = tmp_path / "empty.yaml"
    empty.write_text(content)
    for stage in ("gen", "train", "eval"):
        assert cli.main([stage, "--config", str(empty)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {empty} holds no settings") and err.count("\n") == 1
