"""The config file's values read one shape at a time: a mapping, a list of whole numbers or
names, a priority table, a GPU limit; each refusal a `ConfigError` naming the file and the
key (allocator/host/config.py reads the sections with them)."""

from __future__ import annotations

from typing import Any

from allocator.host import config_keys


class ConfigError(Exception):
    """A bad configuration; the message names the file and the key."""


def fail(path: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{path}: key '{key}': {why}")


def check_type(path: str, key: str, value: Any, want: type | tuple[type, ...]) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool) and bool not in wants:
        raise fail(path, key, f"expected {_names(wants)}, got a boolean")
    if not isinstance(value, wants):
        raise fail(path, key, f"expected {_names(wants)}, got {type(value).__name__}")


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def priorities(path: str, key: str, value: Any) -> dict[str, int]:
    """Name -> priority (any whole number; higher is served first)."""
    found = {}
    for name, n in mapping(path, key, value, None).items():
        check_type(path, f"{key}.{name}", n, int)
        found[str(name)] = n
    return found


def mapping(path: str, key: str, value: Any, known: tuple[str, ...] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(path, key, "must be a mapping")
    for k in value:
        if known is not None and k not in known:
            raise fail(path, f"{key}.{k}", config_keys.unknown(f"{key}.{k}", known))
    return value


def gpus(path: str, key: str, value: Any) -> int:
    """A limit is written ``{gpus: N}``, to leave room for more kinds of limit."""
    gpus: Any = mapping(path, key, value, ("gpus",)).get("gpus")  # YAML, checked next
    check_type(path, f"{key}.gpus", gpus, int)
    if gpus < 0:
        raise fail(path, f"{key}.gpus", "must be zero or more")
    return gpus


def ints(path: str, key: str, value: Any) -> list[int]:
    check_type(path, key, value, list)
    for i, v in enumerate(value):
        check_type(path, f"{key}[{i}]", v, int)
    return value


def strs(path: str, key: str, value: Any) -> list[str]:
    check_type(path, key, value, list)
    for i, v in enumerate(value):
        check_type(path, f"{key}[{i}]", v, str)
    return value
