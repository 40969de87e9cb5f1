"""Dataclass configs from YAML files plus `key=value` command-line overrides.

Unknown keys are errors (naming the known ones); values are parsed as YAML, so `batch_size=8`,
`modes=[gold,rollout]` and `max_examples=null` all work. Every stage saves the resolved config
next to its outputs with `config_to_dict`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that cannot be applied, with the fix."""


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like key=value (e.g. batch_size=8)")
        key, value = pair.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return out


def build_config(cls: type[T], values: dict[str, Any], source: str = "config") -> T:
    """Instantiate dataclass `cls` from a dict, refusing unknown keys."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {source}; known keys: {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid {source}: {err}") from None


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Config from an optional YAML file, then overrides on top."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of key: value")
        values.update(loaded)
    values.update(parse_overrides(overrides or []))
    return build_config(cls, values, str(path or "overrides"))


def config_to_dict(config) -> dict[str, Any]:
    return dataclasses.asdict(config)
