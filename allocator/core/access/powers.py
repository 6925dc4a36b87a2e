"""The powers a container may hold over the host: an allow-list, judged on every socket.

gpu-alloc's promise (no GPU without a lease) holds only while no container becomes root
on the host: root opens every GPU node and rewrites gpu-alloc's ledger.  So every field
of a container that gives it a power over the host is read against the table of what is
allowed (`powers_table`), and anything else is refused.

Rules
-----
1. Read a field as dockerd reads it: a capability by its normalised name (any case,
   with or without ``CAP_``, ``ALL``), a security option split as dockerd's
   ``parseSecurityOpt`` splits it, a namespace mode by its exact value.
2. Only what the table lists passes; any other value is refused (fail closed), and so is
   a HostConfig field the Engine's table (`fields.HOST_CONFIG`) does not hold, which a
   newer Engine may read.  ``--cap-drop`` is never read: dropping is always fine, and a
   drop that undoes an add is a spelling to fix, not to trust.
3. A refusal names the field and its value, what it lets a container do to the host, and
   the ``policy.powers`` key that grants it to named users and groups.  A grant is an
   owner's: the owner the shim labels a create with, or the one gpu-alloc recorded for
   the container at start (as for ``policy.engine_socket_binds``, `socket_binds`).  On
   dockerd's own socket nobody asks by name, so nothing is granted there.
4. ``SYS_ADMIN`` mounts the devices cgroup and opens GPU nodes unless AppArmor confines
   the container: even granted, it is refused where AppArmor is not loaded on the host
   (a fact the host gives) or the container runs unconfined.
5. A privileged container holds every power; its own row judges it (`privileged`).

The one entry point is `refused`; `access` runs it as a row of its catalogue (creates,
starts, adoption), `plugins` on a plugin's privileges, `services` on a service's spec.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.access import powers_table as table
from allocator.core.access.facts import Node
from allocator.core.api import fields, gonum

KEY = "policy.powers"
Granted = Callable[[str], bool]  # power -> granted to this container's owner
# Every power policy.powers may grant: the names refusals give.
GRANTABLE = frozenset(
    {*table.CAP_HARM, *table.OTHER_POWERS}
    | {power for power, _ in table.NAMESPACE_WHY.values()}
    | {power for power, _ in table.SECURITY_OPTS.values()}
)


def nothing_granted(power: str) -> bool:
    """Nobody asks by name (dockerd's own socket): no power is granted."""
    return False


def no_apparmor() -> bool:
    return False


@dataclass(frozen=True)
class Found:
    """A power outside the allow-list: the field, its value, why, and the grant's key."""

    field: str
    value: str
    why: str  # what it lets a container do to the host
    power: str  # the policy.powers key that grants it; empty: never granted

    def text(self) -> str:
        todo = (
            f"ask your operator to grant it in {KEY}: {{{self.power}: {{users: [...], "
            "groups: [...]}}, and create through the gpu-alloc context"
            if self.power
            else "leave it out"
        )
        return f"{self.value} {self.why}; {todo}"


@dataclass(frozen=True)
class Ask:
    """What one judgement reads besides the container's HostConfig."""

    granted: Granted = nothing_granted
    apparmor: Callable[[], bool] = no_apparmor  # AppArmor is loaded on the host
    strict: bool = True  # a create: fields outside the Engine's table are refused too


def capabilities(cap_add: Any) -> tuple[str, ...]:
    """``CapAdd`` as dockerd normalises it: upper case, ``CAP_`` dropped (a lone string is
    one capability: StrSlice)."""
    listed = [cap_add] if isinstance(cap_add, str) else list(cap_add or ())
    return tuple(dict.fromkeys(str(c).upper().removeprefix("CAP_") for c in listed))


def refused(host_config: Mapping[str, Any], ask: Ask = Ask()) -> list[Found]:
    """Each power ``host_config`` holds that the allow-list does not, and no grant covers."""
    hc = host_config
    if hc.get("Privileged"):
        return []
    found = [
        *_unknown_fields(hc, ask.strict),
        *_capabilities(hc, ask),
        *_security_options(hc, ask.strict),
        *_namespaces(hc, ask.strict),
        *_sysctls(hc),
        *_system_paths(hc),
        *_oom_score(hc),
    ]
    return [f for f in found if not (f.power and ask.granted(f.power))]


def devices_refused(
    host_config: Mapping[str, Any],
    node: Callable[[str], Node | None],
    walk: Callable[[str], Iterable[str]],
    gpu_majors: frozenset[int],
    granted: Granted = nothing_granted,
) -> list[Found]:
    """Each ``--device`` node and device cgroup rule that is no GPU's (`access_devices`
    judges those, by the ``gpu_majors`` of character devices) and not in the allow-list."""
    if host_config.get("Privileged") or granted("devices"):
        return []
    found = list(_cgroup_rules(host_config, gpu_majors))
    for i, dev in enumerate(host_config.get("Devices") or ()):
        path = posixpath.normpath(str((dev or {}).get("PathOnHost") or ""))
        if not path.startswith("/"):
            continue  # a CDI name or no path: access_devices judges it
        top = node(path)
        paths = sorted(walk(path)) if top is not None and top.kind == "dir" else [path]
        for sub in paths:
            got = top if sub == path else node(sub)
            if got is None or got.kind == "dir" or _allowed_node(sub, got):
                continue  # no node (access_devices refuses a missing one), or allowed
            if got.kind == "chr" and got.major in gpu_majors:
                continue  # a GPU: leased (access_devices)
            why = (
                "is no character device: a block device's raw blocks hold every file on it"
                if got.kind != "chr"
                else f"is a device ({got.major}:{got.minor}) gpu-alloc does not list as harmless"
            )
            found.append(Found(f"HostConfig.Devices[{i}]", f"--device {sub}", why, "devices"))
    return found


def _allowed_node(path: str, got: Node) -> bool:
    if got.kind != "chr":
        return False
    listed = table.ALLOWED_DEVICES
    return (
        (got.major, got.minor) in listed
        or (got.major, None) in listed
        or path.startswith(table.ALLOWED_DEVICE_DIRS)
    )


# ---------------------------------------------------------------- the rows


def _unknown_fields(hc: Mapping[str, Any], strict: bool) -> Iterable[Found]:
    if not strict:
        return
    for key, value in hc.items():
        if key not in fields.HOST_CONFIG and value not in (None, [], {}, "", 0, False):
            yield Found(
                f"HostConfig.{key}",
                f"HostConfig.{key}",
                "is not a field gpu-alloc knows, and a newer Engine may give the container "
                "a power by it",
                "",
            )


def _capabilities(hc: Mapping[str, Any], ask: Ask) -> Iterable[Found]:
    # API 1.40's ``Capabilities`` (the whole set, which later Engines ignore) read as added.
    caps = capabilities(hc.get("CapAdd")) + capabilities(hc.get("Capabilities"))
    pid = str(hc.get("PidMode") or "")
    host_net = str(hc.get("NetworkMode") or "") == "host"
    for cap in dict.fromkeys(caps):
        allowed = cap in table.ALLOWED_CAPS and not (
            (cap == "SYS_PTRACE" and pid) or (cap == "NET_ADMIN" and host_net)
        )
        if allowed:
            continue
        why = table.CAP_HARM.get(cap, "is no capability dockerd knows")
        power = cap if cap in table.CAP_HARM else ""
        yield Found("HostConfig.CapAdd", f"--cap-add {cap}", why, power)
    if "SYS_ADMIN" in caps and ask.granted("SYS_ADMIN") and not _confined(hc, ask):
        yield Found(
            "HostConfig.CapAdd",
            "--cap-add SYS_ADMIN",
            "mounts the devices cgroup and opens every GPU where no AppArmor profile "
            "confines the container, and none does here (AppArmor is not loaded on the "
            "host, or the container runs unconfined)",
            "",
        )


def _confined(hc: Mapping[str, Any], ask: Ask) -> bool:
    profiles = [v for k, v in _options(hc) if k == "apparmor"]
    return ask.apparmor() and not any(p == "unconfined" for p in profiles)


def _options(hc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``SecurityOpt`` as dockerd splits it: a bare ``no-new-privileges``, a bare
    ``disable`` (label=disable), else ``key=value``, else (the old spelling) ``key:value``."""
    out = []
    for opt in map(str, hc.get("SecurityOpt") or ()):
        if opt == "no-new-privileges":
            out.append((opt, ""))
        elif opt == "disable":
            out.append(("label", "disable"))
        else:
            key, _, value = opt.partition("=" if "=" in opt else ":")
            out.append((key, value))
    return out


def _security_options(hc: Mapping[str, Any], strict: bool) -> Iterable[Found]:
    """On an existing container the SELinux label options are dockerd's as much as the
    client's (it writes ``label=disable`` beside ``--ipc host`` or ``--pid host``, and the
    other container's type beside ``container:X``): only a create's are read."""
    for key, value in _options(hc):
        if _option_allowed(key, value) or (key == "label" and not strict):
            continue
        what = f"--security-opt {key}={value}" if value else f"--security-opt {key}"
        power, why = table.SECURITY_OPTS.get(key, ("", "is no option gpu-alloc knows"))
        yield Found("HostConfig.SecurityOpt", what, why, power)


def _option_allowed(key: str, value: str) -> bool:
    if key == "no-new-privileges":
        return value.lower() in ("", "true", "false", "1", "0")
    if key == "apparmor":
        return value not in ("", "unconfined")
    if key == "seccomp":
        return value not in ("", "unconfined") and not _allows_everything(value)
    if key == "label":
        return value.partition(":")[0] in table.SELINUX_KEYS
    if key == "writable-cgroups":
        return value.lower() in ("false", "0")
    return False


def _allows_everything(profile: str) -> bool:
    """A seccomp profile (inline JSON, as the CLI sends a file's content) whose default
    action lets every call through: unconfined by another name."""
    try:
        parsed = json.loads(profile)
    except ValueError:
        return False  # a name dockerd looks up (builtin, a file it knows)
    default = parsed.get("defaultAction") if isinstance(parsed, dict) else None
    return str(default) in table.SECCOMP_ALLOW_ALL


def _namespaces(hc: Mapping[str, Any], strict: bool) -> Iterable[Found]:
    for fld, allowed in table.NAMESPACE_ALLOWED.items():
        value = str(hc.get(fld) or "")
        joined = fld == "PidMode" and value.startswith(table.JOINED)  # access/joined.py's
        dockerds = (fld, value, strict) == ("CgroupnsMode", table.CGROUPNS_DEFAULT, False)
        if value in allowed or joined or dockerds:
            continue
        power, why = table.NAMESPACE_WHY[fld]
        if value != "host" and not (fld == "Cgroup" and value.startswith(table.JOINED)):
            power, why = "", f"is no {table.NAMESPACE_FLAGS[fld]} mode dockerd knows"
        yield Found(f"HostConfig.{fld}", f"{table.NAMESPACE_FLAGS[fld]} {value}", why, power)
    ipc = str(hc.get("IpcMode") or "")
    if ipc not in table.IPC_ALLOWED and not ipc.startswith(table.JOINED):
        yield Found("HostConfig.IpcMode", f"--ipc {ipc}", "is no IPC mode dockerd knows", "")


def _sysctls(hc: Mapping[str, Any]) -> Iterable[Found]:
    ipc_host = str(hc.get("IpcMode") or "") == "host"
    net_host = str(hc.get("NetworkMode") or "") == "host"
    for name in hc.get("Sysctls") or {}:
        ipc = name in table.IPC_SYSCTLS or name.startswith(table.IPC_SYSCTL_PREFIX)
        net = name.startswith(table.NET_SYSCTL_PREFIX)
        if (name in table.SAFE_SYSCTLS or ipc or net) and not (
            (ipc and ipc_host) or (net and net_host)
        ):
            continue
        yield Found(
            f"HostConfig.Sysctls[{name}]",
            f"--sysctl {name}",
            table.OTHER_POWERS["sysctls"][1],
            "sysctls",
        )


def _system_paths(hc: Mapping[str, Any]) -> Iterable[Found]:
    for fld, needed in (
        ("MaskedPaths", table.MASKED_PATHS),
        ("ReadonlyPaths", table.READONLY_PATHS),
    ):
        given = hc.get(fld)
        if given is None:
            continue  # dockerd applies its defaults
        missing = sorted(needed - {posixpath.normpath(str(p)) for p in given})
        if missing:
            yield Found(
                f"HostConfig.{fld}",
                f"{fld} without {missing[0]}",
                table.SECURITY_OPTS["systempaths"][1],
                table.SECURITY_OPTS["systempaths"][0],
            )


def _cgroup_rules(hc: Mapping[str, Any], gpu_majors: frozenset[int]) -> Iterable[Found]:
    for i, rule in enumerate(hc.get("DeviceCgroupRules") or ()):
        try:
            kind, major, minor, _ = gonum.cgroup_rule(str(rule))
        except gonum.NumError:
            continue  # access_devices refuses it
        if kind == "a" or (kind == "c" and major in gpu_majors | {gonum.ANY}):
            continue  # every device, or a GPU's: access_devices judges it
        listed = table.ALLOWED_DEVICES
        if kind == "c" and ((major, minor) in listed or (major, None) in listed):
            continue
        yield Found(
            f"HostConfig.DeviceCgroupRules[{i}]",
            f"--device-cgroup-rule '{rule}'",
            "lets the container make and open a device node gpu-alloc does not list as "
            "harmless (with MKNOD, which every container has)",
            "devices",
        )


def _oom_score(hc: Mapping[str, Any]) -> Iterable[Found]:
    score = hc.get("OomScoreAdj") or 0
    if isinstance(score, int) and score < 0:
        yield Found(
            "HostConfig.OomScoreAdj",
            f"--oom-score-adj {score}",
            table.OTHER_POWERS["oom-score-adj"][1],
            "oom-score-adj",
        )
