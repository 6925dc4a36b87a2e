"""Compose's recreate, as rules over the Engine's container list.

Compose v1 stops the old container and renames it ``<short id>_<name>`` before
creating the new one under the old name; Compose v2 creates the new one first,
as ``<old short id>_<name>`` with ``com.docker.compose.replace=<old id>``, while
the old one still runs, then stops and removes it and renames the new one.
Either way the old container holds GPUs that its replacement needs on a full host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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
        v1 = c.get("State") != "running" and current == f"{c['Id'][:12]}_{name}"
        v2 = (replaced and c["Id"].startswith(replaced)) or name == f"{c['Id'][:12]}_{current}"
        if v1 or v2:
            return c["Id"], current
    return None
