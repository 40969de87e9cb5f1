"""Dataclass configs from YAML files plus `key=value` command-line overrides.

Unknown keys are errors (naming the known ones); values are parsed as YAML, so `batch_size=8`,
`modes=[gold,rollout]` and `max_examples=null` all work. Every stage saves the resolved config
next to its outputs with `config_to_dict`.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that cannot be applied, with the fix."""


class _Loader(yaml.SafeLoader):
    """YAML as users type it: PyYAML follows YAML 1.1, where `1e-3` (no dot) is a string; here it is the float
    YAML 1.2 and every other reader make of it."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def read_yaml(text: str):
    """Parse YAML text (a file's or an override's value) with `1e-3` read as a float."""
    return yaml.load(text, Loader=_Loader)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like key=value (e.g. batch_size=8)")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = read_yaml(value) if value.strip() else None
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(
                f"override {pair!r} is not valid YAML ({problem}): close its brackets and quotes, "
                f"e.g. 'modes=[gold, rollout]' (quote the whole override for the shell)"
            ) from None
    return out


_TYPES = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
    "None": (type(None),),
}


def check_type(name: str, annotation: str, value: Any) -> None:
    """Refuse a value whose type the field's annotation (e.g. "int | None") does not allow."""
    allowed = [t.strip() for t in str(annotation).split("|")]
    if not all(a in _TYPES for a in allowed):
        return  # an annotation this check does not know: left to the config's own validation
    ok = any(isinstance(value, _TYPES[a]) for a in allowed)
    if isinstance(value, bool) and "bool" not in allowed:
        ok = False  # YAML reads `true` as a bool, which Python would also accept as the int 1
    if not ok:
        raise ConfigError(f"{name} must be {' or '.join(allowed)}, got {value!r} ({type(value).__name__})")


def check_listed_once(name: str, folders: list) -> None:
    """Refuse a folder listed twice (by where it is, however spelled): its rows would count twice in training,
    validation, early stopping and every offline count."""
    seen: dict[Path, str] = {}
    for folder in folders:
        where = Path(str(folder)).expanduser().resolve()
        if where in seen:
            raise ConfigError(
                f"{name} lists {seen[where]} twice ({folder!s} is the same folder): each recording counts once; "
                f"list it once"
            )
        seen[where] = str(folder)


def check_numbers(name: str, values, low: float | None = None, high: float | None = None, what: str = "") -> None:
    """Refuse a list of settings holding anything but numbers in [low, high], naming the setting."""
    items = values if isinstance(values, (list, tuple)) else [values]
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise ConfigError(f"{name} must hold numbers{what}; {v!r} is not one (got {values!r})")
        if (low is not None and v < low) or (high is not None and v > high):
            raise ConfigError(f"{name} must hold numbers{what}; got {values!r}")


def check_minimum(cfg, minimum: float, *names: str, allow_none: bool = False) -> None:
    """Refuse fields below `minimum` (NaN too); None passes only where it means "no limit"."""
    for name in names:
        value = getattr(cfg, name)
        if value is None and allow_none:
            continue
        if value is None or not value >= minimum:
            hint = " (or null for no limit)" if allow_none else ""
            raise ConfigError(f"{name} must be >= {minimum}{hint}, got {value!r}")


def build_config(cls: type[T], values: dict[str, Any], source: str = "config") -> T:
    """Instantiate dataclass `cls` from a dict, refusing unknown keys and values of the wrong type. A field
    that is itself a config dataclass (TrainConfig.router) takes its keys flat (`width`), dotted
    (`router.width`) or as a mapping (`router: {width: 64}`), later ones over earlier ones."""
    values = _nest(cls, values, source)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        known = sorted([*fields, *(f"{n}.{k}" for n, sub in _nested_fields(cls).items() for k in _names(sub))])
        raise ConfigError(f"unknown key(s) {unknown} in {source}; known keys: {', '.join(known)}")
    for key, value in values.items():
        try:
            check_type(key, fields[key].type, value)
        except ConfigError as err:
            raise ConfigError(f"invalid {source}: {err}") from None
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid {source}: {err}") from None


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _nested_fields(cls) -> dict[str, type]:
    """cls's fields whose type is a dataclass (resolved from the string annotations)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints.get(f.name))}


def _nest(cls, values: dict[str, Any], source: str) -> dict[str, Any]:
    """values with each nested config's keys (flat, dotted or a mapping) built into that config."""
    nested = _nested_fields(cls)
    if not nested:
        return values
    out, parts = {}, {name: {} for name in nested}
    own = set(_names(cls))
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if key in nested and isinstance(value, dict):
            parts[key].update(value)
        elif key in nested and isinstance(value, nested[key]):
            out[key] = value
        elif head in nested and rest:
            parts[head][rest] = value
        elif key not in own and (owner := next((n for n, sub in nested.items() if key in _names(sub)), None)):
            parts[owner][key] = value
        else:
            out[key] = value
    for name, given in parts.items():
        unknown = sorted(f"{name}.{key}" for key in set(given) - set(_names(nested[name])))
        if unknown:
            known = [*_names(cls), *(f"{name}.{key}" for key in _names(nested[name]))]
            raise ConfigError(f"unknown key(s) {unknown} in {source}; known keys: {', '.join(sorted(known))}")
        if given or name not in out:
            if name in out:
                given = {**dataclasses.asdict(out[name]), **given}
            out[name] = build_config(nested[name], given, f"{source} ({name})")
    return out


def _yaml_values(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"--config {path} is a folder: name a YAML file, e.g. {path / 'tiny.yaml'}")
    try:
        loaded = read_yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}): save it as UTF-8"
        ) from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ConfigError(
            f"{path} is not valid YAML{at} ({getattr(err, 'problem', None) or err}): fix the file"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of key: value")
    if not loaded:  # an empty file (or `{}`) would silently start the default job on the real pair
        raise ConfigError(
            f"{path} holds no settings (it is empty): write the key: value settings of your job into it (e.g. "
            f"copy configs/gen/tiny.yaml), or leave --config out to run the defaults on purpose"
        )
    return loaded


def config_from(cls: type[T], path: str | Path | None, values: dict[str, Any]) -> T:
    """Config from an optional YAML file with `values` (already parsed, e.g. from a program) on top."""
    return build_config(cls, {**_yaml_values(path), **values}, str(path or "overrides"))


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Config from an optional YAML file, then command-line `key=value` overrides on top."""
    return config_from(cls, path, parse_overrides(overrides or []))


def override_text(values: dict[str, Any]) -> list[str]:
    """`key=value` overrides a shell user would type for `values` (YAML flow style, one line each)."""

    def one(v) -> str:
        return yaml.safe_dump(v, default_flow_style=True, width=1 << 20).removesuffix("...\n").strip()

    return [shlex.quote(f"{k}={one(v)}") for k, v in values.items()]


def config_to_dict(config) -> dict[str, Any]:
    return dataclasses.asdict(config)
