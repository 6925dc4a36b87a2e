"""Namespaces joined from another container: what it reaches, the joiner reaches.

``--pid container:X`` sees X's processes and, through ``/proc/<pid>/root``, X's whole
filesystem (a share's MPS pipe directory among it) and may trace them; ``--ipc
container:X`` mounts X's /dev/shm (a share's MPS shm directory); ``--network
container:X`` shares X's loopback and abstract unix sockets.  So a create that joins one
of X's namespaces is judged as reaching every GPU X reaches: it holds X's grants, and
needs a lease of those GPUs (a share of a shared one) as X did; where X's GPUs cannot be
pinned, it is refused.  X is asked of the Engine as it is now (`Ctx.container_of`):
every container dockerd could take X for by the time it acts is judged as an existing
container, the namespaces it joined itself included, and a create whose X names none is
refused (`access_ctx.names_none`).  dockerd stores the container it resolved by its full
id, so a later start joins that one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from allocator.core.access.access_ctx import Ctx, names_none
from allocator.core.access.grants import Access, Refusal

# HostConfig's namespace modes that may name another container, and what each shares.
MODES = {"PidMode": "PID", "IpcMode": "IPC", "NetworkMode": "network"}
Reach = Callable[[Mapping[str, Any]], Access]  # an inspected container -> what it reaches


def target(mode_value: object) -> str | None:
    """The container a mode joins (``container:X``), or None for any other mode."""
    kind, colon, name = str(mode_value or "").partition(":")
    return name if kind == "container" and colon else None


def namespaces(ctx: Ctx, reach: Reach) -> None:
    """The grants of each container whose namespace this one joins, as its own."""
    for mode, what in MODES.items():
        name = target(ctx.view.host_config.get(mode))
        if name is None:
            continue
        fld = f"HostConfig.{mode}"
        if ctx.container_of is None:
            if ctx.strict:
                raise Refusal(f"{fld}: what container '{name}' reaches cannot be checked here")
            continue
        could = ctx.container_of(name)
        if not could and ctx.strict:
            raise Refusal(names_none(fld, f"joins the {what} namespace of", name))
        for other in could:
            for g in reach(other).grants:
                detail = f"joins the {what} namespace of container {name}, which holds {g.detail}"
                ctx.add(fld, detail, g.gpus, g.demand)
