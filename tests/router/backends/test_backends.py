"""The engine registry and the backend protocol: every engine is declared once (router.backends.ENGINES) and
what differs between engines is asked of their backend; a new engine is one module and one registry line."""

from __future__ import annotations

import inspect

import pytest
import torch

from router import backends
from router.backends import ENGINES, Engine, backend_named, backend_of, engine_names, get_engine
from router.backends.protocol import Backend
from router.pair import check_engine, load_pair

PROTOCOL = [name for name in dir(Backend) if not name.startswith("_")] + list(Backend.__annotations__)


@pytest.mark.parametrize("name", engine_names(loop_only=True))
def test_every_loop_backend_has_the_whole_protocol(name):
    backend = backend_named(name)
    missing = [m for m in PROTOCOL if not hasattr(backend, m)]
    assert not missing and backend.name == name, missing
    for method in ("load_pair", "forward_tail", "machine", "note", "warm_prefix", "adopt_identity"):
        wanted = list(inspect.signature(getattr(Backend, method)).parameters)[1:]
        assert list(inspect.signature(getattr(backend, method)).parameters) == wanted, (name, method)


def test_a_served_engine_has_a_bridge_and_no_backend():
    served = [e for e in ENGINES.values() if not e.loop]
    assert served and all(e.bridge for e in served)
    with pytest.raises(ValueError, match="engine must be one of"):
        backend_named(served[0].name)


def test_a_transformers_model_is_torch_and_an_engines_model_names_its_own(tiny):
    assert backend_of(tiny[1]).name == "torch"

    class Other:
        engine = "llamacpp"

    assert backend_of(Other()).name == "llamacpp"
    with pytest.raises(ValueError, match="engine must be one of torch, llamacpp, vllm, got 'nope'"):
        get_engine("nope")


def test_a_new_engine_is_one_registry_line(monkeypatch, capsys):
    """A toy engine whose backend is torch's: the CLI's choices, pair loading, config checks and the demo's
    candidates take it with no other edit."""
    from specroute import cli, presets

    toy = Engine("toy", "a toy engine", None, "nothing to install", "router.backends.torch_models:TORCH")
    monkeypatch.setitem(backends.ENGINES, "toy", toy)
    assert "toy" in engine_names(loop_only=True) and "toy" in presets.engine_choices()
    check_engine("toy", 0, "cpu", None)
    drafter, verifier, _ = load_pair("tiny:drafter", "tiny:verifier", "float32", engine="toy")
    assert isinstance(verifier, torch.nn.Module)
    assert "toy" in presets.engine_candidates("cpu", "auto")[0]
    args = cli.build_parser().parse_args(["demo", "--engine", "toy"])
    assert args.engine == "toy"
    monkeypatch.delitem(backends.ENGINES, "toy")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["demo", "--engine", "toy"])
    assert "invalid choice: 'toy'" in capsys.readouterr().err
