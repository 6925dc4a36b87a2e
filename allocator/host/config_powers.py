"""``policy.powers`` as the config file writes it: the powers outside the allow-list
(allocator/core/access/powers.py) the operator grants to named users and groups::

    powers:
      SYS_ADMIN: {users: [alice], groups: [fuse-users]}
      pid-host: {groups: [profilers]}

A power is a capability's name (as dockerd normalises it: upper case, no ``CAP_``) or
one of the keys a refusal names (``pid-host``, ``sysctls``, ``devices``, ...); an unknown
one is an error, so a typo grants nothing silently.  Without the key, nobody holds any.
Errors are `config_times.KeyProblem`s: the dotted key, and why.
"""

from __future__ import annotations

from typing import Any

from allocator.core.access import powers
from allocator.core.rules.power_grants import NO_GRANTS, PowerGrants
from allocator.host import config_socket_binds
from allocator.host.config_times import KeyProblem

KEY = powers.KEY


def power_grants(policy: dict[str, Any]) -> PowerGrants:
    """Who the key names for each power (empty: the allow-list alone)."""
    raw = policy.get("powers")
    if raw is None:
        return NO_GRANTS
    if not isinstance(raw, dict):
        raise KeyProblem(KEY, "must be a mapping of powers to {users: [...], groups: [...]}")
    found = {}
    for power, holders in raw.items():
        key = f"{KEY}.{power}"
        if str(power) not in powers.GRANTABLE:
            raise KeyProblem(key, f"unknown power (known: {', '.join(sorted(powers.GRANTABLE))})")
        found[str(power)] = config_socket_binds.holders(holders, key)
    return PowerGrants(found)
