"""The ways to reach a GPU through a create body, each with what both layers must do.

Each case is a create body and two expectations: the shim's (``lease N``: it
leases N GPUs and forwards; ``allow``: no GPU, forwarded; ``deny``) and the
plugin's on the body as it arrives unchanged on the real socket (``allow`` or
``deny``).  The legitimate shapes are written exactly as the docker CLI,
Compose (docker-py) and the SDK write them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    shim: str  # "lease N" | "allow" | "deny"
    plugin: str  # "allow" | "deny"
    why: str = ""  # a word the denial must contain (the field that caused it)


def body(**fields) -> bytes:
    spec = {"Image": "busybox", "Cmd": ["true"], "Env": None, "Labels": {}}
    hc = fields.pop("HostConfig", {})
    spec.update(fields)
    spec["HostConfig"] = {"NetworkMode": "default", **hc}
    return json.dumps(spec).encode()


def request(count=0, ids=None, driver="", caps=(("gpu",),)) -> dict:
    return {"Driver": driver, "Count": count, "DeviceIDs": ids,
            "Capabilities": [list(c) for c in caps], "Options": {}}  # fmt: skip


def cases(devdir: Path) -> list[Case]:
    """``devdir`` holds fake device nodes made by `make_nodes`."""
    gpu0 = str(devdir / "nvidia0")
    return [
        # -- what the docker CLI, Compose and the SDK send: leased through the shim
        Case("cli --gpus 1", body(HostConfig={"DeviceRequests": [request(1)]}),
             "lease 1", "deny", "DeviceRequests"),
        Case("cli --gpus 2", body(HostConfig={"DeviceRequests": [request(2)]}),
             "lease 2", "deny", "DeviceRequests"),
        Case("cli --gpus all", body(HostConfig={"DeviceRequests": [request(-1)]}),
             "lease 4", "deny", "DeviceRequests"),
        Case("cli --gpus device=1", body(HostConfig={"DeviceRequests": [request(ids=["1"])]}),
             "lease 1", "deny", "DeviceRequests"),
        Case("cli two --gpus flags",
             body(HostConfig={"DeviceRequests": [request(1), request(ids=["3"])]}),
             "lease 2", "deny", "DeviceRequests"),
        Case("compose reservation (driver nvidia)",
             body(HostConfig={"DeviceRequests": [request(1, driver="nvidia")]}),
             "lease 1", "deny", "DeviceRequests"),
        Case("sdk DeviceRequest(count=1)",
             body(HostConfig={"DeviceRequests": [request(1, caps=(("gpu", "utility"),))]}),
             "lease 1", "deny", "DeviceRequests"),
        Case("sdk runtime=nvidia + NVIDIA_VISIBLE_DEVICES=2",
             body(Env=["NVIDIA_VISIBLE_DEVICES=2"], HostConfig={"Runtime": "nvidia"}),
             "lease 1", "deny", "Config.Env"),
        Case("driver nvidia.cdi (Engine 28)",
             body(HostConfig={"DeviceRequests": [request(1, driver="nvidia.cdi")]}),
             "lease 1", "deny", "DeviceRequests"),
        Case("cli --gpus device=all", body(HostConfig={"DeviceRequests": [request(ids=["all"])]}),
             "lease 4", "deny", "DeviceRequests"),
        Case("cli --gpus 0: the 20.10 hook still runs, the image's ENV decides",
             body(HostConfig={"DeviceRequests": [request(0)]}), "allow", "deny", "Count 0"),
        Case("compose count 0 with NVIDIA_VISIBLE_DEVICES=all in the env",
             body(Env=["NVIDIA_VISIBLE_DEVICES=all"],
                  HostConfig={"DeviceRequests": [request(0, driver="nvidia")]}),
             "allow", "deny", "NVIDIA_VISIBLE_DEVICES=all"),
        Case("Count 0 with NVIDIA_VISIBLE_DEVICES naming a GPU",
             body(Env=["NVIDIA_VISIBLE_DEVICES=1"], HostConfig={"DeviceRequests": [request(0)]}),
             "allow", "deny", "Count 0"),
        Case("Count 0 pinned to void by the body", body(Env=["NVIDIA_VISIBLE_DEVICES=void"],
             HostConfig={"DeviceRequests": [request(0)]}), "allow", "allow"),
        Case("Count 0 pinned to none, last value wins", body(
             Env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=none"],
             HostConfig={"DeviceRequests": [request(0)]}), "allow", "allow"),
        # -- no GPU: allowed everywhere, without a lease
        Case("no device access", body(), "allow", "allow"),
        Case("NVIDIA_VISIBLE_DEVICES=all under runc reaches nothing",
             body(Env=["NVIDIA_VISIBLE_DEVICES=all"]), "allow", "allow"),
        Case("an ordinary device", body(HostConfig={"Devices": [
            {"PathOnHost": "/dev/null", "PathInContainer": "/dev/x", "CgroupPermissions": "rwm"}]}),
            "allow", "allow"),
        Case("an ordinary cgroup rule", body(HostConfig={"DeviceCgroupRules": ["c 1:3 rwm"]}),
             "allow", "allow"),
        Case("an ordinary cgroup rule with a leading zero",
             body(HostConfig={"DeviceCgroupRules": ["c 01:03 rwm"]}), "allow", "allow"),
        Case("a block-device rule (raw blocks hold every file: a power, core/access/powers.py)",
             body(HostConfig={"DeviceCgroupRules": ["b 195:* rwm"]}), "deny", "deny",
             "policy.powers: {devices:"),
        Case("an ordinary bind", body(HostConfig={"Binds": ["/srv:/data:ro"]}), "allow", "allow"),
        Case("the host's /dev/shm (a tmpfs of its own)",
             body(HostConfig={"Binds": ["/dev/shm:/dev/shm"]}), "allow", "allow"),
        Case("cgroup files, read-only", body(HostConfig={"Binds": [
            "/sys/fs/cgroup:/sys/fs/cgroup:ro"]}), "allow", "allow"),
        Case("Mounts volume with no options", body(HostConfig={"Mounts": [
            {"Type": "volume", "Source": "", "Target": "/d"}]}), "allow", "allow"),
        Case("Mounts volume that is a tmpfs", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Name": "local", "Options": {"type": "tmpfs", "device": "tmpfs",
                                             "o": "size=1m"}}}}]}), "allow", "allow"),
        Case("Mounts volume that binds an ordinary directory", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Options": {"type": "none", "o": "bind,ro", "device": "/srv"}}}}]}),
            "allow", "allow"),
        Case("a device request for another vendor's capability",
             body(HostConfig={"DeviceRequests": [request(1, caps=(("tpu",),))]}),
             "deny", "deny", "DeviceRequests"),
        # -- other ways to a GPU: refused at both layers, naming the field
        Case("runtime nvidia, image ENV decides",
             body(HostConfig={"Runtime": "nvidia"}), "deny", "deny", "Config.Env"),
        Case("runtime nvidia with NVIDIA_VISIBLE_DEVICES twice",
             body(Env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=all"],
                  HostConfig={"Runtime": "nvidia"}), "deny", "deny", "set 2 times"),
        Case("cdi driver", body(HostConfig={"DeviceRequests": [
            request(ids=["nvidia.com/gpu=all"], driver="cdi", caps=())]}),
            "deny", "deny", "CDI"),
        Case("CDI name as a device", body(HostConfig={"Devices": [
            {"PathOnHost": "nvidia.com/gpu=0", "PathInContainer": "", "CgroupPermissions": ""}]}),
            "deny", "deny", "Devices"),
        Case("privileged", body(HostConfig={"Privileged": True}), "deny", "deny", "Privileged"),
        Case("raw GPU device node", body(HostConfig={"Devices": [
            {"PathOnHost": gpu0, "PathInContainer": "/dev/nvidia0", "CgroupPermissions": "rwm"}]}),
            "deny", "deny", "Devices"),
        Case("a link to a GPU node", body(HostConfig={"Devices": [
            {"PathOnHost": str(devdir / "innocent"), "PathInContainer": "/dev/x",
             "CgroupPermissions": "rwm"}]}), "deny", "deny", "link"),
        Case("a directory holding a GPU node", body(HostConfig={"Devices": [
            {"PathOnHost": str(devdir), "PathInContainer": "/dev/d", "CgroupPermissions": "rwm"}]}),
            "deny", "deny", "Devices"),
        Case("nvidiactl", body(HostConfig={"Devices": [
            {"PathOnHost": str(devdir / "nvidiactl"), "PathInContainer": "/dev/nvidiactl",
             "CgroupPermissions": "rwm"}]}), "deny", "deny", "control device"),
        Case("DRI render node", body(HostConfig={"Devices": [
            {"PathOnHost": str(devdir / "renderD128"), "PathInContainer": "/dev/dri/renderD128",
             "CgroupPermissions": "rwm"}]}), "deny", "deny", "DRM"),
        Case("cgroup rule for the nvidia major",
             body(HostConfig={"DeviceCgroupRules": ["c 195:* rwm"]}), "deny", "deny",
             "DeviceCgroupRules"),
        Case("cgroup rule for the nvidia major with a leading zero",
             body(HostConfig={"DeviceCgroupRules": ["c 0195:* rwm"]}), "deny", "deny",
             "DeviceCgroupRules"),
        Case("cgroup rule for GPU 0 spelled 000195:00",
             body(HostConfig={"DeviceCgroupRules": ["c 000195:00 rw"]}), "deny", "deny",
             "DeviceCgroupRules"),
        Case("cgroup rule for the DRM major with leading zeros",
             body(HostConfig={"DeviceCgroupRules": ["c 0226:* rwm"]}), "deny", "deny",
             "DeviceCgroupRules"),
        Case("cgroup rule with a major past int64 (dockerd refuses it too)",
             body(HostConfig={"DeviceCgroupRules": ["c 18446744073709551811:* rwm"]}),
             "deny", "deny", "DeviceCgroupRules"),
        Case("cgroup rule with a trailing newline (dockerd's regexp refuses it)",
             body(HostConfig={"DeviceCgroupRules": ["c 195:* rwm\n"]}), "deny", "deny",
             "DeviceCgroupRules"),
        Case("cgroup rule for all devices", body(HostConfig={"DeviceCgroupRules": ["a *:* rwm"]}),
             "deny", "deny", "DeviceCgroupRules"),
        Case("bind mount of /dev", body(HostConfig={"Binds": ["/dev:/dev"]}),
             "deny", "deny", "Binds"),
        Case("bind mount of the host root", body(HostConfig={"Binds": ["/:/host:ro"]}),
             "deny", "deny", "Binds"),
        Case("bind mount of containerd's socket dir",
             body(HostConfig={"Binds": ["/run/containerd:/c"]}), "deny", "deny", "Binds"),
        Case("bind mount spelled through .. and /var/run",
             body(HostConfig={"Binds": ["/var/run/../run/docker/plugins:/p"]}),
             "deny", "deny", "Binds"),
        Case("volumes-from, with nothing to look it up in",
             body(HostConfig={"VolumesFrom": ["other"]}), "deny", "deny", "VolumesFrom"),
        Case("Mounts bind of a GPU node", body(HostConfig={"Mounts": [
            {"Type": "bind", "Source": gpu0, "Target": "/dev/nvidia0"}]}),
            "deny", "deny", "Mounts"),
        Case("Mounts volume that binds /dev", body(HostConfig={"Mounts": [
            {"Type": "volume", "Source": "", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Name": "local", "Options": {"type": "none", "o": "bind", "device": "/dev"}}}}]}),
            "deny", "deny", "Mounts"),
        Case("cgroup files, writable", body(HostConfig={"Binds": [
            "/sys/fs/cgroup:/sys/fs/cgroup"]}), "deny", "deny", "/sys"),
        Case("sysfs through /dev/shm's parent", body(HostConfig={"Binds": ["/dev/shm/..:/d"]}),
             "deny", "deny", "/dev"),
        Case("Mounts volume that rbinds /dev", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Options": {"type": "none", "o": "rbind", "device": "/dev"}}}}]}),
            "deny", "deny", "Mounts"),
        Case("Mounts volume that binds the host root, recursively", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Options": {"type": "none", "o": "ro,rbind", "device": "/"}}}}]}),
            "deny", "deny", "Mounts"),
        Case("Mounts volume of type devtmpfs", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Name": "local", "Options": {"type": "devtmpfs", "device": "devtmpfs"}}}}]}),
            "deny", "deny", "devtmpfs"),
        Case("Mounts volume of type proc", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Options": {"type": "proc", "device": "proc"}}}}]}), "deny", "deny", "proc"),
        Case("Mounts volume of type sysfs", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Options": {"type": "sysfs", "device": "x"}}}}]}), "deny", "deny", "sysfs"),
        Case("Mounts volume binding a relative device", body(HostConfig={"Mounts": [
            {"Type": "volume", "Target": "/d", "VolumeOptions": {"DriverConfig": {
                "Options": {"type": "none", "o": "bind", "device": "../../dev"}}}}]}),
            "deny", "deny", "relative"),
        Case("toolkit volume-mount device list", body(HostConfig={"Mounts": [
            {"Type": "tmpfs", "Target": "/var/run/nvidia-container-devices/all"}]}),
            "deny", "deny", "nvidia-container-devices"),
        Case("toolkit device list behind a double slash", body(HostConfig={"Mounts": [
            {"Type": "tmpfs", "Target": "//var/run/nvidia-container-devices/all"}]}),
            "deny", "deny", "nvidia-container-devices"),  # Go cleans // to /
        Case("CDI annotation", body(HostConfig={
            "Annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}}), "deny", "deny", "CDI"),
        # dockerd writes ALIAS_NAME=... at start: an alias with "=" names any variable.
        Case("link alias that makes NVIDIA_VISIBLE_DEVICES", body(
            Env=["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES"],
            HostConfig={"Runtime": "nvidia",
                        "Links": ["child:NVIDIA_VISIBLE_DEVICES=all,a",
                                  "child:NVIDIA_VISIBLE_DEVICES=all,b"]}),
            "deny", "deny", "HostConfig.Links[0]"),
        Case("link alias with '=' next to a request",
             body(HostConfig={"DeviceRequests": [request(1)],
                              "Links": ["child:NVIDIA_DRIVER_CAPABILITIES=all"]}),
             "deny", "deny", "link alias"),
        Case("link alias with '=' that dockerd cleans", body(HostConfig={"Runtime": "nvidia",
             "Links": ["child:NVIDIA_VISIBLE_DEVICES=all,a/."]}), "deny", "deny", "link alias"),
        Case("plain link alias", body(HostConfig={"Links": ["child:db"]}), "allow", "allow"),
        Case("swarm-resource env next to a request",
             body(Env=["DOCKER_RESOURCE_GPU=0"], HostConfig={"DeviceRequests": [request(1)]}),
             "deny", "deny", "DOCKER_RESOURCE_GPU"),
        Case("swarm-resource env naming the GPU of NVIDIA_VISIBLE_DEVICES",
             body(Env=["NVIDIA_VISIBLE_DEVICES=2", "DOCKER_RESOURCE_GPU=2"],
                  HostConfig={"Runtime": "nvidia"}), "lease 1", "deny", "Config.Env"),
        Case("swarm-resource env naming another GPU than NVIDIA_VISIBLE_DEVICES",
             body(Env=["NVIDIA_VISIBLE_DEVICES=2", "DOCKER_RESOURCE_GPU=1"],
                  HostConfig={"Runtime": "nvidia"}), "deny", "deny", "DOCKER_RESOURCE_GPU"),
        Case("Count and DeviceIDs together",
             body(HostConfig={"DeviceRequests": [request(1, ids=["0"])]}),
             "deny", "deny", "both Count and DeviceIDs"),
        Case("unknown GPU id", body(HostConfig={"DeviceRequests": [request(ids=["9"])]}),
             "deny", "deny", "not a GPU on this host"),
        # -- other spellings of the legitimate shape: dockerd reads them, we refuse them
        Case("lower-case hostconfig",
             b'{"Image":"busybox","hostconfig":{"DeviceRequests":[{"Count":1,'
             b'"Capabilities":[["gpu"]]}]}}', "deny", "deny", "letter case"),
        Case("lower-case devicerequests",
             b'{"Image":"busybox","HostConfig":{"devicerequests":[{"Count":1,'
             b'"Capabilities":[["gpu"]]}]}}', "deny", "deny", "letter case"),
        Case("Kelvin sign in a key",
             '{"Image":"busybox","HostConfig":{"Privileged":false,"\u212aernelMemory":0}}'
             .encode(), "deny", "deny", "folding"),
        Case("repeated HostConfig",
             b'{"Image":"busybox","HostConfig":{},"HostConfig":{"Privileged":true}}',
             "deny", "deny", "more than once"),
        Case("repeated key inside a request",
             b'{"Image":"b","HostConfig":{"DeviceRequests":[{"Count":0,"Count":-1,'
             b'"Capabilities":[["gpu"]]}]}}', "deny", "deny", "more than once"),
        Case("top-level DeviceRequests (old API shape)",
             b'{"Image":"busybox","DeviceRequests":[{"Count":1,"Capabilities":[["gpu"]]}]}',
             "deny", "deny", "top-level"),
        Case("trailing second object",
             b'{"Image":"busybox"}{"HostConfig":{"Privileged":true}}', "deny", "deny", "after"),
        Case("Count as a string",
             b'{"Image":"b","HostConfig":{"DeviceRequests":[{"Count":"1"}]}}',
             "deny", "deny", "Count"),
        Case("not UTF-8", b'{"Image":"\xff"}', "deny", "deny", "UTF-8"),
        Case("escaped key spelling the canonical name",
             b'{"Image":"b","Host\\u0043onfig":{"Privileged":true}}', "deny", "deny",
             "Privileged"),
    ]  # fmt: skip


def make_nodes(devdir: Path) -> None:
    """Fake GPU nodes: what a path resolves to decides, wherever it lives."""
    devdir.mkdir(parents=True, exist_ok=True)
    for name, major, minor in (
        ("nvidia0", 195, 0),
        ("nvidiactl", 195, 255),
        ("renderD128", 226, 128),
    ):
        path = devdir / name
        if not path.exists():
            os.mknod(path, 0o600 | 0o020000, os.makedev(major, minor))
    link = devdir / "innocent"
    if not link.is_symlink():
        link.symlink_to(devdir / "nvidia0")
