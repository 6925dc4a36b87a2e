"""Swarm services on a manager: what their tasks could reach, judged before swarm runs them.

A task container is created by the worker's dockerd in-process: no authorization
plugin ever sees it.  What the plugin does see is the service's spec, in
``POST /services/create`` and ``POST /services/{id}/update`` on a manager, and that
spec is all a task will be.  So the spec is judged here, once, for every node:

1. The only GPU access a service may have is a generic-resource reservation
   (``TaskTemplate.Resources.Reservations.GenericResources``): swarm's scheduler claims
   the UUIDs per task, each to one task at a time, and hands them to the task as
   ``DOCKER_RESOURCE_<KIND>``, which the NVIDIA runtime reads (its ``swarm-resource``).
2. On swarm nodes nvidia is the default runtime, so a task's env alone would select
   GPUs, and dockerd merges the image's ENV under it: the spec must pin
   ``NVIDIA_VISIBLE_DEVICES=void`` and ``DOCKER_RESOURCE_<KIND>=void`` (the shim adds
   both: `pin`), so that an image's ENV selects nothing, and may not set other
   ``DOCKER_RESOURCE_*`` or the toolkit's other device-selecting variables.  The pins
   never hide the reservation: the toolkit reads the swarm variable before
   ``NVIDIA_VISIBLE_DEVICES``, and swarm appends its value after the spec's, which the
   toolkit, reading the env as a map, takes.
3. The task's mounts are judged by the create catalogue (`access.of_create`), as a
   create with those mounts on this host would be, and its secrets' and configs' files
   (bind mounts too) by where they go; its capabilities, sysctls and security options
   by the allow-list of powers (`powers`) as its owner's create's; plugin tasks, and
   keys a newer Engine may read are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from allocator.core.access import access, power_grants, powers
from allocator.core.access.access_ctx import VolumeOf
from allocator.core.access.access_mounts import SENTINEL_MOUNT_DIR
from allocator.core.access.facts import EngineView, HostFacts
from allocator.core.access.grants import Refusal
from allocator.core.access.mounts import go_clean, within
from allocator.core.api import gojson, labels
from allocator.core.api.service_fields import CONTAINER_SPEC_KEYS, SERVICE_SPEC, TASK_SPEC_KEYS
from allocator.core.judging import socket_binds
from allocator.core.machine.inventory import Inventory

DEFAULT_KIND = "gpu"  # DOCKER_RESOURCE_GPU: what the toolkit's swarm-resource example reads
PIN = f"{access.VISIBLE}=void"
SPEC = "TaskTemplate.ContainerSpec"
RESOURCE_PREFIX = access.RESOURCE
# The toolkit's variables that select devices besides NVIDIA_VISIBLE_DEVICES (MIG control
# nodes, IMEX channels, GPUDirect and fabric devices).  NVIDIA_DRIVER_CAPABILITIES and
# NVIDIA_REQUIRE_* only shape what the granted GPUs come with.
DEVICE_VARIABLES = frozenset(
    {
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
        "NVIDIA_GDRCOPY",
        "NVIDIA_GDS",
        "NVIDIA_MOFED",
        "NVIDIA_NVSWITCH",
    }
)


def decode(body: bytes) -> dict[str, Any]:
    """The spec as dockerd decodes it; raises `gojson.BodyError`."""
    return gojson.decode(body, SERVICE_SPEC) or {}


def container_spec(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return (spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}


def resource_variable(kind: str) -> str:
    """The variable swarm sets to the task's GPUs of ``kind`` (swarmkit upper-cases it)."""
    return RESOURCE_PREFIX + kind.upper()


def resource_pin(kind: str) -> str:
    return f"{resource_variable(kind)}=void"


def pin(spec: Mapping[str, Any], kind: str = DEFAULT_KIND) -> dict[str, Any]:
    """The spec with ``NVIDIA_VISIBLE_DEVICES=void`` and ``DOCKER_RESOURCE_<KIND>=void``
    added to its tasks' env where it sets none (a value of its own stays, to be judged and
    refused with the fix) and without labels under gpu-alloc's prefix: the shim's rewrite
    of every service it forwards."""
    out = dict(spec)
    template = dict(out.get("TaskTemplate") or {})
    if template.get("PluginSpec") or template.get("NetworkAttachmentSpec"):
        return out  # no container to pin: refused as it is
    cs = dict(template.get("ContainerSpec") or {})
    env = [str(e) for e in cs.get("Env") or ()]
    if not access.env_values(env, access.VISIBLE):
        env.append(PIN)
    if not access.env_values(env, resource_variable(kind)):
        env.append(resource_pin(kind))
    cs["Env"] = env
    if cs.get("Labels"):
        cs["Labels"] = labels.strip(cs["Labels"])
    template["ContainerSpec"] = cs
    out["TaskTemplate"] = template
    return out


def refusal(
    spec: Mapping[str, Any],
    kind: str,
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    volume_of: VolumeOf | None = None,
    socket_owner: str = "",
) -> str | None:
    """Why the service may not run, in words that say what to do instead; None when its
    tasks reach GPUs only through a reservation of ``kind``.  ``socket_owner``: whose
    the shim marked the spec to be, whom the policy may let bind the Engine's socket."""
    template = spec.get("TaskTemplate") or {}
    odd = sorted(set(template) - TASK_SPEC_KEYS) + [
        f"ContainerSpec.{k}" for k in sorted(set(container_spec(spec)) - CONTAINER_SPEC_KEYS)
    ]
    if odd:
        return (
            f"TaskTemplate.{odd[0]} is not a field gpu-alloc knows, and a newer Engine may "
            "give the tasks device access by it; leave it out"
        )
    if template.get("PluginSpec") or str(template.get("Runtime") or "container") != "container":
        return (
            "plugin and attachment tasks install or run without a container spec gpu-alloc "
            "can judge; run a container service, or install the plugin on each node with "
            "'docker plugin install', whose privileges gpu-alloc checks"
        )
    cs = container_spec(spec)
    env = [str(e) for e in cs.get("Env") or ()]
    return (
        _variables(env, kind)
        or _powers(cs, socket_owner, host)
        or _labels(cs.get("Labels") or {})
        or _file_targets(cs)
        or _catalogue(cs, engine, inventory, host, volume_of, socket_owner)
        or _pin(env, kind)  # last: the one refusal the shim fixes by itself
    )


def _variables(env: Sequence[str], kind: str) -> str | None:
    names = [str(e).split("=", 1)[0] for e in env if str(e) != resource_pin(kind)]
    own = next((n for n in names if n.startswith(RESOURCE_PREFIX)), None)
    if own is not None:
        return (
            f"{SPEC}.Env sets {own}, which the NVIDIA runtime reads as the GPUs swarm gave "
            f"the task; reserve GPUs instead (--generic-resource {kind}=N, or Compose's "
            "deploy.resources.reservations.generic_resources)"
        )
    toolkit = next((n for n in names if n in DEVICE_VARIABLES), None)
    if toolkit is not None:
        return f"{SPEC}.Env sets {toolkit}, which makes the NVIDIA runtime add devices; remove it"
    return None


def _pin(env: Sequence[str], kind: str) -> str | None:
    return _pinned(env, access.VISIBLE, kind) or _pinned(env, resource_variable(kind), kind)


def _pinned(env: Sequence[str], name: str, kind: str) -> str | None:
    """Why ``name`` is not pinned to void, once, in the spec's env; None when it is."""
    values = access.env_values(env, name)
    if values == ["void"]:
        return None
    reserve = f"reserve GPUs with --generic-resource {kind}=N"
    if not values:
        return (
            f"{SPEC}.Env does not set {name}=void: nvidia is the default runtime on swarm "
            f"nodes, so the image's ENV would decide which GPUs its tasks get; add --env "
            f"{name}=void and {reserve}, or create the service through the gpu-alloc "
            "socket, which adds the pins"
        )
    said = f"sets {name}={values[-1]}"
    if len(values) > 1:
        said = f"sets {name} {len(values)} times"
    return (
        f"{SPEC}.Env {said}, which would give its tasks GPUs no scheduler reserved; set it "
        f"once, to void, and {reserve}"
    )


def _powers(cs: Mapping[str, Any], socket_owner: str, host: HostFacts) -> str | None:
    """The spec's powers over its tasks' hosts, judged by the allow-list (`powers`) as a
    create's of its owner's: a task reaches every node's GPUs by them."""
    config = {
        "CapAdd": cs.get("CapabilityAdd"),
        "Sysctls": cs.get("Sysctls"),
        "OomScoreAdj": cs.get("OomScoreAdj"),
        "SecurityOpt": _security_opts(cs.get("Privileges") or {}),
    }
    granted = partial(power_grants.may_use, host, socket_owner)
    found = powers.refused(config, powers.Ask(granted, partial(power_grants.apparmor, host)))
    if not found:
        return None
    first = found[0]
    fld = {"HostConfig.CapAdd": "CapabilityAdd", "HostConfig.SecurityOpt": "Privileges"}.get(
        first.field, first.field.removeprefix("HostConfig.")
    )
    return f"{SPEC}.{fld}: {first.text()}"


def _security_opts(privileges: Mapping[str, Any]) -> list[str]:
    """A spec's ``Privileges`` as the security options swarm gives its tasks."""
    opts = []
    if (privileges.get("Seccomp") or {}).get("Mode") == "unconfined":
        opts.append("seccomp=unconfined")
    if (privileges.get("AppArmor") or {}).get("Mode") == "disabled":
        opts.append("apparmor=unconfined")
    if (privileges.get("SELinuxContext") or {}).get("Disable"):
        opts.append("label=disable")
    return opts


# Where a secret's or config's file goes when its name is relative (moby's
# getSecretTargetPath, getConfigTargetPath).
FILE_BASES = (("Secrets", "/run/secrets"), ("Configs", "/"))


def _file_targets(cs: Mapping[str, Any]) -> str | None:
    """A secret or config is a bind mount at its file's name: one in the toolkit's volume
    list of devices selects GPUs, as such a mount would (`access_mounts`)."""
    for key, base in FILE_BASES:
        for i, ref in enumerate(cs.get(key) or ()):
            name = str(((ref or {}).get("File") or {}).get("Name") or "")
            target = go_clean(name if name.startswith("/") else f"{base}/{name}")
            if name and within(target, SENTINEL_MOUNT_DIR):
                return (
                    f"{SPEC}.{key}[{i}] is mounted at {target}, where the NVIDIA toolkit reads "
                    "a list of GPUs to give the task; mount it elsewhere"
                )
    return None


def _labels(given: Mapping[str, str]) -> str | None:
    own = next((k for k in given if k.startswith(labels.PREFIX)), None)
    if own is None:
        return None
    return f"{SPEC}.Labels sets {own}: labels under {labels.PREFIX} are gpu-alloc's own; remove it"


def _catalogue(
    cs: Mapping[str, Any],
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    volume_of: VolumeOf | None,
    socket_owner: str = "",
) -> str | None:
    """The task's mounts as a create's on this host, through the one catalogue of effective
    access, under the nvidia default runtime and with the env pinned (`_pin` judges it)."""
    nvidia = replace(
        engine, default_runtime="nvidia", nvidia_runtimes=engine.nvidia_runtimes | {"nvidia"}
    )
    body = {"Env": [PIN], "HostConfig": {"Mounts": cs.get("Mounts") or []}}
    if socket_owner:
        body = socket_binds.labelled_as(body, socket_owner)
    try:
        grants = access.of_create(body, nvidia, inventory, host, None, volume_of)
    except Refusal as e:
        return _spec_field(str(e))
    if grants.none:
        return None
    first = grants.grants[0]
    return (
        f"{_spec_field(first.describe())}; a task may reach GPUs only through its "
        "generic-resource reservation"
    )


def _spec_field(text: str) -> str:
    """A catalogue message with the create's field names as the service spec spells them."""
    return text.replace("HostConfig.Mounts", f"{SPEC}.Mounts").replace("Config.Env", f"{SPEC}.Env")
