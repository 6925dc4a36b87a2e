"""What a verdict can be, and the facts it is made against.

The plugin and the shim both act on these: `verdicts` and `route_checks` return
them, and a verdict that needs the ledger or the Engine (`NeedsLease`,
`StartCheck`, `UpdateCheck`, `PluginCheck`, `DoorCheck`) names what the caller must read before
it answers.  The hint on the gpu-alloc socket is here because every refusal of a
GPU on the real socket ends with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from allocator.core.access import privileged
from allocator.core.access.access_ctx import ContainerOf, VolumeOf
from allocator.core.access.facts import EngineView, HostFacts, NotAsked
from allocator.core.access.owned import DoorCheck
from allocator.core.access.plugins import PluginCheck
from allocator.core.judging import services
from allocator.core.judging.service_marks import ChargeCheck
from allocator.core.leases.inflight import Target
from allocator.core.machine.inventory import Inventory, InventoryError

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


class Fact(StrEnum):
    """A fact a verdict may read.  Each check declares those it reads
    (`route_checks.READS`); only those are gathered for it, and a read of another is
    `Unread`."""

    INVENTORY = "inventory"  # the GPU inventory, and why it is missing
    ENGINE = "engine"  # what the Engine says it is (`facts.EngineView`)
    HOST = "host"  # the host's filesystem as dockerd sees it
    CONTAINER_OF = "container_of"  # another container (VolumesFrom, a namespace joined)
    VOLUME_OF = "volume_of"  # a named volume's driver and options
    SHIM_SOCKET = "shim_socket"  # for the hint on the real socket
    PRIVILEGED_MODE = "privileged_mode"  # policy.privileged
    SWARM_KIND = "swarm_kind"  # swarm.kind: the generic resource of GPUs


EVERY_FACT = frozenset(Fact)
NO_FACT: frozenset[Fact] = frozenset()
# What judging a spec's or a container's access reads (`access`, `starts`, `services`).
ACCESS_READS = frozenset({Fact.INVENTORY, Fact.ENGINE, Fact.HOST, Fact.VOLUME_OF})
# What `starts.refusal` reads: a container's access, the containers whose namespaces it
# joins, and policy.privileged.
START_READS = ACCESS_READS | {Fact.CONTAINER_OF, Fact.PRIVILEGED_MODE}


class Unread(Exception):
    """A verdict read ``fact``, which was not gathered for it: its declaration
    (`route_checks.READS`) is wrong.  Never answered by a default: the caller makes the
    verdict again on every fact (`allocator.service.gather.Gatherer.decide`), or, in the tests,
    fails."""

    def __init__(self, fact: Fact):
        super().__init__(f"a verdict read {fact.value}, a fact not gathered for it")
        self.fact = fact


class Facts:
    """The world a decision is made against, recording what a verdict reads of it.

    The inventory is a fact that may be missing (a simulated file gone, NVML failing):
    work that touches no GPU goes on without it, and only a grant is refused, naming
    ``inventory_error``.  The host's filesystem and the Engine's lookups may be
    `NotAsked` (``host``, ``container_of`` and ``volume_of`` all its): ``needs`` then says
    whether a decision asked for one of them.

    Every read of a fact is kept in ``read``; a read of one outside ``gathered`` raises
    `Unread` (a verdict is handed only the facts it declares: `only`).  Made by the
    gatherer (allocator/service/gather.py) and by tests; one per decision.
    """

    __slots__ = (
        "_container_of", "_engine", "_host", "_inventory", "_inventory_error",
        "_privileged_mode", "_shim_socket", "_swarm_kind", "_volume_of", "gathered", "read",
    )  # fmt: skip

    def __init__(
        self,
        inventory: Inventory | None,
        engine: EngineView,
        host: HostFacts,
        container_of: ContainerOf | None = None,
        inventory_error: str = "",  # why `inventory` is None
        volume_of: VolumeOf | None = None,
        shim_socket: str = DEFAULT_SHIM_SOCKET,
        privileged_mode: str = privileged.REFUSE,  # as the shim leases by it
        swarm_kind: str = services.DEFAULT_KIND,
        gathered: frozenset[Fact] = EVERY_FACT,
    ):
        self._inventory = inventory
        self._engine = engine
        self._host = host
        self._container_of = container_of
        self._inventory_error = inventory_error
        self._volume_of = volume_of
        self._shim_socket = shim_socket
        self._privileged_mode = privileged_mode
        self._swarm_kind = swarm_kind
        self.gathered = gathered
        self.read: set[Fact] = set()

    def _reads(self, fact: Fact) -> None:
        self.read.add(fact)
        if fact not in self.gathered:
            raise Unread(fact)

    def only(self, facts: frozenset[Fact]) -> Facts:
        """These facts, with only ``facts`` of them readable, and nothing read yet."""
        return Facts(
            self._inventory, self._engine, self._host, self._container_of,
            self._inventory_error, self._volume_of, self._shim_socket,
            self._privileged_mode, self._swarm_kind, self.gathered & facts,
        )  # fmt: skip

    @property
    def inventory(self) -> Inventory | None:
        self._reads(Fact.INVENTORY)
        return self._inventory

    @property
    def inventory_error(self) -> str:
        self._reads(Fact.INVENTORY)
        return self._inventory_error

    @property
    def engine(self) -> EngineView:
        self._reads(Fact.ENGINE)
        return self._engine

    @property
    def host(self) -> HostFacts:
        self._reads(Fact.HOST)
        return self._host

    @property
    def container_of(self) -> ContainerOf | None:
        self._reads(Fact.CONTAINER_OF)
        return self._container_of

    @property
    def volume_of(self) -> VolumeOf | None:
        self._reads(Fact.VOLUME_OF)
        return self._volume_of

    @property
    def shim_socket(self) -> str:
        self._reads(Fact.SHIM_SOCKET)
        return self._shim_socket

    @property
    def privileged_mode(self) -> str:
        self._reads(Fact.PRIVILEGED_MODE)
        return self._privileged_mode

    @property
    def swarm_kind(self) -> str:
        self._reads(Fact.SWARM_KIND)
        return self._swarm_kind

    @property
    def known_gpus(self) -> Inventory:
        """The inventory, or no GPUs at all: enough to tell whether a request touches a
        GPU (every GPU source is a grant with or without an inventory), never to grant."""
        inventory = self.inventory
        return inventory if inventory is not None else NO_GPUS

    @property
    def needs(self) -> str:
        """The fact a decision made against these asked for and they lack (`NotAsked`);
        empty when they lacked none it asked for.  Not a read."""
        return self._host.needs if isinstance(self._host, NotAsked) else ""

    def require_inventory(self) -> Inventory:
        inventory = self.inventory
        if inventory is None:
            raise InventoryError(self._inventory_error or "the GPU inventory cannot be read")
        return inventory


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
    Allow
    | Deny
    | NeedsLease
    | StartCheck
    | AllowStart
    | UpdateCheck
    | PluginCheck
    | ChargeCheck
    | DoorCheck
)
ALLOW = Allow()
