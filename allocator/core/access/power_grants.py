"""``policy.powers``: the powers outside the allow-list (`powers`) the operator grants to
named owners, and how a judgement asks the host about them.

A grant is an owner's, so it counts only where gpu-alloc knows the owner: a create the
shim forwards (it labels and marks it, as for ``policy.engine_socket_binds``:
`socket_binds`), and a start or an existing container by the owner gpu-alloc recorded.
On dockerd's own socket nobody asks by name, and nothing is granted.  Group membership
is the host's (NSS) to answer, so the host's facts answer the question (`may_use`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.core.judging.socket_binds import Binders


@dataclass(frozen=True)
class PowerGrants:
    """Power (a capability's name, or a key such as ``pid-host``) -> who holds it."""

    by_power: Mapping[str, Binders] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.by_power.values())

    def allow(self, power: str, user: str, groups: Iterable[str]) -> bool:
        holders = self.by_power.get(power)
        return holders is not None and holders.allow(user, groups)

    def any_for(self, user: str, groups: Iterable[str]) -> bool:
        """``user`` holds some power: the shim labels their creates with their name."""
        listed = tuple(groups)
        return any(h.allow(user, listed) for h in self.by_power.values())


NO_GRANTS = PowerGrants()  # the default: the allow-list alone


def may_use(host: Any, owner: str, power: str) -> bool:
    """The policy grants ``power`` to ``owner`` (the host asks NSS for groups)."""
    ask = getattr(host, "may_use_power", None)
    return bool(owner) and ask is not None and bool(ask(owner, power))


def apparmor(host: Any) -> bool:
    """AppArmor is loaded on the host, so Docker confines containers by a profile."""
    ask = getattr(host, "apparmor_loaded", None)
    return ask is not None and bool(ask())
