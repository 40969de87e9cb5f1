"""Loading models: a CUDA device asked for on a machine without one is a message (router/loading.py)."""

import pytest

from specroute import cli


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_message(tmp_path, capsys):
    from router.pair import load_pair

    with pytest.raises(ValueError, match="no CUDA device"):
        load_pair("tiny:drafter", "tiny:verifier", device="cuda")
    assert (
        cli.main(
            ["gen", "--config", "configs/gen/tiny.yaml", "device=cuda", "max_examples=2", f"output={tmp_path / 'r'}"]
        )
        == 2
    )
    assert "no CUDA device" in capsys.readouterr().err
