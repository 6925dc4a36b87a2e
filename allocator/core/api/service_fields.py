"""The swarm ServiceSpec's field names, as data, for `POST /services/create` and update.

Read from moby's api/types/swarm (service.go, task.go, container.go, runtime.go) of
v20.10.24 and the newer trees, in the notation of `allocator.core.api.fields`.  Only the
parts a task's device access can depend on are modelled field by field (the task's
ContainerSpec, its resources, its runtime); the rest is `OPAQUE`, left to dockerd.
`CONTAINER_SPEC_KEYS` and `TASK_SPEC_KEYS` are every field those two structs have in
Engines 20.10 to 29: a key outside them is one a newer Engine may read, and refused.
"""

from allocator.core.api.fields import (
    MOUNT,
    OPAQUE,
    STRING_MAP,
    STRINGS,
    UINT64,
    ListOf,
    Recased,
    Struct,
)

GENERIC_RESOURCE = Struct(
    NamedResourceSpec=Struct(Kind=str, Value=str),
    DiscreteResourceSpec=Struct(Kind=str, Value=int),
)

PRIVILEGES = Struct(
    CredentialSpec=OPAQUE,
    SELinuxContext=OPAQUE,
    Seccomp=Struct(Mode=str, Profile=OPAQUE),  # Engine 25+
    AppArmor=Struct(Mode=str),  # Engine 25+
    NoNewPrivileges=bool,  # Engine 25+
)

# A secret's or config's file in the task: a bind mount at File.Name (moby's
# getSecretTargetPath and getConfigTargetPath; relative names under /run/secrets and /).
FILE_TARGET = Struct(Name=str, UID=str, GID=str, Mode=OPAQUE)

CONTAINER_SPEC = Struct(
    Image=str,
    Labels=STRING_MAP,
    Command=STRINGS,
    Args=STRINGS,
    Hostname=str,
    Env=STRINGS,
    Dir=str,
    User=str,
    Groups=STRINGS,
    Privileges=PRIVILEGES,
    Init=bool,
    StopSignal=str,
    TTY=bool,
    OpenStdin=bool,
    ReadOnly=bool,
    Mounts=ListOf(MOUNT),
    StopGracePeriod=int,
    Healthcheck=OPAQUE,
    Hosts=STRINGS,
    DNSConfig=OPAQUE,
    Secrets=ListOf(Struct(File=FILE_TARGET, SecretID=str, SecretName=str)),
    Configs=ListOf(Struct(File=FILE_TARGET, Runtime=OPAQUE, ConfigID=str, ConfigName=str)),
    Isolation=str,
    Sysctls=STRING_MAP,
    CapabilityAdd=STRINGS,
    CapabilityDrop=STRINGS,
    Ulimits=OPAQUE,
    OomScoreAdj=int,  # Engine 25+
)

TASK_SPEC = Struct(
    ContainerSpec=CONTAINER_SPEC,
    PluginSpec=OPAQUE,
    NetworkAttachmentSpec=OPAQUE,
    Resources=Struct(
        Limits=OPAQUE,
        Reservations=Struct(
            NanoCPUs=int,
            MemoryBytes=int,
            GenericResources=ListOf(GENERIC_RESOURCE),
        ),
    ),
    RestartPolicy=OPAQUE,
    Placement=OPAQUE,
    Networks=OPAQUE,
    LogDriver=OPAQUE,
    ForceUpdate=int,
    Runtime=str,
)

# The service's mode: its counts decide how many tasks reserve GPUs at once.  docker-py
# spells it {"replicated": {"Replicas": n}}, so its keys are read in any ASCII case, as Go
# reads them; a count spelt twice ("Replicas" and "replicas": Go keeps the last) is refused.
MODE = Recased(
    Replicated=Recased(Replicas=UINT64),
    Global=Recased(),
    ReplicatedJob=Recased(MaxConcurrent=UINT64, TotalCompletions=UINT64),  # Engine 20.10+
    GlobalJob=Recased(),
)

SERVICE_SPEC = Struct(
    Name=str,  # Annotations are embedded: Name and Labels sit at the top level
    Labels=STRING_MAP,
    TaskTemplate=TASK_SPEC,
    Mode=MODE,
    UpdateConfig=OPAQUE,
    RollbackConfig=OPAQUE,
    Networks=OPAQUE,
    EndpointSpec=OPAQUE,
)

CONTAINER_SPEC_KEYS = frozenset(CONTAINER_SPEC)
TASK_SPEC_KEYS = frozenset(TASK_SPEC)
