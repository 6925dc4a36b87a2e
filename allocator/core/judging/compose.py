"""Compose's recreate, as rules over what the Engine itself holds.

Compose v1 (docker-compose 1.29) stops the old container and renames it
``<old short id>_<name>``, creates the new one under the old name, starts it,
then removes the old one.  Compose v2 creates the new one first, as
``<old short id>_<name>`` with ``com.docker.compose.replace=<old id>``, while the
old one still runs, then stops and removes the old one, renames the new one and
starts it.  Either way the old container holds GPUs that its replacement needs on
a full host, so on a shortage the old lease is handed over to the new one.

The hand-over rule
------------------
Labels are set by the client, so a create that *claims* to replace a container
proves nothing; what the Engine holds to is whether the old container exists,
runs, and what it is called.  Hence:

1. A create is a replacement only of a listed container of the same project and
   service that Compose's own sequence points at (`predecessor`).  It takes that
   container's GPUs only when nothing else is free.
2. The predecessor never starts (or restarts) again once it lent its GPUs: its
   lease is ``handed-over`` and every start-like route refuses it.  It gets them
   back only when the replacement's lease ends (the replacement is removed).
3. The replacement may start only when the predecessor is gone (Compose v2: it
   removes the old one before it starts the new one), or is stopped and carries
   the v1 rename ``<its short id>_<the replacement's name>`` (Compose v1 renames
   it before it creates the new one).  A forged create that claims a running
   container's GPUs therefore gets a container that cannot start while its victim
   exists unchanged; only removing or stopping-and-renaming the victim, which
   anyone with the socket could do to free its GPUs anyway, lets it start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.leases.leases import Lease

PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
REPLACE = "com.docker.compose.replace"


def predecessor(
    name: str, given: Mapping[str, str], listed: Iterable[Mapping[str, Any]]
) -> tuple[str, str] | None:
    """(id, current name) of the listed container that a create ``name`` with labels
    ``given`` replaces: same project and service, renamed the way Compose renames."""
    project, service = given.get(PROJECT), given.get(SERVICE)
    if not (name and project and service):
        return None
    replaced = given.get(REPLACE, "")
    for c in listed:
        own = c.get("Labels") or {}
        if own.get(PROJECT) != project or own.get(SERVICE) != service:
            continue
        current = (c.get("Names") or ["/"])[0].lstrip("/")
        v1 = c.get("State") != "running" and current == v1_name(c["Id"], name)
        v2 = (replaced and c["Id"].startswith(replaced)) or name == v1_name(c["Id"], current)
        if v1 or v2:
            return c["Id"], current
    return None


def v1_name(container: str, name: str) -> str:
    """The name Compose gives the container being replaced (v1) or its replacement (v2)."""
    return f"{container[:12]}_{name}"


def replacement_refusal(
    what: str, info: Mapping[str, Any], old: Lease, old_info: Mapping[str, Any] | None
) -> str | None:
    """Rule 3: may the replacement ``info``, whose lease took ``old``'s GPUs, start now?"""
    if old.container is None or old_info is None:
        return None  # the predecessor is gone: the GPUs are the replacement's alone
    state = old_info.get("State") or {}
    shown = old.name or old.container[:12]
    if state.get("Running") or state.get("Restarting") or state.get("Paused"):
        return (
            f"{what}: the container it replaces ({shown}) still runs on its GPUs; "
            "stop and remove that one first"
        )
    own = str(info.get("Name") or "").lstrip("/")
    current = str(old_info.get("Name") or "").lstrip("/")
    if own and current == v1_name(old.container, own):
        return None  # Compose v1: stopped and renamed by Compose before the create
    return (
        f"{what}: the container it replaces ({current or shown}) still exists and is not "
        f"stopped and renamed the way Compose renames it ({v1_name(old.container, own)}); "
        "remove that one first"
    )
