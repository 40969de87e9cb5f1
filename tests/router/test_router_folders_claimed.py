"""No API writes a router into another stage's folder (router/model.py save_router)."""

from __future__ import annotations

import pytest


def test_no_api_writes_a_router_into_another_stages_folder(tiny_recording, tmp_path):
    from router.infra.files import OutputBusy
    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router

    router = LearnedRouter(RouterNet(RouterConfig()))
    before = sorted(p.name for p in tiny_recording.iterdir())
    for save in (lambda: router.save_pretrained(tiny_recording), lambda: save_router(router, tiny_recording)):
        with pytest.raises(OutputBusy, match="holds the output of `specroute gen`"):
            save()
    assert sorted(p.name for p in tiny_recording.iterdir()) == before
    router.save_pretrained(tmp_path / "mine")  # its own folder: fine
