"""Golden vectors written for other weights are named with the fix (router/export/golden.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute import cli

GEN = ["gen", "--config", "configs/gen/tiny.yaml"]


def _gen(out: Path, *extra: str) -> int:
    return cli.main([*GEN, f"output={out}", *extra])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "tiny"
    assert _gen(out, "max_examples=24") == 0
    return out


def _changed_weights(folder: Path) -> None:
    """New weights with an updated sha in config.json (a retrained router copied over the old one)."""
    from safetensors.torch import load_file, save_file

    from router.infra.files import file_sha256

    weights = folder / "model.safetensors"
    tensors = {k: v + 0.5 if v.is_floating_point() else v for k, v in load_file(str(weights)).items()}
    save_file(tensors, str(weights))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "weights_sha256": file_sha256(weights)}))


@pytest.mark.parametrize("old_golden_file", [False, True])
def test_stale_golden_vectors_are_named_with_the_fix(tmp_path, capsys, old_golden_file):
    pytest.importorskip("onnxruntime")
    from safetensors.torch import load_file, save_file

    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router

    folder = save_router(LearnedRouter(RouterNet(RouterConfig())), tmp_path / "mlp")
    if old_golden_file:  # written before golden vectors recorded their weights: caught by the torch check
        golden = folder / "golden.safetensors"
        save_file(load_file(str(golden)), str(golden))
    _changed_weights(folder)
    assert cli.main(["export-onnx", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"error: {folder / 'golden.safetensors'} is stale" in err and "--refresh-golden" in err
    assert cli.main(["export-onnx", str(folder), "--refresh-golden"]) == 0
    assert "decisions equal: True" in capsys.readouterr().out
