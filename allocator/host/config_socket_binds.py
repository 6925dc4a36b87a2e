"""``policy.engine_socket_binds`` as the config file writes it: who may bind the Engine's
own API socket into their containers and services (allocator/core/access/socket_binds.py)::

    engine_socket_binds:
      users: [ci-runner]
      groups: [ops]

Both lists are optional; without the key nobody may.  Errors are
`config_times.KeyProblem`s: the dotted key, and why.
"""

from __future__ import annotations

from typing import Any

from allocator.core.rules.power_grants import NOBODY_BINDS, Binders
from allocator.host.config_times import KeyProblem

KEY = "policy.engine_socket_binds"


def binders(policy: dict[str, Any]) -> Binders:
    """Who the key names (empty: nobody)."""
    raw = policy.get("engine_socket_binds")
    return NOBODY_BINDS if raw is None else holders(raw, KEY)


def holders(raw: object, key: str) -> Binders:
    """``{users: [...], groups: [...]}`` at ``key`` (this one, or a power's in
    ``policy.powers``): both lists optional, anything else a `KeyProblem`."""
    if not isinstance(raw, dict):
        raise KeyProblem(key, "must be a mapping with users and/or groups (lists of names)")
    unknown = sorted(set(map(str, raw)) - {"users", "groups"})
    if unknown:
        raise KeyProblem(f"{key}.{unknown[0]}", "unknown key (users and groups are known)")
    found: dict[str, tuple[str, ...]] = {}
    for name in ("users", "groups"):
        value = raw.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise KeyProblem(f"{key}.{name}", "must be a list of names")
        found[name] = tuple(value)
    return Binders(found["users"], found["groups"])
