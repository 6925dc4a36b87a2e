"""The ground every row of the effective-access catalogue stands on.

`access` runs each row of its catalogue over a `View` of one container; the rows,
in `access` and its siblings `access_devices` and `access_mounts`, add what they find
to the one `Ctx` of that decision.  Both live here so that every row module can
import them without importing the catalogue that imports the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.core.access.facts import EngineView, HostFacts, Unresolvable
from allocator.core.access.grants import Demand, Grant, Refusal
from allocator.core.machine.inventory import Inventory

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
# A reference to a container -> the inspect of each container dockerd could take it for
# by the time it acts (`refs`: the one it names now, and those it may name as an id
# prefix); empty: it names none.
ContainerOf = Callable[[str], Sequence[Mapping[str, Any]]]
VolumeOf = Callable[[str], tuple[str, Mapping[str, str]] | None]  # name -> (driver, options)


@dataclass(frozen=True)
class View:
    """The fields of a container that matter, from a create body or an inspect."""

    env: tuple[str, ...]
    env_complete: bool  # False for a create: the image's ENV is merged in later
    host_config: Mapping[str, Any]
    volumes: tuple[str, ...] = ()
    mount_points: tuple[tuple[str, str, bool], ...] = ()  # (source, dest, read-only), inspect


@dataclass
class Ctx:
    """One decision: what its rows read, and the grants they found so far."""

    view: View
    engine: EngineView
    inventory: Inventory
    host: HostFacts
    strict: bool  # True for creates: malformed input is a Refusal, not a claim
    container_of: ContainerOf | None = None  # another container (VolumesFrom, a joined namespace)
    volume_of: VolumeOf | None = None  # a named volume's driver and options, from the Engine
    grants: list[Grant] = field(default_factory=list)
    # The owner gpu-alloc knows for this container, whom the policy may let bind the
    # Engine's socket (core/access/socket_binds.py); empty: nobody is.
    socket_owner: str = ""

    env_read: bool = False  # a row already judged what the hook makes of the env
    _majors: frozenset[int] | None = None

    def dynamic_majors(self) -> frozenset[int]:
        """The host's nvidia majors, asked once per decision (a device directory has many
        nodes)."""
        if self._majors is None:
            self._majors = self.host.dynamic_majors()
        return self._majors

    def add(
        self,
        fld: str,
        detail: str,
        gpus: Iterable[str] | None,
        demand: Demand | None = None,
        guarded: bool = False,
        power: bool = False,
    ) -> None:
        pinned = None if gpus is None else frozenset(gpus)
        self.grants.append(Grant(fld, detail, pinned, demand, guarded, power))

    def refuse(self, fld: str, why: str) -> None:
        if self.strict:
            raise Refusal(f"{fld}: {why}")
        self.add(fld, why, None)

    def resolved(self, fld: str, what: str, path: str) -> str | None:
        """``path`` as dockerd resolves it; None, refused, when that cannot be judged."""
        try:
            return self.host.resolve(path)
        except Unresolvable as e:
            self.refuse(fld, f"{what} {path} cannot be judged: {e}")
            return None


def env_values(env: Iterable[str], name: str) -> list[str]:
    """Every value ``name`` is set to in ``env``, in order (the last one wins)."""
    prefix = name + "="
    return [e[len(prefix) :] for e in env if e.startswith(prefix)]


def resolve_ids(ctx: Ctx, fld: str, ids: Iterable[str]) -> set[str] | None:
    """The UUIDs the ids name; None (every GPU: fail closed) for ``all`` or an index or
    MIG id that cannot be placed.  A create (``strict``) is refused any id not found."""
    uuids: set[str] = set()
    for ident in ids:
        if ident in ("all",):
            return None
        try:
            uuids.add(ctx.inventory.resolve(ident).uuid)
        except LookupError as e:
            if ctx.strict:
                raise Refusal(f"{fld}: {e}") from None
            if ident.isdigit() or not ident.upper().startswith("GPU-"):
                return None  # an index or MIG id we can't place: fail closed
            # a departed UUID holds nothing that exists
    return uuids


def names_none(fld: str, verb: str, name: str) -> str:
    """Why a create that ``verb`` container ``name`` is refused when that names none now:
    dockerd looks the name up again when it acts (``--network container:X`` at each
    start), and would take whichever container has it then, unjudged."""
    return (
        f"{fld}: it {verb} container '{name}', and no container is '{name}' now; dockerd "
        "would look it up again when it acts and take whichever container has that name "
        "then, unjudged. Create and start that container first (docker ps -a lists the "
        "names)"
    )
