"""The Engine API's struct field names, as data, for the bodies that can grant device access.

dockerd decodes request bodies with Go's encoding/json into the structs of moby's
`api/types`. A JSON key reaches a struct field when it equals the field's json tag name (else
its Go field name) under Unicode case folding; fields of embedded structs are promoted to
the embedding struct's level. These tables list, for each struct, the canonical key of every
field and the JSON shape Go accepts for it, so that `allocator.gojson.decode` can refuse a key
that dockerd would read differently from us (see gojson for the rules).

Read from moby's source: Debian's v20.10.24 (api/types/container/{config,host_config}.go,
api/types/mount/mount.go, api/types/configs.go, api/types/swarm/*.go, runconfig/config_unix.go)
and the newer v24..v29 trees (api/types/container/hostconfig.go, create_request.go,
exec_create_request.go). A field that exists only in some Engines says so in its comment;
the tables hold the union, because a key unknown to one Engine may be read by another.

Notation: a `Struct` maps canonical key -> field type; a field type is one of
  str, bool, int (Go int/int64), an `Int` with a narrower range (uint16, uint64, ...),
  `ListOf(t)` (Go slice or array), `MapOf(t)` (Go map[string]T; its keys are data, compared
  exactly, never folded), another `Struct`, `STR_SLICE` (Go strslice.StrSlice: a string or a
  list of strings), or `OPAQUE` (any JSON value: a part no device decision reads, left to
  dockerd to judge).
JSON null is accepted for every field: Go sets pointers, slices and maps to nil and leaves
other types at their zero value.
"""

from dataclasses import dataclass


class Struct(dict[str, object]):
    """A Go struct as dockerd decodes it: canonical JSON key -> field type."""


class Recased(Struct):
    """A struct whose keys clients spell in another letter case (docker-py's ServiceMode
    writes ``replicated`` and ``global``): an ASCII key that differs from its field by case
    alone is read as that field, as Go reads it, where no other key of the object sets the
    field; two keys for one field, and a non-ASCII spelling, are refused as in a `Struct`."""


@dataclass(frozen=True)
class ListOf:
    """A Go slice or array: a JSON array of `item`."""

    item: object


@dataclass(frozen=True)
class MapOf:
    """A Go map[string]T: a JSON object whose keys are data and whose values are `value`."""

    value: object


@dataclass(frozen=True)
class Int:
    """A Go integer type: a JSON number written as an integer, within [lo, hi]."""

    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class Opaque:
    """Any JSON value: a part of the body that no decision of ours reads."""


@dataclass(frozen=True)
class StrSlice:
    """strslice.StrSlice: a JSON string or an array of strings ([]string in Engine 29+)."""


OPAQUE = Opaque()
STR_SLICE = StrSlice()
INT64 = Int("int64", -(2**63), 2**63 - 1)  # what a plain `int` field means
UINT16 = Int("uint16", 0, 2**16 - 1)
UINT32 = Int("uint32", 0, 2**32 - 1)
UINT64 = Int("uint64", 0, 2**64 - 1)
STRINGS = ListOf(str)
STRING_MAP = MapOf(str)
SET = MapOf(Struct())  # map[string]struct{}: an object of objects, e.g. Config.Volumes

# --- api/types/container: the pieces of Resources -------------------------------------------

DEVICE_MAPPING = Struct(
    PathOnHost=str,
    PathInContainer=str,
    CgroupPermissions=str,
)

DEVICE_REQUEST = Struct(
    Driver=str,
    Count=int,  # Go int: -1 means all devices
    DeviceIDs=STRINGS,
    Capabilities=ListOf(STRINGS),  # an OR list of AND lists, e.g. [["gpu"]]
    Options=STRING_MAP,
)

WEIGHT_DEVICE = Struct(Path=str, Weight=UINT16)  # blkiodev.WeightDevice
THROTTLE_DEVICE = Struct(Path=str, Rate=UINT64)  # blkiodev.ThrottleDevice
ULIMIT = Struct(Name=str, Hard=int, Soft=int)  # go-units Ulimit

RESOURCES = Struct(
    CpuShares=int,  # Go field CPUShares
    Memory=int,
    NanoCpus=int,  # Go field NanoCPUs
    CgroupParent=str,
    BlkioWeight=UINT16,
    BlkioWeightDevice=ListOf(WEIGHT_DEVICE),
    BlkioDeviceReadBps=ListOf(THROTTLE_DEVICE),
    BlkioDeviceWriteBps=ListOf(THROTTLE_DEVICE),
    BlkioDeviceReadIOps=ListOf(THROTTLE_DEVICE),
    BlkioDeviceWriteIOps=ListOf(THROTTLE_DEVICE),
    CpuPeriod=int,  # Go field CPUPeriod
    CpuQuota=int,  # Go field CPUQuota
    CpuRealtimePeriod=int,  # Go field CPURealtimePeriod
    CpuRealtimeRuntime=int,  # Go field CPURealtimeRuntime
    CpusetCpus=str,
    CpusetMems=str,
    Devices=ListOf(DEVICE_MAPPING),
    DeviceCgroupRules=STRINGS,
    DeviceRequests=ListOf(DEVICE_REQUEST),
    KernelMemory=int,  # removed in Engine 29
    KernelMemoryTCP=int,  # removed in Engine 29
    MemoryReservation=int,
    MemorySwap=int,
    MemorySwappiness=int,
    OomKillDisable=bool,
    PidsLimit=int,
    Ulimits=ListOf(ULIMIT),
    CpuCount=int,  # Go field CPUCount (Windows)
    CpuPercent=int,  # Go field CPUPercent (Windows)
    IOMaximumIOps=UINT64,
    IOMaximumBandwidth=UINT64,
)

RESTART_POLICY = Struct(Name=str, MaximumRetryCount=int)
LOG_CONFIG = Struct(Type=str, Config=STRING_MAP)

# --- api/types/mount ------------------------------------------------------------------------

MOUNT = Struct(
    Type=str,  # "bind", "volume", "tmpfs", "npipe", "cluster", "image" (28+)
    Source=str,
    Target=str,
    ReadOnly=bool,
    Consistency=str,
    BindOptions=Struct(
        Propagation=str,
        NonRecursive=bool,
        CreateMountpoint=bool,  # Engine 23+
        ReadOnlyNonRecursive=bool,  # Engine 25+
        ReadOnlyForceRecursive=bool,  # Engine 25+
    ),
    VolumeOptions=Struct(
        NoCopy=bool,
        Labels=STRING_MAP,
        Subpath=str,  # Engine 26+
        DriverConfig=Struct(Name=str, Options=STRING_MAP),
    ),
    ImageOptions=Struct(Subpath=str),  # Engine 28+
    TmpfsOptions=Struct(
        SizeBytes=int,
        Mode=UINT32,  # os.FileMode
        Options=ListOf(STRINGS),  # Engine 27+
    ),
    ClusterOptions=OPAQUE,  # Engine 23+, an empty struct
)

# --- HostConfig -----------------------------------------------------------------------------

# The fields HostConfig declares itself; Resources' fields are promoted next to them.
_HOST_CONFIG_OWN = Struct(
    Binds=STRINGS,
    ContainerIDFile=str,
    LogConfig=LOG_CONFIG,
    NetworkMode=str,
    PortBindings=OPAQUE,  # nat.PortMap / network.PortMap
    RestartPolicy=RESTART_POLICY,
    AutoRemove=bool,
    VolumeDriver=str,
    VolumesFrom=STRINGS,
    ConsoleSize=ListOf(UINT64),  # Go [2]uint
    Annotations=STRING_MAP,  # Engine 24+: passed to the runtime (CDI device annotations)
    CapAdd=STR_SLICE,  # StrSlice up to Engine 28, []string in 29+
    CapDrop=STR_SLICE,
    CgroupnsMode=str,
    Dns=STRINGS,  # Go field DNS ([]netip.Addr in 29+, written as strings)
    DnsOptions=STRINGS,  # Go field DNSOptions
    DnsSearch=STRINGS,  # Go field DNSSearch
    ExtraHosts=STRINGS,
    GroupAdd=STRINGS,
    IpcMode=str,
    Cgroup=str,
    Links=STRINGS,
    OomScoreAdj=int,
    PidMode=str,
    Privileged=bool,
    PublishAllPorts=bool,
    ReadonlyRootfs=bool,
    SecurityOpt=STRINGS,
    StorageOpt=STRING_MAP,
    Tmpfs=STRING_MAP,
    UTSMode=str,
    UsernsMode=str,
    ShmSize=int,
    Sysctls=STRING_MAP,
    Runtime=str,
    Isolation=str,
    Mounts=ListOf(MOUNT),
    MaskedPaths=STRINGS,
    ReadonlyPaths=STRINGS,
    Init=bool,
)

HOST_CONFIG = Struct(_HOST_CONFIG_OWN, **RESOURCES)

# --- Config (the container's own configuration; also the commit body) ----------------------

CONFIG = Struct(
    Hostname=str,
    Domainname=str,
    User=str,
    AttachStdin=bool,
    AttachStdout=bool,
    AttachStderr=bool,
    ExposedPorts=OPAQUE,  # nat.PortSet
    Tty=bool,
    OpenStdin=bool,
    StdinOnce=bool,
    Env=STRINGS,  # NVIDIA_VISIBLE_DEVICES=... here grants GPUs under the nvidia runtime
    Cmd=STR_SLICE,
    Healthcheck=OPAQUE,
    ArgsEscaped=bool,
    Image=str,
    Volumes=SET,
    WorkingDir=str,
    Entrypoint=STR_SLICE,
    NetworkDisabled=bool,
    MacAddress=str,  # deprecated in API 1.44, removed in Engine 29
    OnBuild=STRINGS,
    Labels=STRING_MAP,
    StopSignal=str,
    StopTimeout=int,
    Shell=STR_SLICE,
)

# --- Request bodies -------------------------------------------------------------------------

# POST /containers/create. Engines up to 26 decode runconfig.ContainerConfigWrapper:
#     *container.Config                       (promoted: Config's fields at the top level)
#     InnerHostConfig *HostConfig  `json:"HostConfig"`
#     Cpuset string                           (deprecated)
#     NetworkingConfig *NetworkingConfig
#     *container.HostConfig                   (promoted: HostConfig's fields, and Resources',
#                                              at the top level too)
# and use the top-level HostConfig fields when "HostConfig" is absent or null; when it is
# present they copy only Memory, MemorySwap, CpuShares, CpusetCpus and VolumeDriver from the
# top level into it where it leaves them zero. Engines 27+ decode container.CreateRequest
# (Config promoted, HostConfig, NetworkingConfig) and ignore top-level HostConfig fields.
# Config and HostConfig share no field name, so none of the promoted fields cancel out.
CREATE_BODY = Struct(
    CONFIG,
    **HOST_CONFIG,
    HostConfig=HOST_CONFIG,
    Cpuset=str,  # Engines up to 26; copied into CpusetCpus when that is empty
    NetworkingConfig=OPAQUE,
)

# POST /containers/{id}/start with a body (Engines up to 25, API below 1.24) decodes like the
# create body and REPLACES the container's HostConfig; decide refuses such starts outright
# rather than decoding them.  Swarm service specs are refused outright as well (their tasks
# never pass the plugin), so neither needs a table here.

# POST /containers/{id}/exec: types.ExecConfig (container.ExecOptions in 26+,
# container.ExecCreateRequest in 29+).
EXEC_BODY = Struct(
    User=str,
    Privileged=bool,
    Tty=bool,
    ConsoleSize=ListOf(UINT64),  # Engine 23+, *[2]uint
    AttachStdin=bool,
    AttachStderr=bool,
    AttachStdout=bool,
    Detach=bool,  # up to Engine 28
    DetachKeys=str,
    Env=STRINGS,
    WorkingDir=str,
    Cmd=STRINGS,
)

# POST /containers/{id}/update: container.UpdateConfig, Resources promoted.
UPDATE_BODY = Struct(RESOURCES, RestartPolicy=RESTART_POLICY)

# --- Plugins: POST /plugins/pull and /plugins/{name}/upgrade (the privileges granted) -------

PLUGIN_PRIVILEGE = Struct(Name=str, Description=str, Value=STRINGS)  # e.g. Name "device"
PLUGIN_PRIVILEGES_BODY = ListOf(PLUGIN_PRIVILEGE)
PLUGIN_SET_BODY = STRINGS  # POST /plugins/{name}/set: ["KEY=value", "devices.path=/dev/x"]
