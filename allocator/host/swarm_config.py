"""The ``swarm:`` section of the config: this node's GPUs given to Docker Swarm.

GPUs given to swarm are declared to dockerd as generic resources of ``kind`` (daemon.json's
``node-generic-resources``), handed to tasks by swarm's scheduler as
``DOCKER_RESOURCE_<KIND>``, and never leased locally.  An empty ``gpus`` (the default)
gives swarm nothing: the node may still be a manager, or run tasks without GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from allocator.core.judging.service_marks import CHARGE
from allocator.core.judging.services import DEFAULT_KIND

KEYS: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "gpus": list,
    "toolkit_config": str,
    "engine_socket_services": (str, dict),
}
# A GPU service made on dockerd's own socket, which names no owner: refused, or (trusted)
# root's, counted for nobody, as services were before gpu-alloc kept swarm limits, or
# ({charge: <user>}) counted for the user the policy names, within their limit.
ENGINE_SOCKET_SERVICES = ("refuse", "trusted", "{charge: <user>}")
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class SwarmConfig:
    kind: str = DEFAULT_KIND
    gpus: tuple[str, ...] = ()  # UUIDs of this node's GPUs that swarm schedules
    toolkit_config: str = TOOLKIT_CONFIG  # where the toolkit reads its swarm-resource
    engine_socket_services: str = "refuse"  # or "trusted", "charge": `ENGINE_SOCKET_SERVICES`
    engine_socket_owner: str = ""  # whom they count for, with "charge"

    @property
    def variable(self) -> str:
        """The env variable swarm sets in a task, and the toolkit's ``swarm-resource``."""
        return "DOCKER_RESOURCE_" + self.kind.upper()

    @property
    def configured(self) -> bool:
        """This node gives GPUs to swarm (and so runs nvidia as the default runtime)."""
        return bool(self.gpus)


def parse(raw: dict[str, Any]) -> SwarmConfig | tuple[str, str]:
    """The section, or (key, why) for the first bad value."""
    kind = raw.get("kind", DEFAULT_KIND)
    if not _KIND.match(kind):
        return "swarm.kind", (
            f"'{kind}' must be letters, digits and '_' (swarm sets DOCKER_RESOURCE_ and the "
            "kind upper-cased, which must be a plain variable name)"
        )
    gpus = raw.get("gpus", [])
    if not all(isinstance(g, str) and g.startswith(("GPU-", "MIG-")) for g in gpus):
        return "swarm.gpus", "must be a list of GPU UUIDs (GPU-...), as nvidia-smi -L shows"
    if len(set(gpus)) != len(gpus):
        return "swarm.gpus", "lists a GPU twice"
    path = raw.get("toolkit_config", TOOLKIT_CONFIG)
    if not path.startswith("/"):
        return "swarm.toolkit_config", f"must be an absolute path, got '{path}'"
    own = raw.get("engine_socket_services", "refuse")
    charged = own.get("charge") if isinstance(own, dict) and set(own) == {"charge"} else None
    if isinstance(charged, str) and charged:
        return SwarmConfig(kind, tuple(gpus), path, CHARGE, charged)
    if own not in ENGINE_SOCKET_SERVICES[:2]:
        return "swarm.engine_socket_services", f"must be one of {', '.join(ENGINE_SOCKET_SERVICES)}"
    return SwarmConfig(kind, tuple(gpus), path, own)
