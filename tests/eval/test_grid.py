"""The online grid leaves offline-only routers out (eval/grid.py)."""

import pytest


def test_offline_only_routers_stay_out_of_the_online_grid(tmp_path, capsys):
    from eval.config import EvalConfig
    from eval.grid import online_methods
    from router.infra.config import ConfigError
    from router.model import LearnedRouter, RouterConfig, RouterNet

    routers = {n: LearnedRouter(RouterNet(RouterConfig(arch=n)), name=n) for n in ("mlp", "gru")}
    methods = online_methods(EvalConfig(), routers)
    assert "mlp" in methods and "gru" not in methods and "offline-only routers ['gru']" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="router 'gru' is a gru .* drop it from online_methods"):
        online_methods(EvalConfig(online_methods=["gru", "lossless"]), routers)
