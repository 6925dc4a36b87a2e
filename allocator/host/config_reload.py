"""What a reload of the config changed: the policy keys now in force, and the sections a
running service reads only at its start, which wait for a restart (both for its log)."""

from __future__ import annotations

from allocator.host.config import Config, PolicyConfig

# Config's fields that are no section of the file: where it was read from.
_NOT_READ = ("source",)


def policy_changes(old: PolicyConfig, new: PolicyConfig) -> list[str]:
    """The ``policy.`` keys a reload changes, for its log line (the rules' many keys as
    one entry: limits, pools, defaults, waits, times, sharing)."""
    fields = (f for f in PolicyConfig.__dataclass_fields__ if f != "rules")
    changed = [f"policy.{f}" for f in fields if getattr(old, f) != getattr(new, f)]
    if old.rules != new.rules:
        changed.append("the policy's rules")
    return changed


def restart_changes(old: Config, new: Config) -> list[str]:
    """The sections outside ``policy:`` that differ: a running service reads them only at
    its start (its sockets, state directory, listeners, notices), so they wait for a
    restart."""
    names = (n for n in Config.__dataclass_fields__ if n != "policy" and n not in _NOT_READ)
    return [n for n in names if getattr(old, n) != getattr(new, n)]
