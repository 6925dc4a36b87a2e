"""The canonical create body the shim forwards, and nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from allocator.core.access.access import VISIBLE
from allocator.core.api import labels
from allocator.core.machine.cpus import Placed, format_list

CUDA_ORDER = "CUDA_DEVICE_ORDER"


def rewrite(
    spec: dict[str, Any],
    uuids: Sequence[str],
    label: str | None,
    caps: Sequence[str] = ("gpu",),
    placed: Placed | None = None,
    swarm_variable: str = "DOCKER_RESOURCE_GPU",
) -> dict[str, Any]:
    """The canonical body the shim forwards: UUID device request, guard env, lease label.

    Without GPUs (``label`` None) only the guard is added: ``void`` keeps an image's own
    ``NVIDIA_VISIBLE_DEVICES`` from reaching any GPU should a hook ever run.  A leased
    container gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless it sets one, so CUDA numbers
    its GPUs as ``nvidia-smi`` does, and the cores and memory `placed` with its GPUs.
    ``swarm_variable`` (``DOCKER_RESOURCE_<swarm.kind>``) is what a toolkit configured with
    ``swarm-resource`` reads instead of ``NVIDIA_VISIBLE_DEVICES`` whenever it is set, and
    an image's ENV may set it: a leased container's names its GPUs, as its
    ``NVIDIA_VISIBLE_DEVICES`` does; any other is pinned to ``void`` unless the body sets
    it, so its start is judged on the pin, not the image's value.
    """
    out = dict(spec)
    hc = dict(out.get("HostConfig") or {})
    own_env = (VISIBLE + "=",) if label is None else (VISIBLE + "=", swarm_variable + "=")
    env = [e for e in (out.get("Env") or ()) if not str(e).startswith(own_env)]
    own = labels.strip(out.get("Labels"))
    binder = (out.get("Labels") or {}).get(labels.ENGINE_SOCKET)
    # the shim's own, set after the client's were stripped (core/judging/socket_binds.py)
    if binder:
        own[labels.ENGINE_SOCKET] = binder
    if label is None:
        env.append(f"{VISIBLE}=void")
    else:
        env.append(f"{VISIBLE}={','.join(uuids)}")
        env.append(f"{swarm_variable}={','.join(uuids)}")
        if not any(str(e).startswith(CUDA_ORDER + "=") for e in env):
            env.append(f"{CUDA_ORDER}=PCI_BUS_ID")
        if placed is not None:
            hc.update(_resources(placed))
        # Always set, so that no image's label of the name speaks for this container.
        own[labels.PLACED] = _placed_label(placed)
        own[labels.LEASE] = label
        if hc.get("DeviceRequests"):
            hc["DeviceRequests"] = [
                {
                    "Driver": "nvidia",
                    "Count": 0,
                    "DeviceIDs": list(uuids),
                    "Capabilities": [list(caps)],
                    "Options": {},
                }
            ]
    if not any(str(e).startswith(swarm_variable + "=") for e in env):
        env.append(f"{swarm_variable}=void")
    out["Env"] = env
    out["Labels"] = own
    if hc or "HostConfig" in out:
        out["HostConfig"] = hc
    return out


def _placed_label(placed: Placed | None) -> str:
    if placed is None:
        return ""
    return ",".join(what for what, has in (("cpus", placed.cpus), ("memory", placed.memory)) if has)


def _resources(placed: Placed) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if placed.cpus:
        fields["CpusetCpus"] = format_list(placed.cpus)
    if placed.memory:
        fields["Memory"] = placed.memory
        fields["CpusetMems"] = format_list(placed.mems)
    return fields


def strip_labels(spec: dict[str, Any]) -> dict[str, Any]:
    """Client-supplied labels under gpu-alloc's prefix are never trusted: drop them."""
    given = spec.get("Labels")
    if not isinstance(given, dict) or not any(k.startswith(labels.PREFIX) for k in given):
        return spec
    return {**spec, "Labels": labels.strip(given)}
