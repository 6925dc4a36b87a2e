"""The operator's YAML file, read once at start-up into frozen dataclasses.

A mistake in the file must stop the process with one line that names the
file and the key, because a half-read config on a GPU server is worse than
none: the plugin sits in front of every Docker call.  Unknown keys are errors
too, so a typo (``state-dir``) never silently falls back to a default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from allocator.core.health import DEFAULT_IGNORED_XIDS, HealthPolicy

DEFAULT_PATH = "/etc/gpu-alloc/config.yaml"
ENV_VAR = "GPU_ALLOC_CONFIG"
PLACEMENT_POLICIES = ("numa", "first-fit")
MIG_POLICIES = ("none", "single", "mixed")  # as the NVIDIA Kubernetes device plugin names them


class ConfigError(Exception):
    """A bad configuration; the message names the file and the key."""


@dataclass(frozen=True)
class EngineConfig:
    socket: str = "/var/run/docker.sock"
    timeout: float = 10.0
    daemon_json: str = "/etc/docker/daemon.json"


@dataclass(frozen=True)
class ShimConfig:
    socket: str = "/run/gpu-alloc/docker.sock"
    mode: int = 0o660
    group: str | None = "docker"
    create_timeout: float = 120.0


@dataclass(frozen=True)
class PluginConfig:
    socket: str = "/run/docker/plugins/gpu-alloc.sock"
    name: str = "gpu-alloc"  # as daemon.json's "authorization-plugins" names it
    workers: int = 2


@dataclass(frozen=True)
class PolicyConfig:
    placement: str = "numa"
    lock_timeout: float = 5.0
    pending_ttl: float = 300.0
    mig: str = "none"


@dataclass(frozen=True)
class HealthConfig:
    """The GPU health watcher (allocator/host/watcher.py); defaults as the Kubernetes
    device plugin's."""

    disabled: bool = False
    ignored_xids: tuple[int, ...] = tuple(sorted(DEFAULT_IGNORED_XIDS))
    recheck_after: float = 300.0  # seconds before the automatic probe; 0: never
    period: float = 1.0  # seconds per watcher step

    def policy(self) -> HealthPolicy:
        return HealthPolicy(self.disabled, frozenset(self.ignored_xids), self.recheck_after)


@dataclass(frozen=True)
class Config:
    engine: EngineConfig = field(default_factory=EngineConfig)
    shim: ShimConfig = field(default_factory=ShimConfig)
    plugin: PluginConfig = field(default_factory=PluginConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    state_dir: str = "/var/lib/gpu-alloc"
    gpus: str = "nvml"
    source: str = "<defaults>"


# key -> (type, validator) for each section; the table is the schema.
_SECTIONS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "engine": {"socket": str, "timeout": (int, float), "daemon_json": str},
    "shim": {
        "socket": str,
        "mode": (int, str),
        "group": (str, type(None)),
        "create_timeout": (int, float),
    },
    "plugin": {"socket": str, "name": str, "workers": int},
    "policy": {
        "placement": str,
        "lock_timeout": (int, float),
        "pending_ttl": (int, float),
        "mig": str,
    },
    "health": {
        "disabled": bool,
        "ignored_xids": list,
        "recheck_after": (int, float),
        "period": (int, float),
    },
}
_SCALARS: dict[str, type] = {"state_dir": str, "gpus": str}


def resolve_path(explicit: str | None) -> str:
    """``--config`` wins, then ``$GPU_ALLOC_CONFIG``, then the system default."""
    return explicit or os.environ.get(ENV_VAR) or DEFAULT_PATH


def load(explicit: str | None = None) -> Config:
    path = resolve_path(explicit)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if explicit is None and path == DEFAULT_PATH:
            return Config()
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return parse(text, path)


def parse(text: str, path: str = "<string>") -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return _build(data, path)


def _fail(path: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{path}: key '{key}': {why}")


def _check_type(path: str, key: str, value: Any, want: type | tuple[type, ...]) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    if isinstance(value, bool) and bool not in wants:
        raise _fail(path, key, f"expected {_names(wants)}, got a boolean")
    if not isinstance(value, wants):
        raise _fail(path, key, f"expected {_names(wants)}, got {type(value).__name__}")


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _build(data: dict[str, Any], path: str) -> Config:
    known = set(_SECTIONS) | set(_SCALARS)
    for key in data:
        if key not in known:
            raise _fail(path, str(key), f"unknown key (known: {', '.join(sorted(known))})")
    sections: dict[str, Any] = {}
    for name, schema in _SECTIONS.items():
        raw = {} if data.get(name) is None else data[name]
        if not isinstance(raw, dict):
            raise _fail(path, name, "must be a mapping")
        for key, value in raw.items():
            dotted = f"{name}.{key}"
            if key not in schema:
                raise _fail(path, dotted, f"unknown key (known: {', '.join(schema)})")
            _check_type(path, dotted, value, schema[key])
        sections[name] = dict(raw)
    for key, want in _SCALARS.items():
        if key in data:
            _check_type(path, key, data[key], want)

    shim = sections["shim"]
    if "mode" in shim:
        shim["mode"] = _mode(path, shim["mode"])
    policy = sections["policy"]
    if policy.get("placement", "numa") not in PLACEMENT_POLICIES:
        raise _fail(path, "policy.placement", f"must be one of {', '.join(PLACEMENT_POLICIES)}")
    if policy.get("mig", "none") not in MIG_POLICIES:
        raise _fail(path, "policy.mig", f"must be one of {', '.join(MIG_POLICIES)}")
    health = sections["health"]
    if "ignored_xids" in health:
        xids = health["ignored_xids"]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in xids):
            raise _fail(path, "health.ignored_xids", "must be a list of Xid numbers, e.g. [13, 43]")
        health["ignored_xids"] = tuple(xids)
    if health.get("recheck_after", 0) < 0:
        raise _fail(path, "health.recheck_after", "must be 0 (never) or a number of seconds")
    for dotted, value in (
        ("policy.lock_timeout", policy.get("lock_timeout", 1)),
        ("policy.pending_ttl", policy.get("pending_ttl", 1)),
        ("engine.timeout", sections["engine"].get("timeout", 1)),
        ("shim.create_timeout", shim.get("create_timeout", 1)),
        ("plugin.workers", sections["plugin"].get("workers", 1)),
        ("health.period", health.get("period", 1)),
    ):
        if value <= 0:
            raise _fail(path, dotted, "must be greater than zero")
    for dotted, value in (
        ("engine.socket", sections["engine"].get("socket", "/")),
        ("shim.socket", shim.get("socket", "/")),
        ("plugin.socket", sections["plugin"].get("socket", "/")),
        ("state_dir", data.get("state_dir", "/")),
    ):
        if not value.startswith("/"):
            raise _fail(path, dotted, f"must be an absolute path, got '{value}'") from None
    ttl = policy.get("pending_ttl", PolicyConfig.pending_ttl)
    create_timeout = shim.get("create_timeout", ShimConfig.create_timeout)
    if ttl <= create_timeout:
        raise _fail(
            path,
            "policy.pending_ttl",
            f"must be longer than shim.create_timeout "
            f"({create_timeout:g}s), or a slow create's lease could be freed under it",
        )
    gpus = data.get("gpus", "nvml")
    if gpus != "nvml" and not gpus.startswith("/"):
        gpus = str((Path(path).parent / gpus).resolve())
    return Config(
        engine=EngineConfig(**sections["engine"]),
        shim=ShimConfig(**shim),
        plugin=PluginConfig(**sections["plugin"]),
        policy=PolicyConfig(**policy),
        health=HealthConfig(**health),
        state_dir=data.get("state_dir", Config.state_dir),
        gpus=gpus,
        source=path,
    )


def _mode(path: str, value: int | str) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(value, 8)
    except ValueError:
        why = f"expected an octal mode such as '0660', got '{value}'"
        raise _fail(path, "shim.mode", why) from None
