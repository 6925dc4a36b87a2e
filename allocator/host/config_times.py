"""The policy's durations as the config file writes them, and its time keys:
``policy.time_limit``, ``policy.reclaim_idle_after`` and ``policy.signal``
(allocator/core/timing/timelimits.py, allocator/core/timing/reclaim.py,
allocator/core/timing/checkpoint.py)."""

from __future__ import annotations

import math
from typing import Any

from allocator.core.api import numbers, signals
from allocator.host import config_keys

TIME_LIMIT_KEYS = ("default", "pools", "users", "groups")


class KeyProblem(ValueError):
    """A key of the file that cannot be read: the dotted key, and why."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(key, why)
        self.key, self.why = key, why


def duration(key: str, value: Any) -> float | None:
    """Seconds in ``90``, ``30s``, ``15m``, ``24h`` or ``7d``; None when unset."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise KeyProblem(key, f"expected a duration such as 24h or 30m, got {value!r}")
    if isinstance(value, str):
        try:
            value = numbers.read(value, numbers.DURATION)
        except numbers.BadNumber as e:
            why = f"expected a duration such as 24h or 30m, got '{value.strip()[:40]}'"
            raise KeyProblem(key, why + ("" if e.syntax else f" ({e})")) from None
    if not math.isfinite(value) or value > numbers.CENTURY:
        raise KeyProblem(key, f"expected a duration such as 24h or 30m, got {value!r}")
    if value <= 0:
        raise KeyProblem(key, "must be greater than zero")
    return float(value)


def time_rules(policy: dict[str, Any]) -> dict[str, Any]:
    """The `Rules` fields of ``policy.time_limit``, ``policy.reclaim_idle_after`` and
    ``policy.signal``."""
    limits = _mapping("policy.time_limit", policy.get("time_limit"), TIME_LIMIT_KEYS)
    named = {
        kind: {
            str(name): _required(f"policy.time_limit.{kind}.{name}", value)
            for name, value in _mapping(f"policy.time_limit.{kind}", limits.get(kind)).items()
        }
        for kind in ("pools", "users", "groups")
    }
    _known_pools("policy.time_limit", named["pools"], policy)
    return {
        **_signal_rules(policy),
        "time_default": duration("policy.time_limit.default", limits.get("default")),
        "time_pools": named["pools"],
        "time_users": named["users"],
        "time_groups": named["groups"],
        "reclaim_idle_after": duration(
            "policy.reclaim_idle_after", policy.get("reclaim_idle_after")
        ),
    }


def _signal_rules(policy: dict[str, Any]) -> dict[str, Any]:
    """``policy.signal``, keyed as ``policy.time_limit``: each value a signal and its lead,
    such as ``USR1@5m`` (allocator/core/api/signals.py)."""
    rules = _mapping("policy.signal", policy.get("signal"), TIME_LIMIT_KEYS)
    named = {
        kind: {
            str(name): _signal(f"policy.signal.{kind}.{name}", value)
            for name, value in _mapping(f"policy.signal.{kind}", rules.get(kind)).items()
        }
        for kind in ("pools", "users", "groups")
    }
    _known_pools("policy.signal", named["pools"], policy)
    default = rules.get("default")
    return {
        "signal_default": None if default is None else _signal("policy.signal.default", default),
        "signal_pools": named["pools"],
        "signal_users": named["users"],
        "signal_groups": named["groups"],
    }


def _signal(key: str, value: Any) -> signals.Signal:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise KeyProblem(key, f"expected {signals.EXPECTED}, got {value!r}")
    try:
        return signals.parse(value)
    except ValueError as e:
        raise KeyProblem(key, str(e)) from None


def _known_pools(key: str, named: dict[str, Any], policy: dict[str, Any]) -> None:
    pools = policy.get("pools") or {}
    for name in named:
        if name not in pools:
            raise KeyProblem(f"{key}.pools.{name}", f"no pool '{name}' in policy.pools")


def _required(key: str, value: Any) -> float:
    seconds = duration(key, value)
    if seconds is None:
        raise KeyProblem(key, "expected a duration such as 24h or 30m, got null")
    return seconds


def _mapping(key: str, value: Any, known: tuple[str, ...] | None = None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise KeyProblem(key, "must be a mapping")
    for k in value:
        if known is not None and k not in known:
            raise KeyProblem(f"{key}.{k}", config_keys.unknown(f"{key}.{k}", known))
    return value
