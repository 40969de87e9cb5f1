"""No API writes a router into another stage's folder (router/model.py save_router)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def recorded(tiny_recording) -> Path:
    return tiny_recording  # shared by the session (tests/conftest.py): read, never changed


def test_no_api_writes_a_router_into_another_stages_folder(recorded, tmp_path):
    from router.infra.files import OutputBusy
    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router

    router = LearnedRouter(RouterNet(RouterConfig()))
    before = sorted(p.name for p in recorded.iterdir())
    for save in (lambda: router.save_pretrained(recorded), lambda: save_router(router, recorded)):
        with pytest.raises(OutputBusy, match="holds the output of `specroute gen`"):
            save()
    assert sorted(p.name for p in recorded.iterdir()) == before
    router.save_pretrained(tmp_path / "mine")  # its own folder: fine
