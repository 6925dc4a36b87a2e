"""The allow-list of container powers, as data: what `powers` lets through without a grant.

Each allowed row says why it is not root on the host; each refused row says what it lets
a container do to the host.  The anchor is Kubernetes' Pod Security Standards
``baseline`` profile: Docker's default capabilities, no host namespaces but the
network's, the namespaced safe sysctls, the default masked and read-only /proc paths.
docs/exclusivity.md's table is this one (tests/unit/test_powers_table.py holds them equal).
"""

from __future__ import annotations

# --- capabilities, as dockerd normalises them (upper case, no CAP_ prefix) ------------------

# Docker's default set, and the ones ML work needs that are no root on the host.
ALLOWED_CAPS: dict[str, str] = {
    **dict.fromkeys(
        (
            "AUDIT_WRITE",
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "FSETID",
            "KILL",
            "MKNOD",
            "NET_BIND_SERVICE",
            "NET_RAW",
            "SETFCAP",
            "SETGID",
            "SETPCAP",
            "SETUID",
            "SYS_CHROOT",
        ),
        "Docker's default set: every container has it",
    ),
    "SYS_NICE": "priorities, CPU and NUMA placement of its own processes (numactl, NCCL); "
    "real-time scheduling stays within its cgroup's budget",
    "IPC_LOCK": "locks its own memory (pinned host memory, RDMA registration), charged to "
    "its memory limit",
    "SYS_PTRACE": "debuggers and profilers over its own processes (gdb, py-spy); only in "
    "its own PID namespace",
    "NET_ADMIN": "configures its own network namespace (routes, RDMA over Ethernet); not "
    "with --network host",
}

# What each capability refused lets a container do to the host (the two allowed above
# under a condition: where it fails); any other name is one dockerd does not know.
CAP_HARM: dict[str, str] = {
    "ALL": "holds every capability, SYS_ADMIN and SYS_MODULE among them",
    "SYS_ADMIN": "mounts filesystems, the devices cgroup and /dev/nvidia* among them, "
    "wherever no AppArmor profile confines it",
    "SYS_TIME": "sets the host's clock, which gpu-alloc's time limits run by",
    "SYS_MODULE": "loads kernel modules",
    "SYS_RAWIO": "reaches the hardware's I/O ports (iopl, ioperm)",
    "DAC_READ_SEARCH": "opens any file of the host's filesystems (open_by_handle_at)",
    "SYS_BOOT": "reboots the host",
    "SYS_RESOURCE": "sets aside the limits that protect the host (reserved disk blocks, "
    "queue and pipe limits)",
    "SYS_PACCT": "switches the host's process accounting",
    "SYS_TTY_CONFIG": "reconfigures the host's terminals",
    "SYSLOG": "reads and clears the kernel's log (kernel addresses included)",
    "MAC_ADMIN": "changes the host's mandatory access control (AppArmor, SELinux)",
    "MAC_OVERRIDE": "overrides the host's mandatory access control",
    "AUDIT_CONTROL": "changes the host's audit rules",
    "AUDIT_READ": "reads the host's audit log",
    "BPF": "loads BPF programs into the host's kernel",
    "PERFMON": "observes every process on the host (perf_event_open)",
    "CHECKPOINT_RESTORE": "checkpoints and restores processes, choosing their ids",
    "LINUX_IMMUTABLE": "makes files immutable or append-only",
    "IPC_OWNER": "bypasses the permissions of System V IPC objects",
    "LEASE": "takes leases on files it does not own",
    "NET_BROADCAST": "broadcasts and listens to multicast",
    "BLOCK_SUSPEND": "keeps the host from suspending",
    "WAKE_ALARM": "sets alarms that wake the host",
    "NET_ADMIN": "reconfigures the host's network (routes, firewall) with --network host",
    "SYS_PTRACE": "reaches other processes' files through /proc/<pid>/root outside its own "
    "PID namespace, the host's daemons' among them",
}

# --- security options (dockerd's parseSecurityOpt) -----------------------------------------

# option key -> (the power that grants its refused values, what they let a container do)
SECURITY_OPTS: dict[str, tuple[str, str]] = {
    "seccomp": (
        "seccomp-unconfined",
        "lifts the seccomp filter that keeps the kernel's riskiest calls (keyctl, bpf, "
        "unshare, open_by_handle_at) from the container",
    ),
    "apparmor": (
        "apparmor-unconfined",
        "lifts the AppArmor profile that keeps mounts and /proc writes from the host",
    ),
    "label": (
        "label-disable",
        "lifts SELinux's confinement of the container (disable, or a type such as spc_t)",
    ),
    "systempaths": (
        "systempaths-unconfined",
        "unmasks /proc and makes /proc/sys writable: kernel.core_pattern then runs a "
        "program of the container's choice as root on the host",
    ),
    "writable-cgroups": ("writable-cgroups", "makes the container's cgroup files writable"),
}
SELINUX_KEYS = ("user", "role", "level", "filetype")  # label=<key>:<value>, all confined
SECCOMP_ALLOW_ALL = frozenset({"SCMP_ACT_ALLOW", "SCMP_ACT_LOG"})  # a profile that confines nothing

# --- namespaces ----------------------------------------------------------------------------

# field -> (the power its refused values need, what they let a container do to the host)
NAMESPACE_WHY: dict[str, tuple[str, str]] = {
    "PidMode": (
        "pid-host",
        "sees and signals every host process (it can stop dockerd, the shim, the plugin)",
    ),
    "UTSMode": ("uts-host", "shares the host's hostname and domain name"),
    "UsernsMode": (
        "userns-host",
        "opts out of the daemon's user-namespace remapping: its root is the host's root",
    ),
    "CgroupnsMode": (
        "cgroupns-host",
        "sees the host's whole cgroup tree, every container's and gpu-alloc's own",
    ),
    "Cgroup": ("cgroup-container", "joins another container's cgroup"),
}
# How the CLI spells each (a refusal names the flag a person typed).
NAMESPACE_FLAGS = {
    "PidMode": "--pid",
    "UTSMode": "--uts",
    "UsernsMode": "--userns",
    "CgroupnsMode": "--cgroupns",
    "Cgroup": "HostConfig.Cgroup",
    "IpcMode": "--ipc",
}
# Allowed values (dockerd's spellings; any other is refused).
NAMESPACE_ALLOWED: dict[str, frozenset[str]] = {
    "PidMode": frozenset({""}),
    "UTSMode": frozenset({""}),
    "UsernsMode": frozenset({""}),
    "CgroupnsMode": frozenset({"", "private"}),
    "Cgroup": frozenset({""}),
}
# dockerd's own default on a cgroup v1 host is "host": an existing container shows it
# without having asked, so only a create is refused it.
CGROUPNS_DEFAULT = "host"
# --ipc host: NGC images need it, and its shared memory is no root; a share's container is
# refused it by the sharing rules (core/rules/sharing.py), which keep its MPS /dev/shm.
IPC_ALLOWED = frozenset({"", "none", "private", "shareable", "host"})
# --pid, --ipc and --network container:X are judged by what X reaches (access/joined.py):
# an X in the host's PID namespace holds that power itself, and the joiner with it.
JOINED = "container:"
# --network host is allowed: it reaches the host's network services as the host's own
# processes do, and gpu-alloc serves only unix sockets; NET_ADMIN is refused beside it.

# The other powers a refusal names: power -> (field, what it lets a container do).
OTHER_POWERS: dict[str, tuple[str, str]] = {
    "sysctls": (
        "Sysctls",
        "sets a kernel parameter of the host's, outside the container's own namespaces",
    ),
    "devices": (
        "Devices, DeviceCgroupRules",
        "opens a device node that is no GPU and not listed as harmless (a block device's "
        "raw blocks hold every file on it); a cgroup rule lets it make one with MKNOD",
    ),
    "oom-score-adj": (
        "OomScoreAdj",
        "makes the kernel's OOM killer kill the host's processes (dockerd, gpu-alloc) "
        "before the container",
    ),
    "privileged": (
        "Privileged",
        "holds every capability and device node with no seccomp or AppArmor profile: root "
        "on the host; granted (Docker-in-Docker), its create through the shim leases every "
        "GPU, as under policy.privileged: lease-all",
    ),
}

# --- sysctls --------------------------------------------------------------------------------

# Kubernetes' safe sysctls, and the IPC ones dockerd namespaces (runc refuses them beside
# --ipc host); net.* is namespaced too, allowed without --network host.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
IPC_SYSCTLS = frozenset(
    {"kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.sem", "kernel.shmall"}
    | {"kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced"}
)
IPC_SYSCTL_PREFIX = "fs.mqueue."
NET_SYSCTL_PREFIX = "net."

# --- /proc paths: what every Engine from 20.10 masks and keeps read-only -----------------

MASKED_PATHS = frozenset(
    {
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/sys/firmware",
    }
)
READONLY_PATHS = frozenset(
    {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

# --- devices besides GPUs (which access_devices leases) ----------------------------------

# Character devices a container may be given, by (major, minor; None: any): each reaches
# no host file and no GPU.  A device's path can lie, its numbers cannot.
ALLOWED_DEVICES: dict[tuple[int, int | None], str] = {
    (1, 3): "/dev/null (every container has it)",
    (1, 5): "/dev/zero (every container has it)",
    (1, 7): "/dev/full (every container has it)",
    (1, 8): "/dev/random (every container has it)",
    (1, 9): "/dev/urandom (every container has it)",
    (5, 0): "/dev/tty (every container has it)",
    (5, 1): "/dev/console (every container has it)",
    (5, 2): "/dev/ptmx (every container has it)",
    (136, None): "/dev/pts/* (every container has them)",
    (10, 200): "/dev/net/tun: TUN/TAP interfaces in its own network namespace",
    (10, 229): "/dev/fuse: FUSE mounts (with SYS_ADMIN, granted)",
    (231, None): "/dev/infiniband/uverbs*, umad*: RDMA for multi-node training",
}
# rdma_cm's minor is the misc driver's to choose: allowed by its place.
ALLOWED_DEVICE_DIRS = ("/dev/infiniband/",)

# --- every HostConfig field the Engine has (core/api/fields.py), by who judges it ---------

# Fields gpu-alloc reads for GPUs or powers; the module that judges each.
JUDGED_FIELDS: dict[str, str] = {
    **dict.fromkeys(("Binds", "Mounts", "VolumesFrom", "Tmpfs", "VolumeDriver"), "access_mounts"),
    **dict.fromkeys(("Devices", "DeviceCgroupRules"), "access_devices, powers"),
    **dict.fromkeys(("DeviceRequests", "Runtime", "Links", "Annotations"), "access"),
    "Privileged": "access, privileged",
    **dict.fromkeys(
        (
            "CapAdd",
            "SecurityOpt",
            "PidMode",
            "IpcMode",
            "UTSMode",
            "UsernsMode",
            "CgroupnsMode",
            "Cgroup",
            "NetworkMode",
            "Sysctls",
            "MaskedPaths",
            "ReadonlyPaths",
            "OomScoreAdj",
        ),
        "powers",
    ),
}
_LIMIT = "a resource limit: it bounds the container and gives it nothing of the host's"
_CLIENT = "the container's own settings, inside its namespaces"
HARMLESS_FIELDS: dict[str, str] = {
    **dict.fromkeys(
        (
            "CpuShares",
            "Memory",
            "NanoCpus",
            "CgroupParent",
            "BlkioWeight",
            "BlkioWeightDevice",
            "BlkioDeviceReadBps",
            "BlkioDeviceWriteBps",
            "BlkioDeviceReadIOps",
            "BlkioDeviceWriteIOps",
            "CpuPeriod",
            "CpuQuota",
            "CpuRealtimePeriod",
            "CpuRealtimeRuntime",
            "CpusetCpus",
            "CpusetMems",
            "KernelMemory",
            "KernelMemoryTCP",
            "MemoryReservation",
            "MemorySwap",
            "MemorySwappiness",
            "OomKillDisable",
            "PidsLimit",
            "Ulimits",
            "CpuCount",
            "CpuPercent",
            "IOMaximumIOps",
            "IOMaximumBandwidth",
            "ShmSize",
            "StorageOpt",
        ),
        _LIMIT,
    ),
    **dict.fromkeys(
        (
            "ContainerIDFile",
            "LogConfig",
            "PortBindings",
            "RestartPolicy",
            "AutoRemove",
            "ConsoleSize",
            "CapDrop",
            "Dns",
            "DnsOptions",
            "DnsSearch",
            "ExtraHosts",
            "GroupAdd",
            "PublishAllPorts",
            "ReadonlyRootfs",
            "Isolation",
            "Init",
        ),
        _CLIENT,
    ),
}
