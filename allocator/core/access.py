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
Filesystem questions go through `HostFacts`, so the core reads nothing itself
and tests hand in their own nodes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.core import gonum, mounts
from allocator.core.facts import EngineView, HostFacts, Node, Unresolvable
from allocator.core.grants import Access, Demand, Grant, Refusal
from allocator.core.inventory import Inventory
from allocator.core.mounts import exposure, go_clean, within

# The nvidia driver's capability set in dockerd (daemon/nvidia_linux.go): a
# device request with Driver "" goes to nvidia when one of its AND-sets fits.
NVIDIA_CAPS = frozenset(
    {"gpu", "nvidia", "compute", "compat32", "graphics", "utility", "video", "display"}
)
# Driver names that reach NVIDIA GPUs in Engines 20.10 to 29.
NVIDIA_DRIVERS = frozenset({"nvidia", "nvidia.cdi", "nvidia.runtime-hook"})
CDI_DRIVER = "cdi"
NVIDIA_MAJOR = 195  # /dev/nvidia0..N (minor = GPU minor), 255 nvidiactl, 254 modeset
DRM_MAJOR = 226  # /dev/dri/card*, renderD*
NVIDIA_CONTROL_MINORS = frozenset({254, 255})
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
NONE_VALUES = frozenset({"", "none", "void"})
# The toolkit's volume-mount device list (accept-nvidia-visible-devices-as-volume-mounts).
SENTINEL_MOUNT_DIR = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_MARK = "cdi.k8s.io/"
# The only filesystem whose device nodes no container can add or swap (not /dev/shm).
DEVICE_FS = "devtmpfs"


MountsOf = Callable[[str], Iterable[tuple[str, str]] | None]  # container -> (source, target)
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
class _Ctx:
    view: View
    engine: EngineView
    inventory: Inventory
    host: HostFacts
    strict: bool  # True for creates: malformed input is a Refusal, not a claim
    mounts_of: MountsOf | None = None  # for VolumesFrom: another container's bind mounts
    volume_of: VolumeOf | None = None  # a named volume's driver and options, from the Engine
    grants: list[Grant] = field(default_factory=list)

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
    ) -> None:
        pinned = None if gpus is None else frozenset(gpus)
        self.grants.append(Grant(fld, detail, pinned, demand, guarded))

    def refuse(self, fld: str, why: str) -> None:
        if self.strict:
            raise Refusal(f"{fld}: {why}")
        self.add(fld, why, None)


# ---------------------------------------------------------------- catalogue rows


def _device_requests(ctx: _Ctx) -> None:
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
            _cdi_names(ctx, fld, ids)
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
            ctx.add(fld, f"DeviceIDs {','.join(ids)}", _resolve_ids(ctx, fld, ids), demand)
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


def _selected_caps(capabilities: Iterable[Any]) -> tuple[str, ...] | None:
    """The first AND-set the nvidia driver satisfies, as dockerd selects it."""
    for andset in capabilities:
        if isinstance(andset, list) and andset and set(andset) <= NVIDIA_CAPS:
            return tuple(andset)
    return None


def _resolve_ids(ctx: _Ctx, fld: str, ids: Iterable[str]) -> set[str] | None:
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


def _swarm_resources(ctx: _Ctx) -> None:
    """The toolkit's swarm-resource option reads DOCKER_RESOURCE_* before the request."""
    for entry in ctx.view.env:
        if entry.startswith("DOCKER_RESOURCE_"):
            ctx.refuse("Config.Env", f"{entry.split('=')[0]} can select GPUs in the toolkit")


def _hook_env(ctx: _Ctx, fld: str, why: str) -> None:
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
        gpus = None if any("=" in i or "/" in i for i in ids) else _resolve_ids(ctx, fld, ids)
        ctx.add(fld, f"{why} with {where} {VISIBLE}={value}", gpus, guarded=True)
    ctx.env_read = True


def _runtime_env(ctx: _Ctx) -> None:
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
            ctx.add(fld, f"runtime {name} without {VISIBLE}: the image's ENV decides", None)
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
            _resolve_ids(ctx, fld, ids),
            Demand(ids=ids),
        )


def _legacy_cuda_image(env: Iterable[str]) -> bool:
    """The toolkit's legacy mode: CUDA_VERSION without NVIDIA_REQUIRE_CUDA means all GPUs."""
    names = {e.split("=", 1)[0] for e in env}
    return "CUDA_VERSION" in names and "NVIDIA_REQUIRE_CUDA" not in names


def env_values(env: Iterable[str], name: str) -> list[str]:
    prefix = name + "="
    return [e[len(prefix) :] for e in env if e.startswith(prefix)]


def _privileged(ctx: _Ctx) -> None:
    if ctx.view.host_config.get("Privileged"):
        ctx.add("HostConfig.Privileged", "privileged mode opens every device", None)


def _devices(ctx: _Ctx) -> None:
    for i, dev in enumerate(ctx.view.host_config.get("Devices") or ()):
        fld = f"HostConfig.Devices[{i}]"
        path = str((dev or {}).get("PathOnHost") or "")
        if _is_cdi_name(path):
            _cdi_names(ctx, fld, (path,))
            continue
        if not path.startswith("/"):
            ctx.refuse(fld, f"PathOnHost '{path}' is not an absolute path")
            continue
        try:
            real = ctx.host.resolve(path)
        except Unresolvable as e:
            ctx.refuse(fld, f"PathOnHost {path} cannot be judged: {e}")
            continue
        if ctx.strict and real != posixpath.normpath(path):
            raise Refusal(
                f"{fld}: PathOnHost {path} is a link to {real}; name the device node itself"
            )
        node = ctx.host.node(real)
        if node is None:
            ctx.refuse(fld, f"PathOnHost {path} does not exist on this host")
            continue
        on = mounts.mount_of(list(ctx.host.mounts()), real)
        if on is None or on.fstype != DEVICE_FS:
            # dockerd reads the path again at every start, and at every restart its restart
            # policy makes without asking anyone: only the kernel's /dev stays as checked.
            ctx.refuse(
                fld,
                f"PathOnHost {path} is not on the host's {DEVICE_FS} (/dev), and a device path "
                "elsewhere can change after gpu-alloc checks it; name a device node under /dev",
            )
            continue
        if node.kind == "dir":
            for sub in sorted(ctx.host.walk(real)):
                _device_node(ctx, fld, sub, ctx.host.node(sub))
        else:
            _device_node(ctx, fld, path, node)


def _device_node(ctx: _Ctx, fld: str, path: str, node: Node | None) -> None:
    if node is None or node.kind != "chr":
        return
    major, minor = node.major, node.minor
    if major == NVIDIA_MAJOR and minor not in NVIDIA_CONTROL_MINORS:
        gpu = ctx.inventory.by_minor(minor)
        ctx.add(fld, f"device {path} (nvidia {major}:{minor})", None if gpu is None else [gpu.uuid])
    elif major == NVIDIA_MAJOR or major in ctx.dynamic_majors():
        ctx.add(fld, f"NVIDIA control device {path} ({major}:{minor})", None)
    elif major == DRM_MAJOR:
        bus = ctx.host.drm_bus_id(minor)
        gpu = next((g for g in ctx.inventory.gpus if bus and _same_bus(g.pci_bus_id, bus)), None)
        ctx.add(fld, f"DRM device {path} ({major}:{minor})", None if gpu is None else [gpu.uuid])


def _same_bus(nvml_id: str, sysfs_id: str) -> bool:
    a, b = nvml_id.lower(), sysfs_id.lower()
    return bool(a) and (a == b or a.endswith(b) or b.endswith(a[-12:]))


def _is_cdi_name(name: str) -> bool:
    kind, eq, _ = name.partition("=")
    return bool(eq) and "/" in kind and not name.startswith("/")


def _cdi_names(ctx: _Ctx, fld: str, names: Iterable[str]) -> None:
    for name in names:
        kind, _, dev = name.partition("=")
        if "nvidia" not in kind and "gpu" not in kind:
            ctx.refuse(fld, f"CDI device '{name}' is not one gpu-alloc can vet")
            continue
        ctx.add(fld, f"CDI device {name}", _resolve_ids(ctx, fld, [dev]) if dev != "all" else None)


_CGROUP_TYPES = ("a", "c")  # "b" rules are for block devices: no GPU is one


def _cgroup_rules(ctx: _Ctx) -> None:
    """Each rule by the numbers dockerd parses from it (``0195`` is 195), not its spelling."""
    rules = ctx.view.host_config.get("DeviceCgroupRules") or ()
    if not rules:
        return
    majors = {NVIDIA_MAJOR, DRM_MAJOR, gonum.ANY} | set(ctx.dynamic_majors())
    for i, rule in enumerate(rules):
        fld = f"HostConfig.DeviceCgroupRules[{i}]"
        try:
            kind, major, minor, _ = gonum.cgroup_rule(str(rule))
        except gonum.NumError:
            ctx.refuse(fld, f"rule '{rule}' is not of the form 'c MAJOR:MINOR rwm'")
            continue
        if kind == "a" or (kind in _CGROUP_TYPES and major in majors):
            gpu = None
            if major == NVIDIA_MAJOR and minor not in (gonum.ANY, *NVIDIA_CONTROL_MINORS):
                gpu = ctx.inventory.by_minor(minor)
            ctx.add(
                fld,
                f"device cgroup rule '{rule}' opens GPU devices",
                None if gpu is None else [gpu.uuid],
            )


def _binds(ctx: _Ctx) -> None:
    hc = ctx.view.host_config
    for i, bind in enumerate(hc.get("Binds") or ()):
        fld = f"HostConfig.Binds[{i}]"
        src, _, rest = str(bind).partition(":")
        dst, _, mode = rest.partition(":")
        read_only = "ro" in mode.split(",")
        if src.startswith("/"):
            _mount(ctx, fld, src, dst, read_only)
            continue
        _mount(ctx, fld, "", dst)
        if src:
            _named_volume(ctx, fld, src, read_only)
    for i, m in enumerate(hc.get("Mounts") or ()):
        m = m or {}
        fld = f"HostConfig.Mounts[{i}]"
        kind, dst = str(m.get("Type") or ""), str(m.get("Target") or "")
        read_only = m.get("ReadOnly") is True
        if kind != "volume":
            src = str(m.get("Source") or "") if kind == "bind" else ""
            _mount(ctx, fld, src, dst, read_only)
            continue
        driver = (m.get("VolumeOptions") or {}).get("DriverConfig") or {}
        if str(driver.get("Name") or "") in mounts.LOCAL_DRIVERS:
            opts = driver.get("Options") or {}
            _volume(ctx, f"{fld}.VolumeOptions.DriverConfig.Options", opts, read_only)
        if m.get("Source"):  # an existing volume keeps its own options; the given are unused
            _named_volume(ctx, fld, str(m["Source"]), read_only)
        _mount(ctx, fld, "", dst)
    for vol in ctx.view.volumes:
        _mount(ctx, "Config.Volumes", "", vol)
    for src, dst, read_only in ctx.view.mount_points:
        _mount(ctx, "Mounts", src, dst, read_only)
    if ctx.strict:
        _volumes_from(ctx)


def _named_volume(ctx: _Ctx, fld: str, name: str, read_only: bool) -> None:
    """A volume used by name is mounted with the options it was created with."""
    if ctx.volume_of is None:
        if ctx.strict:
            raise Refusal(f"{fld}: the options of volume '{name}' cannot be checked here")
        return
    found = ctx.volume_of(name)  # None: dockerd makes it now, with no options
    if found is not None and found[0] in mounts.LOCAL_DRIVERS:
        _volume(ctx, f"{fld} (volume {name})", found[1], read_only)


def _volume(ctx: _Ctx, fld: str, options: Mapping[str, str], read_only: bool) -> None:
    """A local volume, judged by the mount its options make."""
    made = mounts.local_volume(options)
    if made.refusal:
        ctx.refuse(fld, made.refusal)
    elif made.source:
        _mount(ctx, fld, made.source, "", read_only or made.read_only)


def _volumes_from(ctx: _Ctx) -> None:
    """--volumes-from copies another container's mounts, binds of /dev included."""
    for i, ref in enumerate(ctx.view.host_config.get("VolumesFrom") or ()):
        fld = f"HostConfig.VolumesFrom[{i}]"
        name = str(ref).split(":")[0]
        if ctx.mounts_of is None:
            raise Refusal(f"{fld}: the mounts of '{name}' cannot be checked here")
        for src, dst in ctx.mounts_of(name) or ():  # None: no such container, dockerd says so
            _mount(ctx, fld, src, dst)


def _mount(ctx: _Ctx, fld: str, src: str, dst: str, read_only: bool = False) -> None:
    if dst and within(dst, SENTINEL_MOUNT_DIR):
        ctx.add(fld, f"mount at {dst} selects GPUs through the toolkit's volume list", None)
    if not src:
        return
    try:
        real = ctx.host.resolve(src)
    except Unresolvable as e:
        ctx.refuse(fld, f"bind source {src} cannot be judged: {e}")
        return
    exposed = exposure(ctx.host, real, read_only)
    if exposed:
        ctx.add(fld, f"bind mount of {src} exposes {exposed}", None)
        return
    node = ctx.host.node(real)
    if node is not None and node.kind == "chr":
        _device_node(ctx, fld, src, node)  # a GPU node is judged by its numbers, wherever it is


def _links(ctx: _Ctx) -> None:
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


def _annotations(ctx: _Ctx) -> None:
    for key in ctx.view.host_config.get("Annotations") or {}:
        if CDI_ANNOTATION_MARK in key:
            ctx.add(f"HostConfig.Annotations[{key}]", "CDI annotation injects devices", None)


# The catalogue: each row reads one family of fields.  Order matters only for
# _runtime_env, which must see whether a device request already set the env.
SOURCES: tuple[Callable[[_Ctx], None], ...] = (
    _device_requests,
    _runtime_env,
    _privileged,
    _devices,
    _cgroup_rules,
    _binds,
    _links,
    _annotations,
)


def _analyse(
    view: View,
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    strict: bool,
    mounts_of: MountsOf | None = None,
    volume_of: VolumeOf | None = None,
) -> Access:
    ctx = _Ctx(view, engine, inventory, host, strict, mounts_of, volume_of)
    for source in SOURCES:
        source(ctx)
    return Access(tuple(ctx.grants))


def of_create(
    body: Mapping[str, Any],
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    mounts_of: MountsOf | None = None,
    volume_of: VolumeOf | None = None,
) -> Access:
    view = View(
        env=tuple(str(e) for e in body.get("Env") or ()),
        env_complete=False,
        host_config=body.get("HostConfig") or {},
        volumes=tuple(body.get("Volumes") or ()),
    )
    return _analyse(view, engine, inventory, host, True, mounts_of, volume_of)


def of_container(
    inspect: Mapping[str, Any],
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    volume_of: VolumeOf | None = None,
) -> Access:
    config = inspect.get("Config") or {}
    view = View(
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
    return _analyse(view, engine, inventory, host, False, None, volume_of)
