"""Which GPUs a container really gets: the one function shim, plugin and status share.

Rules
-----
1. Judge what dockerd and the NVIDIA Container Toolkit would do, not how the
   request is spelled: device paths by the node they resolve to, runtimes by
   what the Engine maps their name to, env by the value the toolkit reads.
2. Every way to reach a GPU is a row in a catalogue (`SOURCES`) and yields
   `Grant`s naming the field that caused it, so a denial can name that field.
3. A grant gpu-alloc cannot pin to specific GPUs (``Count: N``, ``all``,
   privileged, a cgroup rule for the whole major, the image's own ENV) is
   ``gpus=None``: it holds the whole inventory.  Fail closed.
4. Only two sources are *leasable*: a device request served by the nvidia
   driver, and the nvidia runtime with an explicit ``NVIDIA_VISIBLE_DEVICES``.
   Those are what the shim rewrites into UUID leases; every other source is
   refused at create and adopted as a claim when found on an existing container.

Theory of operation
-------------------
`of_create` takes a create body already decoded by `gojson` (so keys are
canonical; `decide.decode_create` refuses the top-level HostConfig fields old
API versions read); `of_container` takes ``docker inspect`` output,
whose env already includes the image's.  Both reduce to `_analyse`, which runs
each catalogue row over a `View` of the container and returns an `Access`.
The rows for device requests, the runtime's env, privileged mode, links and
annotations are here; those for devices and cgroup rules in `access_devices`,
those for binds, mounts and volumes in `access_mounts`, and the `View` and
`Ctx` they all share in `access_ctx`.  Filesystem questions go through
`HostFacts`, so the core reads nothing itself and tests hand in their own nodes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from allocator.core.access import joined, powers, socket_binds
from allocator.core.access.access_ctx import VISIBLE as VISIBLE
from allocator.core.access.access_ctx import ContainerOf, Ctx, View, VolumeOf, resolve_ids
from allocator.core.access.access_ctx import env_values as env_values
from allocator.core.access.access_devices import (
    DRM_MAJOR,
    NVIDIA_MAJOR,
    cdi_names,
    cgroup_rules,
    devices,
)
from allocator.core.access.access_mounts import binds
from allocator.core.access.facts import EngineView, HostFacts, Node, Unresolvable
from allocator.core.access.grants import Access, Demand, Refusal
from allocator.core.access.mounts import go_clean
from allocator.core.machine.inventory import Inventory
from allocator.core.rules import power_grants

# The nvidia driver's capability set in dockerd (daemon/nvidia_linux.go): a
# device request with Driver "" goes to nvidia when one of its AND-sets fits.
NVIDIA_CAPS = frozenset(
    {"gpu", "nvidia", "compute", "compat32", "graphics", "utility", "video", "display"}
)
# Driver names that reach NVIDIA GPUs in Engines 20.10 to 29.
NVIDIA_DRIVERS = frozenset({"nvidia", "nvidia.cdi", "nvidia.runtime-hook"})
CDI_DRIVER = "cdi"
# The CDI kind Engine 29 turns an nvidia request's ids into (daemon/devices_nvidia_linux.go).
NVIDIA_GPU_KIND = "nvidia.com/gpu"
RESOURCE = "DOCKER_RESOURCE_"  # swarm's prefix for the generic resources of a task
NONE_VALUES = frozenset({"", "none", "void"})
CDI_ANNOTATION_MARK = "cdi.k8s.io/"


# ---------------------------------------------------------------- catalogue rows


def _device_requests(ctx: Ctx) -> None:
    nvidia_seen = False
    for i, req in enumerate(ctx.view.host_config.get("DeviceRequests") or ()):
        fld = f"HostConfig.DeviceRequests[{i}]"
        if not isinstance(req, Mapping):
            ctx.refuse(fld, "not an object")
            continue
        driver = req.get("Driver") or ""
        caps = _selected_caps(req.get("Capabilities") or ())
        ids = tuple(req.get("DeviceIDs") or ())
        count = req.get("Count") or 0
        if driver == CDI_DRIVER:
            cdi_names(ctx, fld, ids)
            continue
        if driver not in NVIDIA_DRIVERS and not (driver == "" and caps is not None):
            ctx.refuse(
                fld,
                f"device driver '{driver}' with capabilities "
                f"{req.get('Capabilities')} is not one gpu-alloc can vet",
            )
            continue
        nvidia_seen = True
        caps = caps or ("gpu",)
        ctx.env_read = True  # dockerd appends the request's NVIDIA_VISIBLE_DEVICES last
        ids, other_kinds = _nvidia_ids(ids)
        cdi_names(ctx, fld, other_kinds)
        if other_kinds and not ids and not count:
            continue
        if count and ids:
            ctx.refuse(
                fld,
                "sets both Count and DeviceIDs, which dockerd rejects; an unquoted "
                "--gpus device=1,2 does this (the CLI reads the 2 as a count): quote the "
                "list, --gpus '\"device=1,2\"'",
            )
        elif "all" in ids:
            ctx.add(fld, "all GPUs (DeviceIDs all)", None, Demand(all=True, caps=caps))
        elif ids:
            demand = Demand(ids=ids, caps=caps)
            ctx.add(fld, f"DeviceIDs {','.join(ids)}", resolve_ids(ctx, fld, ids), demand)
        elif count < 0:
            ctx.add(fld, "all GPUs (Count -1)", None, Demand(all=True, caps=caps))
        elif count > 0:
            # dockerd turns Count N into indices 0..N-1: pinned by accident, not by intent.
            indices = ",".join(map(str, range(min(count, 8)))) + ",..." * (count > 8)
            what = f"Count {count} (dockerd alone would give GPU indices {indices})"
            ctx.add(fld, what, None, Demand(count=count, caps=caps))
        elif not ctx.engine.count_zero_is_void:
            _hook_env(ctx, fld, "a Count 0 device request")
    if nvidia_seen:
        _swarm_resources(ctx)


def _nvidia_ids(ids: Iterable[Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An nvidia request's ids as the GPUs they name, and the CDI names of other kinds.

    Engine 29 with the toolkit's CDI hook turns each id into ``nvidia.com/gpu=<id>`` but
    passes an id that already holds ``=`` on as the CDI name it is: ``nvidia.com/gpu=all``
    is every GPU, ``nvidia.com/gpu=0`` GPU 0, and another kind is a CDI device of its own.
    The runtime hook hands the same ids to the toolkit, which reads a CDI name alike, so
    they are judged so on every Engine."""
    plain: list[str] = []
    other: list[str] = []
    for ident in map(str, ids):
        kind, eq, dev = ident.partition("=")
        if not eq:
            plain.append(ident)
        elif kind == NVIDIA_GPU_KIND:
            plain.append(dev)
        else:
            other.append(ident)
    return tuple(plain), tuple(other)


def _selected_caps(capabilities: Iterable[Any]) -> tuple[str, ...] | None:
    """The first AND-set the nvidia driver satisfies, as dockerd selects it."""
    for andset in capabilities:
        if isinstance(andset, list) and andset and set(andset) <= NVIDIA_CAPS:
            return tuple(andset)
    return None


def _swarm_resources(ctx: Ctx) -> None:
    """The toolkit's swarm-resource option reads DOCKER_RESOURCE_* before the request.

    Refused at a create, unless it pins the variable to ``void`` (the pin a service's
    tasks carry, and the shim's rewrite adds for ``swarm.kind``: an image's ENV of the
    name then never reaches the toolkit) or names exactly the GPUs the create's own
    ``NVIDIA_VISIBLE_DEVICES`` names (what the shim's rewrite sets on a leased create, so
    that such a toolkit gives it those GPUs): a leasable ask of them, which only a lease
    of exactly them covers.  On an existing container (a swarm task's, given its GPUs by
    swarm's scheduler, or a leased one) it holds the GPUs its value names.  The toolkit reads
    the env as a map, so a variable set twice (the spec's void pin, then what swarm
    appends) is its last value, and one naming void selects nothing.  An entry without
    ``=`` is no variable to the toolkit (it splits each entry at ``=`` and skips the rest)."""
    names = dict.fromkeys(
        e.partition("=")[0] for e in ctx.view.env if e.startswith(RESOURCE) and "=" in e
    )
    for name in names:
        value = env_values(ctx.view.env, name)[-1]
        ids = tuple(v.strip() for v in value.split(",") if v.strip())
        if ctx.strict and value.strip() != "void":
            gpus = _as_visible(ctx, ids)
            if gpus is None:
                ctx.refuse(
                    "Config.Env",
                    f"{name} can select GPUs in the toolkit; set it only to void, or to "
                    f"the GPUs {VISIBLE} names",
                )
            else:
                ctx.add("Config.Env", f"{name}={value}", gpus, Demand(ids=ids))
            continue
        if not ids or "void" in ids:
            continue
        gpus = resolve_ids(ctx, "Config.Env", ids)
        ctx.add("Config.Env", f"{name}={value} (GPUs a swarm task was given)", gpus)


def _as_visible(ctx: Ctx, ids: tuple[str, ...]) -> set[str] | None:
    """The GPUs ``ids`` name when they are exactly those of the create's last
    ``NVIDIA_VISIBLE_DEVICES``; None otherwise, or when either names no GPU by itself."""
    values = env_values(ctx.view.env, VISIBLE)
    visible = tuple(v.strip() for v in values[-1].split(",") if v.strip()) if values else ()
    if not ids or not visible or {"void", "none", "all"} & {*ids, *visible}:
        return None
    gpus = resolve_ids(ctx, "Config.Env", ids)
    return gpus if gpus and gpus == resolve_ids(ctx, "Config.Env", visible) else None


def _hook_env(ctx: Ctx, fld: str, why: str) -> None:
    """The hook runs and dockerd set no NVIDIA_VISIBLE_DEVICES: the env alone decides.

    That is the container's env, then its image's ENV, then the legacy CUDA rule.  At a
    create the image's ENV is unknown, so only a body that pins the variable to none or
    void is safe; the shim's void guard makes any other such create safe (hence
    ``guarded``), which the real socket cannot.
    """
    values = env_values(ctx.view.env, VISIBLE)
    value = values[-1].strip() if values else None
    where = "Config.Env"
    if value is None and not ctx.view.env_complete:
        detail = (
            f"{why} still runs the NVIDIA hook on this Engine, and without {VISIBLE} in "
            f"Config.Env the image's ENV decides which GPUs it gets; set {VISIBLE}=void"
        )
        ctx.add(fld, detail, None, guarded=True)
    elif value is None:
        if _legacy_cuda_image(ctx.view.env):
            ctx.add(fld, f"{why} on a legacy CUDA image without {VISIBLE}: all GPUs", None)
    elif value in NONE_VALUES:
        pass
    elif value == "all":
        ctx.add(fld, f"{why} with {where} {VISIBLE}=all: all GPUs", None, guarded=True)
    else:
        ids = tuple(v.strip() for v in value.split(","))
        gpus = None if any("=" in i or "/" in i for i in ids) else resolve_ids(ctx, fld, ids)
        ctx.add(fld, f"{why} with {where} {VISIBLE}={value}", gpus, guarded=True)
    ctx.env_read = True


def _runtime_env(ctx: Ctx) -> None:
    hc = ctx.view.host_config
    runtime = hc.get("Runtime") or ""
    if not ctx.engine.is_nvidia(runtime):
        return
    if ctx.env_read:
        return  # a device request already set (or judged) what the hook reads
    name = runtime or f"{ctx.engine.default_runtime} (the Engine's default)"
    fld = "Config.Env"
    _swarm_resources(ctx)
    values = env_values(ctx.view.env, VISIBLE)
    if len(values) > 1 and ctx.strict:
        raise Refusal(f"{fld}: {VISIBLE} is set {len(values)} times; set it once")
    if not values:
        if not ctx.view.env_complete:
            # Under the default runtime the create asked for no GPU: the shim's void pin
            # makes it safe (swarm nodes run nvidia as the default); the real socket cannot.
            detail = f"runtime {name} without {VISIBLE}: the image's ENV decides"
            ctx.add(fld, detail, None, guarded=not runtime)
        elif _legacy_cuda_image(ctx.view.env):
            ctx.add(fld, f"runtime {name}, legacy CUDA image without {VISIBLE}: all GPUs", None)
        return
    value = values[-1].strip()
    if value in NONE_VALUES:
        return
    ids = tuple(v.strip() for v in value.split(","))
    if value == "all":
        ctx.add(fld, f"runtime {name} with {VISIBLE}=all", None, Demand(all=True))
    elif any("=" in i or "/" in i for i in ids):
        ctx.refuse(fld, f"{VISIBLE}={value}: CDI names in the env are not leasable")
    else:
        ctx.add(
            fld,
            f"runtime {name} with {VISIBLE}={value}",
            resolve_ids(ctx, fld, ids),
            Demand(ids=ids),
        )


def _legacy_cuda_image(env: Iterable[str]) -> bool:
    """The toolkit's legacy mode (cuda_image.go ``IsLegacy``): a non-empty CUDA_VERSION with
    NVIDIA_REQUIRE_CUDA unset or empty, each read as its last value, means all GPUs."""
    env = list(env)
    cuda = env_values(env, "CUDA_VERSION")
    require = env_values(env, "NVIDIA_REQUIRE_CUDA")
    return bool(cuda and cuda[-1]) and not (require and require[-1])


def _privileged(ctx: Ctx) -> None:
    if ctx.view.host_config.get("Privileged"):
        ctx.add("HostConfig.Privileged", "privileged mode opens every device", None)


def _powers(ctx: Ctx) -> None:
    """Powers over the host outside the allow-list (`powers`) that no grant of the policy
    covers for the container's owner: such a container may be root on the host, where it
    reaches every GPU and every file gpu-alloc keeps."""
    hc = ctx.view.host_config
    granted = partial(power_grants.may_use, ctx.host, ctx.socket_owner)
    found = powers.refused(
        hc, powers.Ask(granted, partial(power_grants.apparmor, ctx.host), ctx.strict)
    )
    if hc.get("Devices") or hc.get("DeviceCgroupRules"):
        majors = frozenset({NVIDIA_MAJOR, DRM_MAJOR}) | ctx.dynamic_majors()
        found += powers.devices_refused(hc, partial(_node, ctx), ctx.host.walk, majors, granted)
    for f in found:
        ctx.add(f.field, f.text(), None, power=True)


def _node(ctx: Ctx, path: str) -> Node | None:
    """The node ``path`` resolves to as dockerd resolves it; None where it cannot be
    resolved (the device row refuses that)."""
    try:
        return ctx.host.node(ctx.host.resolve(path))
    except Unresolvable:
        return None


def _links(ctx: Ctx) -> None:
    """dockerd writes a legacy link's env at start, before Config.Env: ``ALIAS_NAME=...``
    and the like, the alias upper-cased.  An alias with ``=`` in it makes a variable of any
    name, such as ``NVIDIA_VISIBLE_DEVICES``, that no Config.Env shows, and a bare name in
    Config.Env can unset the one that would have replaced it."""
    for i, link in enumerate(ctx.view.host_config.get("Links") or ()):
        # No container name holds "=": one anywhere is the alias's, however dockerd then
        # cleans it ("a=b/." is "a=b"; an inspect shows "/child:/parent/a=b").
        if "=" in str(link):
            alias = posixpath.basename(go_clean("/" + (str(link).partition(":")[2] or str(link))))
            variable = alias.split("=")[0].upper().replace("-", "_")
            ctx.refuse(
                f"HostConfig.Links[{i}]",
                f"link alias '{alias}' holds '=', so dockerd makes an environment variable "
                f"of it ({variable}) that can select GPUs in the NVIDIA hook; give the link "
                "an alias without '='",
            )


def _annotations(ctx: Ctx) -> None:
    for key in ctx.view.host_config.get("Annotations") or {}:
        if CDI_ANNOTATION_MARK in key:
            ctx.add(f"HostConfig.Annotations[{key}]", "CDI annotation injects devices", None)


def _joined(ctx: Ctx) -> None:
    """Another container's PID, IPC or network namespace, and with it its GPUs."""

    def reach(other: Mapping[str, Any]) -> Access:
        look, on_chain = ctx.container_of, other.get("Id")

        def beyond(ref: str) -> list[Mapping[str, Any]]:
            # A container already on the chain of joins is judged there (dockerd stores
            # a join by name where its container did not exist yet, so chains may loop).
            return [c for c in look(ref) if c.get("Id") != on_chain] if look else []

        return _analyse(_inspected(other), ctx.engine, ctx.inventory, ctx.host, False,
                        beyond if look else None, ctx.volume_of)  # fmt: skip

    joined.namespaces(ctx, reach)


# The catalogue: each row reads one family of fields.  Order matters only for
# _runtime_env, which must see whether a device request already set the env.
SOURCES: tuple[Callable[[Ctx], None], ...] = (
    _device_requests,
    _runtime_env,
    _privileged,
    _powers,
    devices,
    cgroup_rules,
    binds,
    _joined,
    _links,
    _annotations,
)


def _analyse(
    view: View,
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    strict: bool,
    container_of: ContainerOf | None = None,
    volume_of: VolumeOf | None = None,
    socket_owner: str = "",
) -> Access:
    ctx = Ctx(view, engine, inventory, host, strict, container_of, volume_of)
    ctx.socket_owner = socket_owner
    for source in SOURCES:
        source(ctx)
    return Access(tuple(ctx.grants))


def of_create(
    body: Mapping[str, Any],
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    container_of: ContainerOf | None = None,
    volume_of: VolumeOf | None = None,
) -> Access:
    view = View(
        env=tuple(str(e) for e in body.get("Env") or ()),
        env_complete=False,
        host_config=body.get("HostConfig") or {},
        volumes=tuple(body.get("Volumes") or ()),
    )
    owner = socket_binds.labelled(body)  # the shim's: the verdict refuses one it did not mark
    return _analyse(view, engine, inventory, host, True, container_of, volume_of, owner)


def of_container(
    inspect: Mapping[str, Any],
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    volume_of: VolumeOf | None = None,
    owner: str = "",
    container_of: ContainerOf | None = None,
) -> Access:
    """``owner``: whose gpu-alloc recorded the container to be (its lease's, its
    creator's), for `socket_binds`; never read from its labels, which an image sets.
    ``container_of``: where given, the namespaces it joins are judged, by the full ids
    dockerd stored at its create (`joined`); a start's judgment needs them."""
    view = _inspected(inspect)
    return _analyse(view, engine, inventory, host, False, container_of, volume_of, owner)


def _inspected(inspect: Mapping[str, Any]) -> View:
    """The `View` of an existing container, from its inspect."""
    config = inspect.get("Config") or {}
    return View(
        env=tuple(config.get("Env") or ()),
        env_complete=True,
        host_config=inspect.get("HostConfig") or {},
        volumes=tuple(config.get("Volumes") or ()),
        mount_points=tuple(
            (str(m.get("Source") or ""), str(m.get("Destination") or ""), m.get("RW") is False)
            for m in inspect.get("Mounts") or ()
            if m.get("Type") == "bind"
        ),
    )
