"""What a build can reach on an Engine: the build door.

A build step is a container that no create request describes and no authorization
plugin sees.  BuildKit runs one with devices when the client asks and the daemon
allows it, by one of these doors:

* the ``device`` entitlement (Engine 29.0+): a step may name CDI devices
  (``nvidia.com/gpu=all``), allowed unless daemon.json sets
  ``builder.entitlements.device: false``;
* the ``security-insecure`` entitlement (every Engine with BuildKit): a privileged step
  sees every device node of the host, allowed only when daemon.json sets
  ``builder.entitlements.security-insecure: true`` or dockerd runs with
  ``--allow-insecure-entitlement security.insecure``.

A client reaches BuildKit by ``POST /grpc`` (or ``/session``) upgraded to h2c, which
the plugin sees as a request without a body, and on 29.2+ by HTTP/2 gRPC spoken
directly on the Engine's socket, which no plugin ever sees.  So the only closing that
holds for every way in is dockerd's own configuration; the plugin refuses the
upgrade ways while it is open (`verdicts`), and doctor fails such a host.

daemon.json's ``builder`` object is decoded by Go into a struct: keys below it match
case-insensitively, the last of a repeated key wins, and a value that is not a JSON
boolean stops dockerd from starting (so none is read here as set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.api.gojson import go_fold

# moby daemon/config/builder.go: BuilderEntitlements.Device, first in 29.0.
DEVICE_ENTITLEMENT_SINCE = (29, 0, 0)
# moby daemon/command/httphandler.go: HTTP/2 application/grpc on the API socket.
NATIVE_GRPC_SINCE = (29, 2, 0)
INSECURE_FLAG = "security.insecure"  # --allow-insecure-entitlement's value

# What the installer writes, and what closes the door on 29+ (harmless before: dockerd
# 20.10 to 28 decode the builder object and ignore an unknown key inside it).
CLOSED = {"builder": {"entitlements": {"device": False}}}
FIX = (
    'set "builder": {"entitlements": {"device": false}} in daemon.json (deploy/install.sh '
    "writes it) and restart docker"
)


@dataclass(frozen=True)
class Builder:
    """daemon.json's ``builder.entitlements`` as dockerd reads them; None: not set."""

    device: bool | None = None
    security_insecure: bool | None = None
    insecure_flag: bool = False  # dockerd's command line allows security.insecure

    @classmethod
    def from_daemon_json(cls, data: Mapping[str, Any]) -> Builder:
        builder = data.get("builder")  # top-level keys are matched exactly by dockerd
        entitlements = _field(builder, "entitlements")
        return cls(
            device=_bool(_field(entitlements, "device")),
            security_insecure=_bool(_field(entitlements, "security-insecure")),
        )

    def with_flags(self, allowed: list[str]) -> Builder:
        """With dockerd's ``--allow-insecure-entitlement`` values."""
        return Builder(self.device, self.security_insecure, INSECURE_FLAG in allowed)


UNSET = Builder()  # no daemon.json, or no builder object in it


def _field(obj: object, name: str) -> object:
    """The value Go decodes into the field ``name``: the last key that folds to it."""
    if not isinstance(obj, Mapping):
        return None
    found = None
    for key, value in obj.items():
        if go_fold(str(key)) == name:
            found = value
    return found


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def open_doors(version: tuple[int, int, int] | None, builder: Builder) -> tuple[str, ...]:
    """Each way a build step on this Engine can be given GPUs, in words; empty: none.

    ``version`` None (not known) is judged as the oldest Engine, as everywhere else."""
    doors = []
    if version is not None and version >= DEVICE_ENTITLEMENT_SINCE and builder.device is not False:
        doors.append(
            "BuildKit's device entitlement is allowed (Engine 29+ without "
            "builder.entitlements.device: false): a build step can name CDI devices such "
            "as nvidia.com/gpu=all"
        )
    if builder.security_insecure or builder.insecure_flag:
        doors.append(
            "BuildKit's security.insecure entitlement is allowed: a privileged build step "
            "sees every device of the host"
        )
    return tuple(doors)


def native_grpc(version: tuple[int, int, int] | None) -> bool:
    """Does this Engine speak BuildKit's gRPC on its API socket, past every plugin?"""
    return version is not None and version >= NATIVE_GRPC_SINCE


def refusal(method: str, path: str, doors: tuple[str, ...]) -> str:
    """The plugin's answer to a BuildKit upgrade while a door is open."""
    fix = FIX
    if any("insecure" in door for door in doors):
        fix += ", and allow no security.insecure (daemon.json, --allow-insecure-entitlement)"
    return (
        f"gpu-alloc refused {method} {path}: builds on this Engine can be given GPUs that "
        f"no lease covers ({'; '.join(doors)}). Builds without BuildKit still work "
        f"(DOCKER_BUILDKIT=0 docker build); an administrator can close the door: {fix}"
    )
