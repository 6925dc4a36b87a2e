"""What a verdict can be, and the facts it is made against.

The plugin and the shim both act on these: `verdicts` and `route_checks` return
them, and a verdict that needs the ledger or the Engine (`NeedsLease`,
`StartCheck`, `UpdateCheck`, `PluginCheck`) names what the caller must read before
it answers.  The hint on the gpu-alloc socket is here because every refusal of a
GPU on the real socket ends with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core import privileged, services
from allocator.core.access_ctx import MountsOf, VolumeOf
from allocator.core.facts import EngineView, HostFacts, NotAsked
from allocator.core.inflight import Target
from allocator.core.inventory import Inventory, InventoryError
from allocator.core.plugins import PluginCheck
from allocator.core.service_marks import ChargeCheck

DEFAULT_SHIM_SOCKET = "/run/gpu-alloc/docker.sock"


def context_hint(shim_socket: str = DEFAULT_SHIM_SOCKET) -> str:
    """What to do instead, for a refusal on the real socket: the command that fixes it."""
    return (
        "GPUs are leased only through the gpu-alloc socket: create its context once with "
        f"'docker context create gpu-alloc --docker host=unix://{shim_socket}', then run "
        "'docker --context gpu-alloc run --gpus 1 ...' (or a Compose device reservation; "
        f"docker-compose v1 reads only DOCKER_HOST=unix://{shim_socket})"
    )


HINT = context_hint()

NO_GPUS = Inventory(())


@dataclass(frozen=True)
class Facts:
    """The world a decision is made against.

    The inventory is a fact that may be missing (a simulated file gone, NVML failing):
    work that touches no GPU goes on without it, and only a grant is refused, naming
    ``inventory_error``.  The host's filesystem and the Engine's lookups may be
    `NotAsked` (``host``, ``mounts_of`` and ``volume_of`` all its): ``needs`` then says
    whether a decision asked for one of them.
    """

    inventory: Inventory | None
    engine: EngineView
    host: HostFacts
    mounts_of: MountsOf | None = None  # another container's binds, for VolumesFrom
    inventory_error: str = ""  # why `inventory` is None
    volume_of: VolumeOf | None = None  # a named volume's driver and options
    shim_socket: str = DEFAULT_SHIM_SOCKET  # for the hint on the real socket
    privileged_mode: str = privileged.REFUSE  # policy.privileged, as the shim leases by it
    swarm_kind: str = services.DEFAULT_KIND  # swarm.kind: the generic resource of GPUs

    @property
    def known_gpus(self) -> Inventory:
        """The inventory, or no GPUs at all: enough to tell whether a request touches a
        GPU (every GPU source is a grant with or without an inventory), never to grant."""
        return self.inventory if self.inventory is not None else NO_GPUS

    @property
    def needs(self) -> str:
        """The fact a decision made against these asked for and they lack (`NotAsked`);
        empty when they lacked none it asked for."""
        return self.host.needs if isinstance(self.host, NotAsked) else ""

    def require_inventory(self) -> Inventory:
        if self.inventory is None:
            raise InventoryError(self.inventory_error or "the GPU inventory cannot be read")
        return self.inventory


@dataclass(frozen=True)
class Allow:
    pass


@dataclass(frozen=True)
class Deny:
    msg: str
    field: str = ""  # the GPU-granting field refused, when one was (for the metrics)


@dataclass(frozen=True)
class NeedsLease:
    """Allow only if the ledger has a pending lease ``lease_id`` for exactly ``gpus``."""

    lease_id: str
    token: str
    gpus: frozenset[str]


@dataclass(frozen=True)
class StartCheck:
    """Allow only if container ``ref``, as it resolves now, passes `starts.refusal`."""

    ref: str


@dataclass(frozen=True)
class AllowStart:
    """A start allowed for the container its reference named when judged (None: it named
    none; dockerd will say so).  The shim forwards it by that container's full id."""

    target: Target | None


@dataclass(frozen=True)
class UpdateCheck:
    """Allow unless ``ref``'s lease set one of ``fields`` (its leased cores or memory), or
    the update sets a ``restart`` policy (`restarts.asked`) a start of ``ref`` fails."""

    ref: str
    fields: tuple[str, ...]
    restart: str = ""


Decision = (
    Allow | Deny | NeedsLease | StartCheck | AllowStart | UpdateCheck | PluginCheck | ChargeCheck
)
ALLOW = Allow()
