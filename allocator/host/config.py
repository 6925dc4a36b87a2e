"""The operator's YAML file, read once at start-up into frozen dataclasses.

A mistake in the file must stop the process with one line that names the
file and the key, because a half-read config on a GPU server is worse than
none: the plugin sits in front of every Docker call.  Unknown keys are errors
too, so a typo (``state-dir``) never silently falls back to a default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from allocator.core.access.privileged import MODES as PRIVILEGED_MODES
from allocator.core.access.privileged import REFUSE
from allocator.core.api import numbers
from allocator.core.machine.cpus import parse_list
from allocator.core.machine.health import DEFAULT_IGNORED_XIDS, HealthPolicy
from allocator.core.machine.inventory import MigPolicy
from allocator.core.rules.policy import Pool, Rules, Ulimit, parse_size
from allocator.host import (
    config_keys,
    config_notify,
    config_powers,
    config_sharing,
    config_socket_binds,
    config_times,
    swarm_config,
)
from allocator.host import config_values as values
from allocator.host.config_values import ConfigError as ConfigError
from allocator.host.swarm_config import SwarmConfig

DEFAULT_PATH = "/etc/gpu-alloc/config.yaml"
ENV_VAR = "GPU_ALLOC_CONFIG"
PLACEMENT_POLICIES = ("best-effort", "numa", "first-fit")


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
    placement: str = "best-effort"
    lock_timeout: float = 5.0
    pending_ttl: float = 300.0
    idle_after: float = 3600.0  # a leased GPU unused this long is marked idle
    reserved_cpus: str = ""  # a CPU list ("0-1") never leased: housekeeping cores
    mig: MigPolicy = MigPolicy.NONE
    rules: Rules = field(default_factory=Rules)  # limits, pools, gpu_defaults, ...


@dataclass(frozen=True)
class MetricsConfig:
    listen: str | None = None  # "127.0.0.1:9403": Prometheus + dashboard; off when absent


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
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    swarm: SwarmConfig = field(default_factory=SwarmConfig)
    mps: config_sharing.MpsConfig = field(default_factory=config_sharing.MpsConfig)
    notify: config_notify.NotifyConfig = field(default_factory=config_notify.NotifyConfig)
    state_dir: str = "/var/lib/gpu-alloc"
    gpus: str = "nvml"
    sysfs: str = "/sys"  # where the CPU topology is read; tests point it at a fake tree
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
        "idle_after": (int, float),
        "reserved_cpus": str,
        "mig": str,
        "limits": dict,
        "exempt": list,
        "pools": dict,
        "default_pool": (str, type(None)),
        "gpu_defaults": dict,
        "release_stopped_after": (int, float, str, type(None)),
        "priority": dict,
        "wait": dict,
        "privileged": str,
        "fair_share": dict,
        "time_limit": dict,
        "reclaim_idle_after": (int, float, str, type(None)),
        "signal": dict,  # host/config_times.py
        "sharing": (list, dict, type(None)),  # core/rules/sharing.py, host/config_sharing.py
        "engine_socket_binds": (dict, type(None)),  # host/config_socket_binds.py
        "powers": (dict, type(None)),  # host/config_powers.py
    },
    "metrics": {"listen": (str, type(None))},
    "health": {
        "disabled": bool,
        "ignored_xids": list,
        "recheck_after": (int, float),
        "period": (int, float),
    },
    "swarm": swarm_config.KEYS,
    "mps": config_sharing.MPS_KEYS,
    "notify": config_notify.KEYS,
}
# The policy keys that make its `Rules`: every one but `PolicyConfig`'s own fields.
_RULE_KEYS = tuple(k for k in _SECTIONS["policy"] if k not in PolicyConfig.__dataclass_fields__)
_SCALARS: dict[str, type] = {"state_dir": str, "gpus": str, "sysfs": str}


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


def _build(data: dict[str, Any], path: str) -> Config:
    known = set(_SECTIONS) | set(_SCALARS)
    for key in data:
        if key not in known:
            raise values.fail(path, str(key), config_keys.unknown(str(key), known))
    sections: dict[str, Any] = {}
    for name, schema in _SECTIONS.items():
        raw = {} if data.get(name) is None else data[name]
        if not isinstance(raw, dict):
            raise values.fail(path, name, "must be a mapping")
        for key, value in raw.items():
            dotted = f"{name}.{key}"
            if key not in schema:
                raise values.fail(path, dotted, config_keys.unknown(dotted, schema))
            values.check_type(path, dotted, value, schema[key])
        sections[name] = dict(raw)
    for key, want in _SCALARS.items():
        if key in data:
            values.check_type(path, key, data[key], want)

    shim = sections["shim"]
    if "mode" in shim:
        shim["mode"] = _mode(path, shim["mode"])
    policy = sections["policy"]
    if policy.get("placement", "best-effort") not in PLACEMENT_POLICIES:
        raise values.fail(
            path, "policy.placement", f"must be one of {', '.join(PLACEMENT_POLICIES)}"
        )
    if "mig" in policy:
        policy["mig"] = _mig(path, policy["mig"])
    health = sections["health"]
    if "ignored_xids" in health:
        xids = health["ignored_xids"]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in xids):
            raise values.fail(
                path, "health.ignored_xids", "must be a list of Xid numbers, e.g. [13, 43]"
            )
        health["ignored_xids"] = tuple(xids)
    if health.get("recheck_after", 0) < 0:
        raise values.fail(path, "health.recheck_after", "must be 0 (never) or a number of seconds")
    for dotted, value in (
        ("policy.lock_timeout", policy.get("lock_timeout", 1)),
        ("policy.pending_ttl", policy.get("pending_ttl", 1)),
        ("engine.timeout", sections["engine"].get("timeout", 1)),
        ("shim.create_timeout", shim.get("create_timeout", 1)),
        ("plugin.workers", sections["plugin"].get("workers", 1)),
        ("policy.idle_after", policy.get("idle_after", 1)),
        ("health.period", health.get("period", 1)),
    ):
        if value <= 0:
            raise values.fail(path, dotted, "must be greater than zero")
    for dotted, value in (
        ("engine.socket", sections["engine"].get("socket", "/")),
        ("shim.socket", shim.get("socket", "/")),
        ("plugin.socket", sections["plugin"].get("socket", "/")),
        ("state_dir", data.get("state_dir", "/")),
        ("sysfs", data.get("sysfs", "/")),
        ("mps.dir", sections["mps"].get("dir", "/")),
    ):
        if not value.startswith("/"):
            raise values.fail(path, dotted, f"must be an absolute path, got '{value}'") from None
    try:
        parse_list(policy.get("reserved_cpus", ""))
    except ValueError as e:
        raise values.fail(path, "policy.reserved_cpus", str(e)) from None
    ttl = policy.get("pending_ttl", PolicyConfig.pending_ttl)
    create_timeout = shim.get("create_timeout", ShimConfig.create_timeout)
    if ttl <= create_timeout:
        raise values.fail(
            path,
            "policy.pending_ttl",
            f"must be longer than shim.create_timeout "
            f"({create_timeout:g}s), or a slow create's lease could be freed under it",
        )
    listen = sections["metrics"].get("listen")
    if listen is not None:
        host, colon, port = listen.rpartition(":")
        if not (colon and host and numbers.maybe(port, numbers.PORT)):
            raise values.fail(path, "metrics.listen", f"expected host:port, got '{listen}'")
    swarm = swarm_config.parse(sections["swarm"])
    if isinstance(swarm, tuple):
        raise values.fail(path, *swarm)
    notify = config_notify.parse(sections["notify"])
    if isinstance(notify, tuple):
        raise values.fail(path, *notify)
    gpus = data.get("gpus", "nvml")
    if gpus != "nvml" and not gpus.startswith("/"):
        gpus = str((Path(path).parent / gpus).resolve())
    return Config(
        engine=EngineConfig(**sections["engine"]),
        shim=ShimConfig(**shim),
        plugin=PluginConfig(**sections["plugin"]),
        policy=PolicyConfig(
            **{k: v for k, v in policy.items() if k not in _RULE_KEYS},
            rules=replace(_rules(path, policy), withheld=frozenset(swarm.gpus)),
        ),
        metrics=MetricsConfig(**sections["metrics"]),
        health=HealthConfig(**health),
        swarm=swarm,
        mps=config_sharing.MpsConfig(**sections["mps"]),
        notify=notify,
        state_dir=data.get("state_dir", Config.state_dir),
        gpus=gpus,
        sysfs=data.get("sysfs", Config.sysfs),
        source=path,
    )


def _mig(path: str, value: object) -> MigPolicy:
    """``policy.mig``, parsed here once: everything after compares the enum."""
    try:
        return MigPolicy(str(value))
    except ValueError:
        raise values.fail(path, "policy.mig", f"must be one of {', '.join(MigPolicy)}") from None


def _mode(path: str, value: int | str) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(value, 8)
    except ValueError:
        why = f"expected an octal mode such as '0660', got '{value}'"
        raise values.fail(path, "shim.mode", why) from None


# ------------------------------------------------------------------ policy rules


def _rules(path: str, policy: dict[str, Any]) -> Rules:
    """The policy's limits, pools and defaults, each key checked (docs/policy.md)."""
    limits = values.mapping(
        path, "policy.limits", policy.get("limits"), ("default", "users", "groups")
    )
    default = limits.get("default")
    exempt = policy.get("exempt", ["root"])
    for i, name in enumerate(exempt):
        values.check_type(path, f"policy.exempt[{i}]", name, str)
    pools = {}
    for name, raw in values.mapping(path, "policy.pools", policy.get("pools"), None).items():
        key = f"policy.pools.{name}"
        pool = values.mapping(path, key, raw, ("gpus", "users", "groups"))
        if "gpus" not in pool:
            raise values.fail(path, f"{key}.gpus", "a pool must list its GPU indices")
        pools[str(name)] = Pool(
            tuple(values.ints(path, f"{key}.gpus", pool["gpus"])),
            tuple(values.strs(path, f"{key}.users", pool.get("users") or [])),
            tuple(values.strs(path, f"{key}.groups", pool.get("groups") or [])),
        )
    default_pool = policy.get("default_pool")
    if default_pool is not None and default_pool not in pools:
        raise values.fail(path, "policy.default_pool", f"no pool '{default_pool}' in policy.pools")
    gd = values.mapping(
        path, "policy.gpu_defaults", policy.get("gpu_defaults"), ("shm_size", "ulimits")
    )
    shm = None
    if gd.get("shm_size") is not None:
        try:
            shm = parse_size(str(gd["shm_size"]))
        except ValueError as e:
            raise values.fail(path, "policy.gpu_defaults.shm_size", str(e)) from None
    ulimits = []
    for name, value in values.mapping(
        path, "policy.gpu_defaults.ulimits", gd.get("ulimits"), None
    ).items():
        key = f"policy.gpu_defaults.ulimits.{name}"
        soft: Any  # YAML values, checked below
        hard: Any
        if isinstance(value, dict):
            v = values.mapping(path, key, value, ("soft", "hard"))
            soft, hard = v.get("soft", v.get("hard")), v.get("hard", v.get("soft"))
        else:
            soft = hard = value
        for k, n in (("soft", soft), ("hard", hard)):
            values.check_type(path, f"{key}.{k}" if isinstance(value, dict) else key, n, int)
        ulimits.append(Ulimit(str(name), soft, hard))
    privileged = policy.get("privileged", REFUSE)
    if privileged not in PRIVILEGED_MODES:
        raise values.fail(
            path, "policy.privileged", f"must be one of {', '.join(PRIVILEGED_MODES)}"
        )
    priority = values.mapping(path, "policy.priority", policy.get("priority"), ("users", "groups"))
    wait = values.mapping(path, "policy.wait", policy.get("wait"), ("default", "max"))
    share = values.mapping(path, "policy.fair_share", policy.get("fair_share"), ("half_life",))
    if policy.get("fair_share") is not None and share.get("half_life") is None:
        raise values.fail(path, "policy.fair_share.half_life", "required, a duration such as 7d")
    try:
        times = config_times.time_rules(policy)
        sharing = config_sharing.sharing_rules(policy)
        binders = config_socket_binds.binders(policy)
        granted = config_powers.power_grants(policy)
    except config_times.KeyProblem as e:
        raise values.fail(path, e.key, e.why) from None
    return Rules(
        default_limit=None
        if default is None
        else values.gpus(path, "policy.limits.default", default),
        user_limits={
            str(u): values.gpus(path, f"policy.limits.users.{u}", v)
            for u, v in values.mapping(
                path, "policy.limits.users", limits.get("users"), None
            ).items()
        },
        group_limits={
            str(g): values.gpus(path, f"policy.limits.groups.{g}", v)
            for g, v in values.mapping(
                path, "policy.limits.groups", limits.get("groups"), None
            ).items()
        },
        exempt=tuple(exempt),
        pools=pools,
        default_pool=default_pool,
        shm_size=shm,
        ulimits=tuple(ulimits),
        release_stopped_after=_duration(
            path, "policy.release_stopped_after", policy.get("release_stopped_after")
        ),
        user_priorities=values.priorities(path, "policy.priority.users", priority.get("users")),
        group_priorities=values.priorities(path, "policy.priority.groups", priority.get("groups")),
        wait_default=_duration(path, "policy.wait.default", wait.get("default")),
        wait_max=_duration(path, "policy.wait.max", wait.get("max")),
        privileged=privileged,
        fair_share_half_life=_duration(path, "policy.fair_share.half_life", share.get("half_life")),
        **times,
        sharing=sharing,
        engine_socket_binds=binders,
        powers=granted,
    )


def _duration(path: str, key: str, value: Any) -> float | None:
    """Seconds in ``90``, ``30s``, ``15m``, ``24h`` or ``7d``; None when unset."""
    try:
        return config_times.duration(key, value)
    except config_times.KeyProblem as e:
        raise values.fail(path, e.key, e.why) from None
