"""A Debian root booted with systemd as its init, in systemd-nspawn: the product as installed.

The units' sandboxing (`ProtectSystem=strict`, `ProtectHome=`, `PrivateTmp=`, an empty
capability set, `RuntimeDirectory=`) is applied only by a real systemd, and these machines
have none as PID 1.  So the install tier boots bookworm with systemd inside nspawn, runs
`deploy/install.sh` there and talks to the installed services through the machine's own
docker CLI (recipe and its reasons: shared/docs/systemd-root.md).

The root is built once with debootstrap and cached beside the Engine roots
(`engine_root.debootstrap`, the same stamp file and file lock): bookworm with its own
dockerd 20.10, and for Engine 29 sid with 29's own dockerd and docker-proxy in place of
the package's (`engine_root.install_shared_binaries`, as the sid-29 Engine root).  Not
bookworm for 29: its runc 1.1 cannot start the time namespace 29 asks every container
for; sid's containerd 2.1 and runc 1.3 are those 29 was checked with.  Each `Machine` boots it
through an overlay of its own, so the cached root stays clean and what a machine writes
(the install, the ledger, Docker's data on a real directory, since overlay2 cannot sit on
an overlay) survives a stop and the next boot: a reboot of the host as far as gpu-alloc,
dockerd and systemd can tell.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.support import engine_root
from tests.support.engine import prepare_host_tools

CACHE = engine_root.CACHE.parent / "systemd"
# The Debian suite each Engine the install tier boots comes from.
SUITES = {"20.10": "bookworm", "29": "sid"}
# The suites whose systemd (256+) refuses to boot on cgroup v1: booted on cgroup v2 alone,
# which also needs BPF for the device controller (shared/docs/systemd-root.md); the host's
# controllers stay on v1 there, so memory and CPU limits of containers are not applied.
CGROUP2_ONLY = ("sid",)
PACKAGES = ("systemd", "systemd-sysv", "dbus", "docker.io", "python3", "python3-venv",
            "iproute2", "busybox-static")  # fmt: skip
# sid ships the docker CLI apart from docker.io.
SUITE_PACKAGES = {"sid": ("docker-cli",)}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
# nspawn mounts the cgroup v1 controllers read-only, and runc must write them.
CGROUPS_RW = """[Unit]
Description=cgroup controllers writable for runc (test root only)
DefaultDependencies=no
ConditionVirtualization=container
Before=containerd.service docker.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'for d in /sys/fs/cgroup/*/; do \\
    mountpoint -q $d && mount -o remount,bind,rw $d; done; true'

[Install]
WantedBy=sysinit.target
"""


def root_of(engine: engine_root.Engine) -> Path:
    """Where `engine`'s systemd root is cached: the suite's name, -29 for 29's build."""
    suite = SUITES[engine.name]
    return CACHE / (f"{suite}-{engine.name}" if engine.binaries else suite)


def missing_requirements(engine: engine_root.Engine) -> str | None:
    """Why `engine`'s systemd root cannot boot here, or None when it can."""
    if engine.name not in SUITES:
        return f"the install tier boots Engines {', '.join(SUITES)}, not {engine.name}"
    if os.geteuid() != 0:
        return "booting a systemd root needs root"
    for tool in ("systemd-nspawn", "nsenter", "busybox"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":" + PATH) is None:
            return f"'{tool}' is not installed (make deps)"
    if not (root_of(engine) / engine_root.STAMP).exists() and shutil.which("debootstrap") is None:
        return "'debootstrap' is not installed (make deps)"
    return None


def ensure_root(engine: engine_root.Engine) -> Path:
    """`engine`'s cached bootable root, built first if no complete one is there.  Raises
    `engine_root.BinariesAbsent` where the Engine's own binaries are not to be had."""
    root = root_of(engine)
    if (root / engine_root.STAMP).exists():
        return root
    why = engine_root.binaries_absent(engine)
    if why:
        raise engine_root.BinariesAbsent(why)
    with engine_root.locked(root.with_name(root.name + ".lock")):
        if (root / engine_root.STAMP).exists():
            return root
        suite = SUITES[engine.name]
        partial = root.with_name(root.name + ".partial")
        started = time.monotonic()
        packages = (*PACKAGES, *SUITE_PACKAGES.get(suite, ()))
        engine_root.debootstrap(suite, packages, partial, root.with_name(root.name + ".log"))
        _prepare(partial)
        lines = [f"suite: {suite}", f"mirror: {engine_root.MIRROR}"]
        if engine.binaries:
            try:
                lines += engine_root.install_shared_binaries(engine, partial)
            except engine_root.RootError:
                shutil.rmtree(partial, ignore_errors=True)
                raise
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
        took = time.monotonic() - started
        lines += [f"built: {time.strftime('%Y-%m-%d %H:%M:%S')} in {took:.0f} s",
                  *engine_root.package_versions(root)]  # fmt: skip
        (root / engine_root.STAMP).write_text("\n".join(lines) + "\n")
    return root


def _prepare(root: Path) -> None:
    """The fake NVIDIA tools on dockerd's PATH, and the cgroup unit enabled."""
    prepare_host_tools(root / "usr/local", runc="/usr/sbin/runc")
    unit = root / "etc/systemd/system/ga-cgroups-rw.service"
    unit.write_text(CGROUPS_RW)
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")
    (root / "etc/hostname").write_text("gpu-host\n")


class Machine:
    """One booted copy of the root: `boot`, `sh` inside, `stop` (keeps its disk), `destroy`.

    `binds`: host directories seen read-only inside at the given paths; `cgroup2`: boot on
    the cgroup v2 hierarchy alone.
    """

    def __init__(
        self, base: Path, work: Path, name: str, binds: Mapping[str, Path], cgroup2: bool = False
    ) -> None:
        self.base = base
        self.cgroup2 = cgroup2
        self.work = work
        self.name = name
        self.binds = dict(binds)
        self.root = work / "root"
        self.proc: subprocess.Popen | None = None
        self.leader: int | None = None
        self.cgroups: list[Path] = []
        self.log = work / "nspawn.log"

    # -- disk -------------------------------------------------------------------------------
    def mount(self) -> Path:
        """The machine's disk, mounted at `self.root` (also before the first boot, to write
        files into it from the host)."""
        if os.path.ismount(self.root):
            return self.root
        for d in ("upper", "ovl", "root", "docker", "containerd"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        opts = f"lowerdir={self.base},upperdir={self.work / 'upper'},workdir={self.work / 'ovl'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)],
                       check=True, capture_output=True, timeout=30)  # fmt: skip
        return self.root

    # -- cgroups: nspawn --keep-unit makes payload/ and supervisor/ where it runs -----------
    def _own_cgroups(self) -> list[Path]:
        dirs = []
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrl, path = line.split(":", 2)
            base = Path("/sys/fs/cgroup")
            # cgroup v2 ("0::PATH"): beside v1 at unified/, or alone at the top.
            top = base / (ctrl.removeprefix("name=") or "unified")
            top = base if not ctrl and not top.is_dir() else top
            if not top.is_dir():
                continue
            d = top / path.lstrip("/") / f"ga-nspawn-{self.name}"
            d.mkdir(exist_ok=True)
            if ctrl == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (d / knob).write_text((d.parent / knob).read_text())
            dirs.append(d)
        return dirs

    def _remove_cgroups(self) -> None:
        for top in self.cgroups:
            engine_root.remove_cgroup_tree(top)
        self.cgroups = []

    # -- life -------------------------------------------------------------------------------
    def boot(self) -> Machine:
        self.mount()
        self.cgroups = self._own_cgroups()
        join = "".join(f"echo $$ > {d}/cgroup.procs && " for d in self.cgroups)
        argv = [
            "systemd-nspawn", "-D", str(self.root), "--boot", f"--machine={self.name}",
            "--register=no", "--keep-unit", "--private-network",
            "--console=passive",
            *(["--system-call-filter=@keyring bpf", "--capability=CAP_BPF,CAP_PERFMON"]
              if self.cgroup2 else ["--system-call-filter=@keyring"]),
            f"--bind={self.work / 'docker'}:/var/lib/docker",
            f"--bind={self.work / 'containerd'}:/var/lib/containerd",
            *(f"--bind-ro={host}:{inside}" for inside, host in self.binds.items()),
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", f'{join}exec "$@"', "nspawn", *argv],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"} if self.cgroup2
                else None,
            )  # fmt: skip
        self.leader = self._find_leader()
        # systemctl needs systemd's private socket, made a moment after PID 1 starts.
        private = Path(f"/proc/{self.leader}/root/run/systemd/private")
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not private.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        state = self.sh("systemctl is-system-running --wait", check=False,
                        timeout=BOOT_TIMEOUT).stdout.strip()  # fmt: skip
        if state not in ("running", "degraded"):
            raise RuntimeError(f"{self.name} did not boot ({state!r}):\n{self.log_tail()}")
        return self

    def _find_leader(self) -> int:
        """The machine's PID 1 (systemd), as the host sees it: nspawn's child."""
        assert self.proc is not None
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nspawn exited {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                for pid in children.read_text().split():
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                        return int(pid)
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: no systemd inside after {BOOT_TIMEOUT:.0f} s")

    def sh(
        self, script: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `script` with bash inside the machine, as root in all its namespaces."""
        assert self.leader is not None, "not booted"
        argv = ["nsenter", "-t", str(self.leader), "-a", "env", "-i", f"PATH={PATH}",
                "HOME=/root", "bash", "-c", script]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(
                f"in {self.name}: {script}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
            )
        return done

    def stop(self) -> None:
        """Shut the machine down as systemd does (SIGTERM to nspawn); its disk is kept."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self.leader = None
        self._remove_cgroups()

    def destroy(self) -> None:
        """Stop, unmount, and remove everything this machine left on the host."""
        self.stop()
        for _ in range(20):
            if not os.path.ismount(self.root):
                break
            subprocess.run(["umount", str(self.root)], capture_output=True, check=False)
            if os.path.ismount(self.root):
                time.sleep(0.5)
        nspawn = Path("/run/systemd/nspawn")
        shutil.rmtree(nspawn / "propagate" / self.name, ignore_errors=True)
        for d in (nspawn / "propagate", nspawn / "locks", nspawn):
            with contextlib.suppress(OSError):
                d.rmdir()  # only when no other machine uses it
        if not os.path.ismount(self.root):
            shutil.rmtree(self.work, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""
