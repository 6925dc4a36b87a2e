"""A Docker Swarm of several private dockerds on one machine, with fake GPUs.

The recipe is /work/shared/docs/swarm-lab.md: one network namespace per node, joined
by veth links to a bridge in a namespace of its own (only those namespaces and
loopback are ever addressed); each node's dockerd in a private mount and UTS
namespace with a fresh sysfs and the host's cgroup tree; the GPUs of each node
declared as swarm generic resources in its daemon.json, with a fake nvidia runtime
as the default runtime and the toolkit's ``swarm-resource`` set in the node's toolkit
config.toml, as docs/swarm.md has operators do.  That runtime records, for every
container it creates, the bundle's spec, then execs runc; `SwarmLab.runs` reads each
spec's GPU env and what the real toolkit would give it (tests/support/toolkit.py).

A node is a `tests.support.engine.Dockerd` run through the namespace wrapper
(`SwarmDockerd`); with ``gpu_alloc=True`` it is a `Stack` (plugin + dockerd + shim)
whose dockerd is one.  The Engine of the run: the host's 20.10, or 26 and 28 chrooted
into their Debian roots inside the node's namespaces.  Everything the lab makes
carries a name unique to it and is removed by `SwarmLab.stop`, in the order the
recipe gives, whatever failed first.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import engine, engine_root, toolkit
from tests.support.clients import docker_cli
from tests.support.engine import Dockerd, EngineError, Stack

KIND = "gpu"  # the generic-resource kind of the lab: DOCKER_RESOURCE_GPU in the task
SUBNET = "10.251.0"
JOIN_TIMEOUT = 60.0
_counter = itertools.count()

# Inside the node's netns: a private mount and UTS namespace, the node's hostname, a
# fresh sysfs (it must be mounted from inside the netns) with the host's cgroup tree
# moved back on top, then dockerd with a clean env (`ip netns exec` remounts /sys and
# loses /sys/fs/cgroup, so it cannot be used) but for the node's own TMPDIR, where its
# containerd writes a stack dump (`Dockerd.start`), so none is left in the host's /tmp.
_WRAPPER = """
d=$1; h=$2; shift 2; hostname "$h"
mount --rbind /sys/fs/cgroup "$d/cg" && mount -t sysfs sysfs /sys &&
  mount --move "$d/cg" /sys/fs/cgroup || exit 1
exec env -i PATH="$PATH" HOME=/root TMPDIR="$TMPDIR" DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 "$@"
"""

# The same inside a root Engine's Debian root (engine_root.py): the root bound on itself,
# its own proc, /dev, a fresh sysfs with the host's cgroups, private /run and /tmp, the
# lab's directory at its own path inside; then dockerd chrooted.
_ROOT_WRAPPER = """
h=$1; r=$2; lab=$3; p=$4; shift 4; hostname "$h"
mount --bind "$r" "$r" && mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" &&
  mount -t sysfs sysfs "$r/sys" && mount --rbind /sys/fs/cgroup "$r/sys/fs/cgroup" &&
  mount -t tmpfs tmpfs "$r/run" && mount -t tmpfs tmpfs "$r/tmp" &&
  mkdir -p "$r$lab" && mount --bind "$lab" "$r$lab" || exit 1
exec chroot "$r" env -i PATH="$p" HOME=/root DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 "$@"
"""

# The fake nvidia runtime: on `create`, keep the bundle's config.json as SPECS/<node>-<id>.json
# and log the node and the container id, then exec runc.
_RUNTIME = """#!/bin/sh
bundle=; prev=; cmd=; last=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; esac
  case "$a" in create) cmd=create ;; --bundle=*) bundle=${a#--bundle=} ;; esac
  prev=$a; last=$a
done
if [ "$cmd" = create ] && [ -n "$bundle" ]; then
  cp "$bundle/config.json" "SPECS/NODE-$last.json" && echo "NODE $last" >> LOG
fi
exec RUNC "$@"
"""


def uuid(node: int, index: int) -> str:
    """The fake GPU `index` of node `node` (1-based), unique across the lab."""
    return f"GPU-{node:08d}-0000-0000-0000-{index:012d}"


def missing_requirements() -> str | None:
    """Why the lab cannot run here, or None: a private dockerd, iproute2, util-linux."""
    why = engine.missing_requirements()
    if why:
        return why
    for tool in ("ip", "unshare", "nsenter"):
        if engine.which(tool) is None:
            return f"'{tool}' is not installed"
    return None


@dataclass(frozen=True)
class Run:
    """One container the fake nvidia runtime created: where, the GPU env it had (the last
    value of each `DOCKER_RESOURCE_*` and `NVIDIA_VISIBLE_DEVICES`), and the GPUs the
    node's toolkit would give it."""

    node: int
    container: str
    env: dict[str, str]
    gpus: frozenset[str]

    def resource(self, kind: str = KIND) -> str | None:
        return self.env.get("DOCKER_RESOURCE_" + kind.upper())


class SwarmDockerd(Dockerd):
    """A private dockerd run as swarm node `index` of `lab`: in the node's namespaces,
    with the lab's generic resources and the recording runtime as its default."""

    def __init__(
        self,
        lab: SwarmLab,
        index: int,
        state_dir: Path,
        toolkit_config: Path | None = None,
        **kwargs: object,
    ) -> None:
        """``toolkit_config``: the node's toolkit config.toml when `gpu-alloc swarm
        configure` completes it; else the node writes its own."""
        super().__init__(state_dir, **kwargs)  # type: ignore[arg-type]
        self.lab = lab
        self.index = index
        self._toolkit_config = toolkit_config

    @property
    def toolkit_config(self) -> Path:
        return self._toolkit_config or super().toolkit_config

    @property
    def hostname(self) -> str:
        return f"{self.lab.name}-n{self.index}"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    def write_daemon_json(self, resources: bool = True) -> None:
        """The recording runtime declared as `nvidia`; with ``resources``, also the node's
        GPUs as generic resources and nvidia as the default runtime, as the lab's recipe
        has them (without: `gpu-alloc swarm configure` adds those)."""
        runtime = self.dir / "swarm-runtime"
        runtime.write_text(
            _RUNTIME.replace("NODE", str(self.index))
            .replace("LOG", str(self.lab.runtime_log))
            .replace("SPECS", str(self.lab.specs))
            .replace("RUNC", self._runc())
        )
        runtime.chmod(0o755)
        daemon: dict[str, object] = {"runtimes": {"nvidia": {"path": str(runtime)}}}
        if resources:
            daemon["node-generic-resources"] = [
                f"{self.lab.kind}={u}" for u in self.lab.swarm_gpus(self.index)
            ]
            daemon["default-runtime"] = "nvidia"
            variable = f"DOCKER_RESOURCE_{self.lab.kind.upper()}"
            self.toolkit_config.write_text(f'swarm-resource = "{variable}"\n')
        (self.dir / "daemon.json").write_text(json.dumps(daemon) + "\n")

    def _runc(self) -> str:
        root = engine_root.ensure_root(self.engine) if self.engine.root else None
        if root is not None:
            return engine_root.find_in_root(root, "/usr/sbin/runc", "/usr/bin/runc") or "runc"
        return engine.find_runc() or "runc"

    def _namespaces(self) -> list[str]:
        """Into the node's netns, in a private mount and UTS namespace."""
        netns = f"/run/netns/{self.lab.node_netns(self.index)}"
        return ["unshare", "-m", "-u", "--propagation", "private", "nsenter", f"--net={netns}"]

    def argv(self) -> list[str]:
        """dockerd's command line: for the host's Engine, wrapped in the node's namespaces;
        for a root Engine, dockerd's own (`root_launcher` wraps it)."""
        (self.dir / "cg").mkdir(exist_ok=True)
        # dockerd checks the file's default runtime before it merges the flags: the nvidia
        # runtime is declared in the file, so not as a flag.
        inner = [a for a in super().argv() if not a.startswith("--add-runtime=nvidia=")]
        if self.engine.root is not None:
            return inner  # it has its --cgroup-parent already
        inner.append(f"--cgroup-parent=/{self.namespace}")
        return [
            *self._namespaces(), "sh", "-c", _WRAPPER, "sh", str(self.dir), self.hostname,
            *inner,
        ]  # fmt: skip

    def root_launcher(self, root: Path, path: str) -> list[str]:
        return [
            *self._namespaces(), "sh", "-c", _ROOT_WRAPPER, "sh", self.hostname, str(root),
            str(self.lab.dir), path, *self.argv(),
        ]  # fmt: skip

    def start(self) -> SwarmDockerd:
        if not (self.dir / "daemon.json").exists():  # else `gpu-alloc swarm configure` wrote it
            self.write_daemon_json()
        super().start()
        if self.proc is not None and self._mnt_ns is None:  # a root Engine's is held already
            self._mnt_ns = engine_root.hold_namespace(self.proc.pid)
        return self

    def stop(self, remove: bool = True) -> None:
        super().stop(remove=False)
        # The containerd and shims left in the node's mount namespace, and its cgroups.
        if self._mnt_ns is not None:
            engine_root.kill_namespace(self._mnt_ns)
            os.close(self._mnt_ns)
            self._mnt_ns = None
        engine_root.remove_cgroups(self.namespace)
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


class SwarmStack(Stack):
    """gpu-alloc's plugin and shim for one swarm node, its dockerd a `SwarmDockerd` whose
    daemon.json `gpu-alloc swarm configure` completes, as an operator would."""

    def __init__(self, lab: SwarmLab, index: int) -> None:
        sim = [
            {"uuid": uuid(index, k), "index": k, "minor": k, "numa_node": 0,
             "name": "Simulated GPU", "memory_mib": 81920,
             "pci_bus_id": f"00000000:{0x10 + k:02X}:00.0"}
            for k in range(lab.gpus_per_node + lab.local_gpus)
        ]  # fmt: skip
        directory = lab.dir / f"s{index}"
        swarm = {"gpus": lab.swarm_gpus(index), "toolkit_config": str(directory / "config.toml"),
                 "kind": lab.kind, **lab.swarm}  # fmt: skip
        super().__init__(directory, sim=sim, extra={"swarm": swarm}, policy=lab.policy)
        self.lab = lab
        self.index = index

    def _new_dockerd(self) -> Dockerd:
        node = SwarmDockerd(
            self.lab,
            self.index,
            self.engine_dir,
            self.dir / "config.toml",
            authz_plugin_socket=self.plugin_sock,
            plugin_name=self.plugin_name,
        )
        node.write_daemon_json(resources=False)
        done = engine.gpu_alloc(self, "swarm", "configure")
        if done.returncode != 0:
            raise EngineError(f"gpu-alloc swarm configure: {done.stderr.strip()}")
        return node


class SwarmLab:
    """`nodes` swarm nodes (node 1 the manager), `gpus_per_node` fake GPUs each for swarm.

    ``gpu_alloc``: each node runs gpu-alloc's plugin and shim (`stacks`) with ``swarm.gpus``
    those GPUs (of ``kind``: ``swarm.kind``), and `local_gpus` more that swarm does not
    get, and `policy` (extra keys of the config's ``policy:``); clients' socket is
    `shim(i)`, and `sock(i)` dockerd's own (behind the plugin).
    """

    def __init__(
        self,
        nodes: int = 2,
        gpus_per_node: int = 2,
        gpu_alloc: bool = False,
        local_gpus: int = 0,
        policy: Mapping[str, Any] | None = None,
        kind: str = KIND,
        swarm: Mapping[str, Any] | None = None,
    ) -> None:
        self.count = nodes
        self.swarm = dict(swarm or {})  # extra keys of each node's config's ``swarm:``
        self.kind = kind  # the generic-resource kind of its GPUs (swarm.kind)
        self.gpus_per_node = gpus_per_node
        self.local_gpus = local_gpus  # with gpu_alloc: GPUs of each node not given to swarm
        self.gpu_alloc = gpu_alloc
        self.policy = dict(policy or {})
        self.dir = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
        self.name = f"gs{os.getpid() % 100000}x{next(_counter)}"
        self.runtime_log = self.dir / "runtime.log"
        self.runtime_log.touch()
        self.specs = self.dir / "specs"  # each created container's OCI spec
        self.specs.mkdir()
        self.nodes: dict[int, SwarmDockerd] = {}
        self.stacks: dict[int, SwarmStack] = {}
        self._netns: list[str] = []

    def swarm_gpus(self, index: int) -> list[str]:
        """Node `index`'s GPUs given to swarm: its first `gpus_per_node`."""
        return [uuid(index, k) for k in range(self.gpus_per_node)]

    def node_gpus(self, index: int) -> list[str]:
        """All of node `index`'s GPUs, in index order (those for local leases last)."""
        more = self.local_gpus if self.gpu_alloc else 0
        return [uuid(index, k) for k in range(self.gpus_per_node + more)]

    def node_netns(self, index: int) -> str:
        return f"{self.name}-n{index}"

    def sock(self, index: int) -> str:
        """Node `index`'s dockerd socket (behind its plugin when it runs gpu-alloc)."""
        return self.nodes[index].sock

    def shim(self, index: int) -> str:
        return self.stacks[index].shim_sock

    def docker(self, index: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """The docker CLI against node `index`'s dockerd."""
        return docker_cli(self.sock(index), *args, timeout=timeout)

    # ------------------------------------------------------------------ start

    def start(self) -> SwarmLab:
        try:
            self._network()
            for i in range(1, self.count + 1):
                self._node(i)
            self._swarm()
        except BaseException:
            self.stop()
            raise
        return self

    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EngineError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def _network(self) -> None:
        br = f"{self.name}-br"
        self._ip("netns", "add", br)
        self._netns.append(br)
        self._ip("-n", br, "link", "set", "lo", "up")
        self._ip("-n", br, "link", "add", "br0", "type", "bridge")
        self._ip("-n", br, "link", "set", "br0", "up")
        for i in range(1, self.count + 1):
            ns = self.node_netns(i)
            self._ip("netns", "add", ns)
            self._netns.append(ns)
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", br, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                     "netns", ns)  # fmt: skip
            self._ip("-n", br, "link", "set", f"v{i}", "master", "br0", "up")
            self._ip("-n", ns, "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")

    def _node(self, i: int) -> None:
        if self.gpu_alloc:
            stack = SwarmStack(self, i)
            self.stacks[i] = stack
            stack.start()
            assert isinstance(stack.dockerd, SwarmDockerd)
            self.nodes[i] = stack.dockerd
            return
        node = SwarmDockerd(self, i, self.dir / f"n{i}")
        self.nodes[i] = node
        node.start()
        engine.import_busybox(node.sock)

    def _swarm(self) -> None:
        manager = self.nodes[1]
        self._check(self.docker(1, "swarm", "init", "--advertise-addr", manager.address))
        token = self._check(self.docker(1, "swarm", "join-token", "-q", "worker")).strip()
        for i in range(2, self.count + 1):
            self._check(
                self.docker(i, "swarm", "join", "--advertise-addr", self.nodes[i].address,
                            "--token", token, f"{manager.address}:2377")
            )  # fmt: skip
        deadline = time.monotonic() + JOIN_TIMEOUT
        while True:
            out = self.docker(1, "node", "ls", "--format", "{{.Status}}").stdout.split()
            if len(out) == self.count and all(s == "Ready" for s in out):
                return
            if time.monotonic() > deadline:
                raise EngineError(f"swarm nodes not Ready after {JOIN_TIMEOUT:.0f} s: {out}")
            time.sleep(0.2)

    @staticmethod
    def _check(done: subprocess.CompletedProcess) -> str:
        if done.returncode != 0:
            raise EngineError(f"{' '.join(map(str, done.args))}: {done.stderr.strip()}")
        return str(done.stdout)

    # ------------------------------------------------------------------ reading

    def runs(self) -> list[Run]:
        """Every container the fake runtime created on any node, oldest first."""
        out = []
        for line in self.runtime_log.read_text().splitlines():
            node, container = line.split()
            spec = json.loads((self.specs / f"{node}-{container}.json").read_text())
            env = (str(e) for e in (spec.get("process") or {}).get("env") or ())
            gpu_env = ("DOCKER_RESOURCE_", "NVIDIA_VISIBLE_DEVICES=")
            config = toolkit.Config.from_toml(self.nodes[int(node)].toolkit_config.read_text())
            chosen = toolkit.of_spec(spec, config)
            out.append(
                Run(int(node), container,
                    dict(e.split("=", 1) for e in env if e.startswith(gpu_env)),
                    frozenset(toolkit.gpus(chosen, self.node_gpus(int(node)))))
            )  # fmt: skip
        return out

    def task_runs(self, service: str, count: int) -> list[Run]:
        """The runtime's record of the service's running task containers, once `count` run
        (or after a minute, however many do)."""
        deadline = time.monotonic() + 60
        label = f"label=com.docker.swarm.service.name={service}"
        while True:
            ids = {
                (i, cid)
                for i in self.nodes
                for cid in self.docker(
                    i, "ps", "-q", "--no-trunc", "--filter", label
                ).stdout.split()
            }
            runs = [r for r in self.runs() if (r.node, r.container) in ids]
            if len(runs) >= count or time.monotonic() > deadline:
                return runs
            time.sleep(0.3)

    def task_states(self, service: str) -> list[str]:
        """The current state word of each of the service's tasks meant to run."""
        done = self.docker(
            1, "service", "ps", service, "--filter", "desired-state=running",
            "--format", "{{.CurrentState}}",
        )  # fmt: skip
        return [ln.split()[0] for ln in done.stdout.splitlines() if ln.strip()]

    def remove_services(self) -> None:
        """Remove every service; wait until no task container is left on any node."""
        names = self.docker(1, "service", "ls", "-q").stdout.split()
        if names:
            self.docker(1, "service", "rm", *names)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            tasks = ("ps", "-q", "--filter", "label=com.docker.swarm.task")
            if not any(self.docker(i, *tasks).stdout.split() for i in self.nodes):
                return
            time.sleep(0.3)

    def clear(self) -> None:
        """No service and no container left on any node: what the next test starts from."""
        self.remove_services()
        for i in self.nodes:
            engine.remove_all_containers(self.sock(i))

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Services, swarm membership, dockerds (and plugins), namespaces, cgroups, files."""
        with contextlib.suppress(Exception):
            if 1 in self.nodes and engine.ping(self.sock(1)):
                names = self.docker(1, "service", "ls", "-q", timeout=20).stdout.split()
                if names:
                    self.docker(1, "service", "rm", *names, timeout=20)
        for i in sorted(self.nodes, reverse=True):
            with contextlib.suppress(Exception):
                if engine.ping(self.sock(i)):
                    self.docker(i, "swarm", "leave", "--force", timeout=20)
        for i in sorted(set(self.nodes) | set(self.stacks), reverse=True):
            with contextlib.suppress(Exception):
                if i in self.stacks:
                    self.stacks[i].stop()
                else:
                    self.nodes[i].stop()
        self.nodes.clear()
        self.stacks.clear()
        for ns in reversed(self._netns):  # the nodes' first, the bridge's last
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self._netns.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SwarmLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stack_file(directory: Path, services: Sequence[tuple[str, int, int]]) -> Path:
    """A Compose file (3.8) of busybox services (name, replicas, GPUs per task) that reserve
    `KIND` generic resources, stop on SIGKILL (busybox sleep ignores SIGTERM), sleep.

    They join the host network: a stack's own overlay network updates every node's
    attachments, and dockerd 20.10 then rejects generic-resource tasks (moby#44378).
    """
    body: dict[str, object] = {
        "version": "3.8",
        "services": {},
        "networks": {"hostnet": {"external": True, "name": "host"}},
    }
    for name, replicas, gpus in services:
        body["services"][name] = {  # type: ignore[index]
            "image": engine.BUSYBOX_TAG,
            "command": ["sleep", "600"],
            "stop_signal": "SIGKILL",
            "networks": ["hostnet"],
            "deploy": {
                "replicas": replicas,
                "resources": {"reservations": {"generic_resources": [
                    {"discrete_resource_spec": {"kind": KIND, "value": gpus}}
                ]}},
            },
        }  # fmt: skip
    path = directory / "stack.yml"
    path.write_text(json.dumps(body, indent=1))
    return path
