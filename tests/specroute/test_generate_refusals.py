"""`specroute generate` refuses bad input in one line before loading models."""

from __future__ import annotations

import pytest

from specroute import cli


def _generate(*extra: str) -> list[str]:
    return ["generate", "--drafter", "tiny:drafter", "--verifier", "tiny:verifier", *extra]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prompt", ""], "error: --prompt is empty"),
        (["--prompt", "x", "--output", "/proc/specroute-test/out.json"], "error: cannot write --output /proc/"),
    ],
)
def test_generate_refuses_bad_input_in_one_line_before_loading_models(monkeypatch, capsys, argv, message):
    import router.pair

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded before the input was checked")

    monkeypatch.setattr(router.pair, "load_pair", no_models)
    with pytest.raises(SystemExit) as exit_:
        cli.main(_generate(*argv))
    assert str(exit_.value).startswith(message) and "\n" not in str(exit_.value)
    assert "resume" not in str(exit_.value)  # generate has none to promise
