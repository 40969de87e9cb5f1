"""Damaged router folders are named, not tracebacks (router/model.py load_router)."""

import pytest


def test_damaged_router_folders_are_named_not_tracebacks(tmp_path):
    import json as _json

    from router.model import RouterConfig, RouterError, RouterNet, load_router, save_router

    folder = save_router(RouterNet(RouterConfig()), tmp_path / "r")
    (folder / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(RouterError, match="damaged or was changed after export"):
        load_router(folder)
    # one flipped exponent bit in a bias loads as a valid file: the checksum in config.json catches it
    import torch
    from safetensors.torch import load_file, save_file

    folder = save_router(RouterNet(RouterConfig()), tmp_path / "bit")
    weights = load_file(str(folder / "model.safetensors"))
    name = next(k for k in weights if k.endswith("bias"))
    bits = weights[name].view(torch.int32)
    bits[0] ^= 1 << 29
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(RouterError, match="its checksum differs"):
        load_router(folder)
    folder = save_router(RouterNet(RouterConfig()), tmp_path / "r2")
    cfg = _json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(_json.dumps({**cfg, "width": 8}))  # the weights unchanged, the shape not
    with pytest.raises(RouterError, match="does not hold the weights"):
        load_router(folder)
    (folder / "config.json").write_text("{ broken")
    with pytest.raises(RouterError, match="config.json is not valid JSON"):
        load_router(folder)
