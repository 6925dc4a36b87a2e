"""The facts effective access is judged against: what the Engine is, what the host's
filesystem holds.  Gathered at the edges (allocator/service/wiring.py, allocator/host/), passed in
as data, so the core reads nothing itself and tests hand in their own tables.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from allocator.core.access.builds import UNSET, Builder
from allocator.core.access.mounts import Mount

# moby 5128007 (first in 27.3.0): a nvidia device request with Count 0 and no DeviceIDs
# sets NVIDIA_VISIBLE_DEVICES=void.  Before it the hook ran with whatever the env said.
COUNT_ZERO_VOID_SINCE = (27, 3, 0)


@dataclass(frozen=True)
class EngineView:
    """The part of ``GET /info`` and ``GET /version`` that decides what the toolkit gets."""

    default_runtime: str = "runc"
    nvidia_runtimes: frozenset[str] = frozenset({"nvidia"})
    version: tuple[int, int, int] | None = None  # None: not known, judged as the oldest
    api_version: str = ""
    # The authorization plugins dockerd consults on every call (``Plugins.Authorization``).
    authz_plugins: tuple[str, ...] = ()
    # Those daemon.json names for its next reload (``authorization-plugins``).
    pending_authz: tuple[str, ...] = ()
    # What builds may be given (daemon.json's builder.entitlements, dockerd's flags).
    builder: Builder = UNSET

    @classmethod
    def from_info(
        cls, info: Mapping[str, Any], version: Mapping[str, Any] | None = None
    ) -> EngineView:
        """From ``GET /info`` (and ``GET /version``), or daemon.json's keys in its shape.

        A runtime is nvidia's when its name or its binary says so; the default counts
        even where it is not listed (dockerd would not start, but fail closed).
        """
        default = str(info.get("DefaultRuntime") or "runc")
        runtimes = {default: {}, **(info.get("Runtimes") or {})}
        nvidia = {
            name
            for name, spec in runtimes.items()
            if "nvidia" in name.lower()
            or "nvidia" in posixpath.basename(str((spec or {}).get("path", ""))).lower()
        }
        version = version or {}
        return cls(
            default,
            frozenset(nvidia),
            engine_version(str(version.get("Version") or info.get("ServerVersion") or "")),
            str(version.get("ApiVersion") or ""),
            tuple(str(p) for p in (info.get("Plugins") or {}).get("Authorization") or ()),
        )

    def with_pending(self, pending: EngineView) -> EngineView:
        """The stricter of what dockerd runs and what its daemon.json says it runs after
        the next reload (SIGHUP, restart): an edit is judged by from the moment it lands,
        not from whenever dockerd is told.  A default nvidia runtime in either counts, and
        so does every runtime either calls nvidia's."""
        nvidia = self.nvidia_runtimes | pending.nvidia_runtimes
        default = self.default_runtime
        if pending.default_is_nvidia and not self.default_is_nvidia:
            default = pending.default_runtime
        return replace(
            self,
            default_runtime=default,
            nvidia_runtimes=nvidia,
            pending_authz=pending.authz_plugins,
            builder=replace(pending.builder, insecure_flag=self.builder.insecure_flag),
        )

    @classmethod
    def from_daemon_json(cls, data: Mapping[str, Any]) -> EngineView:
        authz = data.get("authorization-plugins")
        view = cls.from_info(
            {
                "DefaultRuntime": data.get("default-runtime"),
                "Runtimes": data.get("runtimes"),
                "Plugins": {"Authorization": authz if isinstance(authz, list) else None},
            }
        )
        return replace(view, builder=Builder.from_daemon_json(data))

    @property
    def authz_chain(self) -> tuple[str, ...]:
        """Every authorization plugin name dockerd consults now or after its next reload:
        what it stores under those names must stay safe to act on."""
        return tuple(dict.fromkeys((*self.authz_plugins, *self.pending_authz)))

    def is_nvidia(self, runtime: str) -> bool:
        return (runtime or self.default_runtime) in self.nvidia_runtimes

    @property
    def default_is_nvidia(self) -> bool:
        """The one check: with nvidia as the default, every container runs the hook, and
        an image's own NVIDIA_VISIBLE_DEVICES grants GPUs without asking."""
        return self.is_nvidia("")

    @property
    def count_zero_is_void(self) -> bool:
        """Does this Engine itself pin a ``Count: 0`` nvidia request to no GPU?"""
        return self.version is not None and self.version >= COUNT_ZERO_VOID_SINCE


def engine_version(text: str) -> tuple[int, int, int] | None:
    """``20.10.24+dfsg1`` -> (20, 10, 24); anything else -> None (judged as the oldest)."""
    parts = text.split("+")[0].split("-")[0].split(".")
    if len(parts) < 3 or not all(p.isascii() and p.isdigit() for p in parts[:3]):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


@dataclass(frozen=True)
class Node:
    """What a path is, as far as device access goes."""

    kind: str  # "chr" (a character device), "dir", or "other"
    major: int = 0
    minor: int = 0


class Unresolvable(Exception):
    """A path that cannot be resolved as dockerd would (its root unreadable, a link loop):
    a bind or device path through it is refused."""


class HostFacts(Protocol):
    """The filesystem questions access asks; allocator.host.filesystem answers them for
    this host, tests answer them from tables.  ``resolve`` raises `Unresolvable`."""

    @property
    def protected(self) -> tuple[str, ...]: ...

    def resolve(self, path: str) -> str: ...

    def node(self, path: str) -> Node | None: ...

    def walk(self, top: str) -> Iterable[str]: ...

    def drm_bus_id(self, minor: int) -> str | None: ...

    def dynamic_majors(self) -> frozenset[int]: ...

    def mounts(self) -> Iterable[Mount]: ...


HOST_FILES = "the host's filesystem"
OTHER_CONTAINER = "another container"
VOLUME_OPTIONS = "a volume's options"
HOST_POLICY = "the policy's grants and the host's AppArmor"


class NotAsked:
    """The host's filesystem and the Engine's lookups, not asked: the facts of a decision
    made where nothing may wait (an event loop).

    Each question is answered as an empty host would answer it, and the first one asked
    is kept in ``needs``: a verdict made against facts whose ``needs`` is set is not
    given, but made again with the facts read (`allocator.service.gather.Gatherer.decide`).
    ``protected`` is known without asking.  One per decision.
    """

    def __init__(self, protected: tuple[str, ...]):
        self.protected = protected
        self.needs = ""

    def _ask(self, what: str) -> None:
        self.needs = self.needs or what

    def resolve(self, path: str) -> str:
        self._ask(HOST_FILES)
        return path

    def node(self, path: str) -> Node | None:
        self._ask(HOST_FILES)
        return None

    def walk(self, top: str) -> Iterable[str]:
        self._ask(HOST_FILES)
        return ()

    def drm_bus_id(self, minor: int) -> str | None:
        self._ask(HOST_FILES)
        return None

    def dynamic_majors(self) -> frozenset[int]:
        self._ask(HOST_FILES)
        return frozenset()

    def mounts(self) -> Iterable[Mount]:
        self._ask(HOST_FILES)
        return ()

    def may_use_power(self, user: str, power: str) -> bool:
        """`power_grants.may_use`, not asked (the groups are NSS's)."""
        self._ask(HOST_POLICY)
        return False

    def apparmor_loaded(self) -> bool:
        self._ask(HOST_POLICY)
        return False

    def container_of(self, container: str) -> Sequence[Mapping[str, Any]]:
        """`access_ctx.ContainerOf`, not asked."""
        self._ask(OTHER_CONTAINER)
        return ()

    def volume_of(self, name: str) -> tuple[str, Mapping[str, str]] | None:
        """`access_ctx.VolumeOf`, not asked."""
        self._ask(VOLUME_OPTIONS)
        return None


@dataclass(frozen=True)
class Need:
    """A decision not given: it asked for ``what``, a fact not at hand."""

    what: str
