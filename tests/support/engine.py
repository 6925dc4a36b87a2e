"""Real, private Docker Engines for tests and benchmarks.

gpu-alloc sits between clients and dockerd, so the only convincing tests run a
real dockerd.  Each `Dockerd` here gets its own data-root, exec-root, socket
and managed containerd (dockerd 20.10 starts one per exec-root), so a test
engine and a benchmark engine can run side by side and never touch the host's
own Docker.  There is no network: no bridge, no iptables.

GPUs are faked on the Engine side only: a fake `nvidia-container-runtime-hook` on
dockerd's PATH makes dockerd register its nvidia device driver (so `--gpus` works and
sets NVIDIA_VISIBLE_DEVICES), and an `nvidia` runtime that simply execs runc lets
`--runtime nvidia` be accepted.  The hook only records the spec it is run for;
`Dockerd.toolkit_devices` says what the real toolkit would give (tests/support/toolkit.py).

Which dockerd runs is the Engine of the run (`engine_root.selected()`, from
$GA_ENGINE): the host's 20.10, or 26/28/29 from a debootstrapped Debian root, run in
a private mount namespace (tests/support/engine_root.py).  With $GA_GPU_MODE=cdi (or a
Dockerd's `gpu_mode`) dockerd gives `--gpus` through CDI instead (tests/support/cdi.py).

Plain functions and classes, no pytest: conftest.py and tests/bench.py both
build on them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import yaml

from allocator.core.access import builds
from tests.support import cdi, engine_root, toolkit
from tests.support.busybox_image import BUSYBOX_TAG, busybox_rootfs_tar, import_busybox  # noqa: F401
from tests.support.clients import (  # noqa: F401
    compose_name,
    compose_v2,
    compose_version,
    docker_cli,
    docker_compose,
    which,
)
from tests.support.engine_root import Engine

PLUGIN_SPEC_DIR = Path("/etc/docker/plugins")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
# The deepest socket dockerd makes is <exec-root>/containerd/containerd.sock.ttrpc (49 more
# bytes below the state dir), and sun_path holds 107: keep well clear of it.
MAX_STATE_DIR = 48

_counter = itertools.count()


class EngineError(RuntimeError):
    """A private engine (or a process of the stack) did not come up or misbehaved."""


def missing_requirements(engine: Engine | None = None) -> str | None:
    """Why a private dockerd cannot run here, or None when it can.

    dockerd needs root (mounts, cgroups) and the Debian docker.io package; a root Engine
    needs debootstrap (to build its root) and util-linux's unshare (to run it).
    """
    engine = engine or engine_root.selected()
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    tools = ("dockerd", "containerd", "busybox")
    if engine.root is not None:
        tools = ("unshare", "chroot", "busybox", "docker")
        if not (engine.root / engine_root.STAMP).exists():
            tools += ("debootstrap",)
        return next((f"'{t}' is not installed (make deps)" for t in tools if not which(t)), None)
    for tool in tools:
        if which(tool) is None:
            return f"'{tool}' is not installed (make deps)"
    if find_runc() is None:
        return "'runc' is not installed (make deps)"
    return None


def find_runc() -> str | None:
    """Debian ships runc as /usr/sbin/runc (with a /usr/bin/runc link)."""
    return which("runc")


# The fake hook: at prestart, copy the bundle's config.json to <dir>/toolkit/<id>.json when
# that directory exists (`Dockerd` makes it), for `toolkit` to judge; never fail the start.
_HOOK = """#!/bin/sh
[ "$1" = prestart ] || exit 0
dir=$(dirname "$0")/../toolkit
[ -d "$dir" ] || exit 0
state=$(cat)
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle": *"\\([^"]*\\)".*/\\1/p')
id=$(printf '%s' "$state" | sed -n 's/.*"id": *"\\([^"]*\\)".*/\\1/p')
[ -n "$id" ] && cp "$bundle/config.json" "$dir/$id.json"
exit 0
"""


def prepare_host_tools(directory: str | os.PathLike[str], runc: str | None = None) -> Path:
    """Write the fake NVIDIA host tools into `directory`/bin and return that bin dir.

    `runc`: the runc the fake nvidia runtime execs (inside a root: the root's own).
    """
    runc = runc or find_runc()
    if runc is None:
        raise EngineError("runc not found; install docker.io (make deps)")
    bin_dir = Path(directory) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        # Its presence on PATH is all dockerd checks before registering the nvidia driver;
        # the driver adds it as a prestart hook, where exiting 0 changes nothing.
        "nvidia-container-runtime-hook": _HOOK,
        "nvidia-container-runtime": f'#!/bin/sh\nexec {runc} "$@"\n',
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return bin_dir


def ping(sock: str | os.PathLike[str], timeout: float = 2.0) -> bool:
    """True when an Engine answers GET /_ping with 200 OK on the unix socket `sock`."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(os.fspath(sock))
            s.sendall(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def can_connect(sock: str | os.PathLike[str]) -> bool:
    """True when something accepts connections on the unix socket `sock`."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(os.fspath(sock))
            return True
    except OSError:
        return False


def log_tail(path: str | os.PathLike[str], lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    ready: Callable[[], bool],
    what: str,
    proc: subprocess.Popen | None,
    log: str | os.PathLike[str],
    timeout: float,
) -> None:
    """Poll `ready()` until true; fail early, with the log's tail, if `proc` exits."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise EngineError(
                f"{what} exited with status {proc.returncode} before it was ready; "
                f"log {log}:\n{log_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise EngineError(
                f"{what} not ready after {timeout:.0f} s; log {log}:\n{log_tail(log)}"
            )
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group we started, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _unmount_under(root: Path) -> None:
    """Lazily unmount whatever a killed dockerd left mounted below `root` (deepest first)."""
    prefix = str(root).rstrip("/") + "/"
    mounts = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def check_short(state_dir: Path) -> None:
    """Refuse a state dir too deep for the unix sockets dockerd and containerd make below it."""
    if len(str(state_dir)) > MAX_STATE_DIR:
        raise EngineError(
            f"{state_dir} is too long for unix socket paths (max {MAX_STATE_DIR} characters); "
            'use tempfile.mkdtemp(prefix="ga-", dir="/tmp") or pass no directory'
        )


def _spawn(
    argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen:
    with open(log, "ab") as out:
        # A session of its own: we stop it (and its children) as a group, and a Ctrl-C
        # in the terminal does not kill it before the test's teardown runs.
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )


class Dockerd:
    """A private dockerd under a short /tmp/ga-XXXX state directory.

    Paths stay short because a unix socket path is limited to 108 bytes and
    dockerd puts containerd's sockets several levels below exec-root.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        authz_plugin_socket: str | os.PathLike[str] | None = None,
        plugin_name: str | None = None,
        extra_args: Iterable[str] = (),
        start_timeout: float = START_TIMEOUT,
        engine: Engine | None = None,
        gpu_mode: str | None = None,
        gpus: Sequence[str] = (),
    ) -> None:
        """``gpu_mode``: how dockerd gives `--gpus` (tests/support/cdi.py), default the run's;
        ``gpus``: the UUIDs its CDI spec names, default eight simulated GPUs."""
        self.engine = engine or engine_root.selected()
        self.gpu_mode = gpu_mode or cdi.mode()
        self.gpus = tuple(gpus) or tuple(sim_gpu_uuid(k) for k in range(8))
        self._own_dir = state_dir is None
        self.dir = Path(state_dir or tempfile.mkdtemp(prefix="ga-", dir="/tmp"))
        check_short(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sock = str(self.dir / "docker.sock")
        self.log = self.dir / "dockerd.log"
        self.authz_plugin_socket = (
            os.fspath(authz_plugin_socket) if authz_plugin_socket is not None else None
        )
        self.plugin_name = plugin_name or f"gpu-alloc-test-{os.getpid()}-{next(_counter)}"
        spec_dir = PLUGIN_SPEC_DIR
        if self.engine.root is not None:  # dockerd reads plugin specs inside its root
            spec_dir = self.engine.root / "etc/docker/plugins"
        self.spec_path = spec_dir / f"{self.plugin_name}.spec"
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self._mnt_ns: int | None = None  # an fd holding dockerd's mount namespace

    @property
    def namespace(self) -> str:
        return "ga-" + hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]

    @property
    def url(self) -> str:
        return "unix://" + self.sock

    def argv(self) -> list[str]:
        """dockerd's own command line (inside the root for a root Engine)."""
        dockerd = "dockerd" if self.engine.root else (which("dockerd") or "dockerd")
        d = self.dir
        argv = [
            dockerd,
            # An empty daemon.json: never pick up the host's /etc/docker/daemon.json.
            f"--config-file={d / 'daemon.json'}",
            f"--data-root={d / 'root'}",
            f"--exec-root={d / 'exec'}",
            f"--host={self.url}",
            f"--pidfile={d / 'pid'}",
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            "--ip6tables=false",
            "--shutdown-timeout=2",
            # dockerd 20.10 uses the host's containerd whenever /run/containerd/containerd.sock
            # exists (apt starts one on systemd hosts) instead of a managed one under exec-root;
            # namespaces of our own keep engines sharing it from seeing each other's containers.
            f"--containerd-namespace={self.namespace}",
            f"--containerd-plugins-namespace={self.namespace}-plugins",
            f"--add-runtime=nvidia={d / 'bin' / 'nvidia-container-runtime'}",
        ]
        if self.engine.root is not None:
            # Containers in cgroups of our own, removed with the engine (engine_root.py).
            argv.append(f"--cgroup-parent=/{self.namespace}")
        if self.authz_plugin_socket is not None:
            argv.append(f"--authorization-plugin={self.plugin_name}")
        return argv + self.extra_args

    def _binds(self) -> list[Path]:
        """The host directories a root Engine must see at the same paths: the state dir
        and the plugin socket's directory (one bind when one holds the other)."""
        dirs = [self.dir.resolve()]
        if self.authz_plugin_socket is not None:
            dirs.append(Path(self.authz_plugin_socket).parent.resolve())
        dirs.sort(key=lambda p: len(p.parts))
        out: list[Path] = []
        for d in dirs:
            if not any(d == o or o in d.parents for o in out):
                out.append(d)
        return out

    def root_launcher(self, root: Path, path: str) -> list[str]:
        """The command line that runs dockerd inside a root Engine's `root` with `path` as
        its PATH (a swarm node puts its own namespaces around it: tests/support/swarm.py)."""
        return engine_root.root_launcher(root, self._binds(), path, self.argv())

    def start(self) -> Dockerd:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        root = engine_root.ensure_root(self.engine) if self.engine.root else None
        runc = None
        if root is not None:
            runc = engine_root.find_in_root(root, "/usr/sbin/runc", "/usr/bin/runc")
        bin_dir = prepare_host_tools(self.dir, runc)
        (self.dir / "toolkit").mkdir(exist_ok=True)  # where the fake hook records specs
        daemon_json = self.dir / "daemon.json"
        if not daemon_json.exists() or not daemon_json.read_text().strip():
            daemon_json.write_text("{}\n")
        if self.gpu_mode == "cdi":
            major = int(self.engine.version.split(".")[0])
            adds = cdi.prepare(self.dir, bin_dir, major, self.gpus)
            config = json.loads(daemon_json.read_text())
            features = {**config.get("features", {}), **adds.pop("features")}
            daemon_json.write_text(json.dumps({**config, **adds, "features": features}) + "\n")
        if self.authz_plugin_socket is not None:
            # dockerd waits ~16 s for a named plugin, then exits: the plugin must already
            # be listening, or the start fails with a clear message rather than a timeout.
            if not can_connect(self.authz_plugin_socket):
                raise EngineError(f"authz plugin socket {self.authz_plugin_socket} not listening")
            PLUGIN_SPEC_DIR.mkdir(parents=True, exist_ok=True)
            forget_dead_specs(self.spec_path.parent)
            self.spec_path.write_text(f"unix://{self.authz_plugin_socket}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        # What dockerd and its containerd write to their temporary directory (containerd's
        # stack dumps, named containerd.<pid>.stacks.log) goes with the state directory.
        (self.dir / "tmp").mkdir(exist_ok=True)
        env["TMPDIR"] = str(self.dir / "tmp")
        if root is None:
            env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", ""), "/usr/sbin:/sbin"])
            argv = self.argv()
        else:
            # The fake hook must be on dockerd's PATH when it starts, or no nvidia driver.
            path = f"{bin_dir}:{engine_root.ROOT_PATH}"
            argv = self.root_launcher(root, path)
        self.proc = _spawn(argv, self.log, env)
        wait_until(lambda: ping(self.sock), "dockerd", self.proc, self.log, self.start_timeout)
        if root is not None:
            self._mnt_ns = engine_root.hold_namespace(self.proc.pid)

    def stop(self, remove: bool = True) -> None:
        """Stop dockerd (and its managed containerd); remove the state dir we created."""
        if self.proc is not None:
            self._kill_containers()
            stop_process(self.proc)
            self.proc = None
        if self.engine.root is not None:
            # Whatever dockerd left in its namespace and cgroups, by namespace, never by name.
            if self._mnt_ns is not None:
                engine_root.kill_namespace(self._mnt_ns)
                os.close(self._mnt_ns)  # the namespace, and its mounts, go with the last user
                self._mnt_ns = None
            engine_root.remove_cgroups(self.namespace)
        # After a SIGKILL the managed containerd may outlive dockerd; it is ours to end.
        pid_file = self.dir / "exec" / "containerd" / "containerd.pid"
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            self.spec_path.unlink()
        _unmount_under(self.dir)
        if remove and self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_containers(self) -> None:
        """SIGKILL running containers: a graceful dockerd shutdown waits 10 s for each one
        whose PID 1 ignores SIGTERM (any busybox `sleep`). Best effort: the plugin may be down."""
        if self.proc is None or self.proc.poll() is not None or not ping(self.sock):
            return
        with contextlib.suppress(Exception):
            api = engine_api(self.sock, timeout=5)
            try:
                for container in api.containers(quiet=True):
                    with contextlib.suppress(Exception):
                        api.kill(container["Id"])
            finally:
                api.close()

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)

    @property
    def toolkit_config(self) -> Path:
        """The toolkit config.toml the fake hook stands in for; none: the defaults."""
        return self.dir / "toolkit.toml"

    def toolkit_devices(self, container: str) -> list[str]:
        """The devices the real toolkit's hook would give `container` (its full id) at its
        last start, from the spec the fake hook recorded; none recorded: no hook ran."""
        try:
            spec = json.loads((self.dir / "toolkit" / f"{container}.json").read_text())
        except FileNotFoundError:
            return []
        try:
            config = toolkit.Config.from_toml(self.toolkit_config.read_text())
        except FileNotFoundError:
            config = toolkit.Config()
        return toolkit.of_spec(spec, config)

    def toolkit_gpus(self, container: str) -> set[str]:
        """The UUIDs of `toolkit_devices`, its indices read in this Engine's GPU order."""
        return toolkit.gpus(self.toolkit_devices(container), self.gpus)

    def __enter__(self) -> Dockerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def engine_api(sock: str | os.PathLike[str], timeout: float = 60) -> docker.APIClient:
    """A low-level docker SDK client on the unix socket `sock`."""
    return docker.APIClient(base_url="unix://" + os.fspath(sock), version="auto", timeout=timeout)


# ---------------------------------------------------------------------------------------------
# The full stack: plugin process + dockerd with --authorization-plugin + shim process.
# The lead owns the gpu-alloc commands; this only starts them the way an operator would.
# ---------------------------------------------------------------------------------------------


def sim_gpu_uuid(index: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{index:012d}"


def forget_dead_specs(spec_dir: Path) -> None:
    """Remove test plugin specs whose socket no longer answers (a run killed mid-way).

    dockerd reads every spec when it looks for volume drivers, and waits about 15 s on
    each dead one: a leftover made `docker volume` calls, and creates with named volumes,
    hang on later runs.  A spec is written only once its plugin listens, so a live
    Engine's spec always answers.
    """
    for spec in spec_dir.glob("gpu-alloc-test-*.spec"):
        with contextlib.suppress(OSError):
            sock = spec.read_text().strip().removeprefix("unix://")
            if not can_connect(sock):
                spec.unlink()


def write_sim_gpus(path: str | os.PathLike[str], count: int, cuda: str | None = None) -> Path:
    """A simulated-GPUs YAML file: `count` GPUs, two per NUMA node; `cuda`: the driver's."""
    gpus = [
        {
            "uuid": sim_gpu_uuid(k),
            "index": k,
            "minor": k,
            "numa_node": k // 2,
            "name": "Simulated GPU",
            "memory_mib": 81920,
            "pci_bus_id": f"00000000:{0x10 + k:02X}:00.0",
        }
        for k in range(count)
    ]
    path = Path(path)
    data: object = gpus if cuda is None else {"cuda_driver_version": cuda, "gpus": gpus}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def gpu_alloc_command() -> list[str]:
    """The `gpu-alloc` console script of the interpreter running the tests (the venv's)."""
    script = Path(sys.prefix) / "bin" / "gpu-alloc"
    if not script.exists():
        raise EngineError(f"{script} missing; run `make venv` (pip install -e '.[test]')")
    return [str(script)]


def gpu_alloc(config: Stack | Path, *args: str) -> subprocess.CompletedProcess:
    """`gpu-alloc --config CONFIG ARGS` (a stack's config, or a file), as an operator runs it;
    its exit status is the caller's to check."""
    path = config.config_path if isinstance(config, Stack) else config
    return subprocess.run(
        [*gpu_alloc_command(), "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class Stack:
    """gpu-alloc plugin + private dockerd using it + gpu-alloc shim, all under one short dir.

    Clients talk to `shim_sock`; `engine_sock` is the private dockerd itself (bypassing
    the shim, but still behind the plugin).
    """

    def __init__(
        self,
        tmp: str | os.PathLike[str] | None = None,
        gpus: int = 4,
        cuda: str | None = None,
        extra: dict[str, dict[str, object]] | None = None,
        policy: Mapping[str, Any] | None = None,
        sim: object | None = None,
    ) -> None:
        """``config``: sections merged over the defaults (``{"health": {...}}``); ``sim``:
        the simulated-GPU file's content instead of `write_sim_gpus`' (MIG slices, say)."""
        self.cuda = cuda
        self.extra = extra or {}  # config sections merged over the defaults below
        self.policy = dict(policy or {})  # extra policy: keys (limits, pools, mig, ...)
        self.sim = sim  # the simulated GPU file's content, instead of `gpus` plain GPUs
        self._own_dir = tmp is None
        self.dir = Path(tmp or tempfile.mkdtemp(prefix="ga-", dir="/tmp"))
        check_short(self.dir / "e")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.gpu_count = gpus
        self.plugin_name = f"gpu-alloc-test-{os.getpid()}-{next(_counter)}"
        self.engine_dir = self.dir / "e"
        self.engine_sock = str(self.engine_dir / "docker.sock")
        self.shim_sock = str(self.dir / "shim.sock")
        self.plugin_sock = str(self.dir / "plugin.sock")
        self.state_dir = self.dir / "state"
        self.gpus_file = self.dir / "gpus.yaml"
        self.config_path = self.dir / "config.yaml"
        self.plugin: subprocess.Popen | None = None
        self.shim: subprocess.Popen | None = None
        self.dockerd: Dockerd | None = None
        # Put before the plugin's and the shim's command: a sandbox to run them in.
        self.launcher: list[str] = []
        self.gpu_mode: str | None = None  # dockerd's --gpus mode (cdi.py); None: the run's

    def write_config(self) -> Path:
        if self.sim is None:
            write_sim_gpus(self.gpus_file, self.gpu_count, self.cuda)
        else:
            self.gpus_file.write_text(yaml.safe_dump(self.sim, sort_keys=False))
        self.state_dir.mkdir(exist_ok=True)
        config = {
            "engine": {"socket": self.engine_sock, "timeout": 10,
                       "daemon_json": str(self.engine_dir / "daemon.json")},
            "shim": {"socket": self.shim_sock, "mode": "0660", "group": None,
                     "create_timeout": 120},
            "plugin": {"socket": self.plugin_sock, "name": self.plugin_name, "workers": 2},
            "policy": {"placement": "best-effort", "lock_timeout": 5, "pending_ttl": 300,
                       **self.policy},
            "state_dir": str(self.state_dir),
            "gpus": str(self.gpus_file),
        }  # fmt: skip
        for section, values in self.extra.items():
            config[section] = {**(config.get(section) or {}), **values}  # type: ignore[dict-item]
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        return self.config_path

    def _serve(self, role: str, sock: str) -> subprocess.Popen:
        log = self.dir / f"{role}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        argv = [*self.launcher, *gpu_alloc_command(), "--config", str(self.config_path), role]
        proc = _spawn(argv, log, env)
        wait_until(lambda: can_connect(sock), f"gpu-alloc {role}", proc, log, START_TIMEOUT)
        return proc

    def start(self) -> Stack:
        self.write_config()
        daemon_json = self.engine_dir / "daemon.json"
        if not daemon_json.exists() or not daemon_json.read_text().strip():
            # What deploy/install.sh writes besides the plugin's name (named here by flag).
            self.engine_dir.mkdir(parents=True, exist_ok=True)
            daemon_json.write_text(json.dumps(builds.CLOSED) + "\n")
        try:
            self.plugin = self._serve("plugin", self.plugin_sock)
            self.dockerd = self._new_dockerd().start()
            import_busybox(self.engine_sock)
            self.shim = self._serve("shim", self.shim_sock)
        except BaseException:
            self.stop()
            raise
        return self

    def _new_dockerd(self) -> Dockerd:
        """The private dockerd, using the plugin (subclasses put things in between)."""
        return Dockerd(
            self.engine_dir,
            authz_plugin_socket=self.plugin_sock,
            plugin_name=self.plugin_name,
            gpu_mode=self.gpu_mode,
            gpus=self.uuids(),
        )

    def uuids(self) -> list[str]:
        """The simulated GPUs' UUIDs (MIG slices' parents too), as the GPU file lists them."""
        data = yaml.safe_load(self.gpus_file.read_text())
        gpus = data.get("gpus", []) if isinstance(data, dict) else data
        return [str(g["uuid"]) for g in gpus or () if isinstance(g, dict) and "uuid" in g]

    def stop(self) -> None:
        # The shim first (no new clients), dockerd before the plugin (dockerd's shutdown
        # requests must not hit a dead plugin).
        if self.shim is not None:
            stop_process(self.shim)
            self.shim = None
        if self.dockerd is not None:
            self.dockerd.stop(remove=False)
            self.dockerd = None
        if self.plugin is not None:
            stop_process(self.plugin)
            self.plugin = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self, lines: int = 40) -> str:
        """The tail of every log in the stack, for assertion messages."""
        parts = []
        for name in ("plugin.log", "shim.log", "e/dockerd.log"):
            parts.append(f"--- {name}\n{log_tail(self.dir / name, lines)}")
        return "\n".join(parts)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def remove_all_containers(sock: str | os.PathLike[str]) -> None:
    """Remove every container through `sock` (the real socket: the plugin lets it through)."""
    api = engine_api(sock)
    try:
        for c in api.containers(all=True):
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_container(c["Id"], force=True)
    finally:
        api.close()


def start_stack(tmp: str | os.PathLike[str] | None = None, gpus: int = 4) -> Stack:
    """Start plugin, dockerd (with the plugin and busybox) and shim; call .stop() when done."""
    return Stack(tmp, gpus).start()
