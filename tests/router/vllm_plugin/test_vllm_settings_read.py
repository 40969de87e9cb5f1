"""The plugin reads its settings once per environment (router/vllm/plugin.py `_current_settings`), without vLLM:
a router folder in SPECROUTE_POLICY is not loaded again for every request that names its own policy, and a
changed environment is read afresh."""

import pytest

from router.vllm import plugin, settings


@pytest.fixture
def loads(monkeypatch):
    """Counts load_policy calls and starts from an empty settings cache."""
    seen = []
    real = settings.load_policy

    def counting(spec, name=settings.ENV_POLICY):
        seen.append(spec)
        return real(spec, name)

    monkeypatch.setattr(settings, "load_policy", counting)
    monkeypatch.setitem(plugin._ACTIVE, "settings_by_env", {})
    for name in settings.SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    return seen


def test_settings_are_read_once_per_environment(loads, monkeypatch):
    monkeypatch.setenv("SPECROUTE_POLICY", "token_v2")
    monkeypatch.setenv("SPECROUTE_ALPHA", "0.3")
    first = plugin._current_settings()
    assert plugin._current_settings() is first and loads == ["token_v2"]
    monkeypatch.setenv("SPECROUTE_ALPHA", "0.5")
    changed = plugin._current_settings()
    assert changed.alpha == 0.5 and first.alpha == 0.3 and len(loads) == 2
    monkeypatch.delenv("SPECROUTE_POLICY")
    assert plugin._current_settings() is None


def test_a_bad_setting_is_one_line_each_time(loads, monkeypatch):
    monkeypatch.setenv("SPECROUTE_POLICY", "no_such_rule")
    for _ in range(2):  # a failed read is not cached as a success
        with pytest.raises(SystemExit, match="specroute vLLM plugin: error: .*no_such_rule"):
            plugin._current_settings()
