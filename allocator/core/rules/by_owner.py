"""Which of the operator's per-owner rules applies to a request, for every key that is
set per user, per group, per pool and as a default (``policy.time_limit``,
``policy.signal``).

Rules
-----
1. The user's own rule wins.
2. Else the largest of the rules of the groups the user is in (by the key's measure),
   the first group in name order among equals.
3. Else the rule of the pool the request is placed in.
4. Else the default; else none applies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from allocator.core.rules.policy import Owner

T = TypeVar("T")


@dataclass(frozen=True)
class ByOwner(Generic[T]):
    """One key's rules: ``key`` is its dotted name in the config (``policy.signal``)."""

    key: str
    users: Mapping[str, T]
    groups: Mapping[str, T]
    pools: Mapping[str, T]
    default: T | None

    def pick(
        self, owner: Owner, pool: str | None, size: Callable[[T], float]
    ) -> tuple[T, str] | None:
        """The rule for ``owner``'s request placed in ``pool``, with the dotted key that
        set it; ``size`` measures a group's rule against the others'."""
        if owner.user in self.users:
            return self.users[owner.user], f"{self.key}.users.{owner.user}"
        groups = [(self.groups[g], f"{self.key}.groups.{g}") for g in sorted(owner.groups)
                  if g in self.groups]  # fmt: skip
        if groups:
            return max(groups, key=lambda found: size(found[0]))
        if pool is not None and pool in self.pools:
            return self.pools[pool], f"{self.key}.pools.{pool}"
        if self.default is not None:
            return self.default, f"{self.key}.default"
        return None
