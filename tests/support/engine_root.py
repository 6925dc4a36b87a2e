"""The Engines the tests run: the host's dockerd 20.10, or a newer one from a Debian root.

Debian 12 ships only dockerd 20.10 and docker-compose 1.29, while GPU servers run
Docker 26 to 29 and Compose v2.  Newer Engines come from Debian's own packages,
installed with debootstrap into a root filesystem (trixie: dockerd 26.1, Compose
2.26; sid: dockerd 28.5, Compose 2.40), built on first use and cached outside the
checkout so every worktree and every run shares one copy.  No Debian suite ships
dockerd 29: its root is a copy of the sid root whose dockerd and docker-proxy are
replaced by the ones built from moby's source and kept in the shared directory
(`SHARED`/engines, beside the checkout), checked against their SHA256SUMS.  Where
that directory is absent the Engine is not run, said in one line (`BinariesAbsent`).
`tests/support/engine.py` runs dockerd inside that root (see `root_launcher`); the
plugin, the shim and the clients stay on the host and meet dockerd in the state
directory, which is seen at the same path on both sides.

Debian unstable moves: a root that was built is reused as it is (the stamp names
the package versions it was built with), and a new build that the archive cannot
satisfy that day (download or dependency errors) raises `ArchiveUnavailable`,
which the tests report loudly as not run for that reason instead of failing CI.
Any other failure is a real failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("GA_ENGINE_CACHE", "/var/cache/gpu-alloc-tests/engines"))
MIRROR = os.environ.get("GA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("docker.io", "docker-cli", "docker-compose", "busybox-static")
BUILD_TIMEOUT = 900.0
STAMP = ".gpu-alloc-root"
# PATH inside the root for dockerd (containerd, runc, the fake nvidia hook ahead of them).
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMPOSE_PLUGIN = "usr/libexec/docker/cli-plugins/docker-compose"
# Said in the pytest header, each skip and the summary when the archive fails a root.
ARCHIVE_BANNER = "ENGINE NOT RUN: THE DEBIAN ARCHIVE FAILED"
# Said instead when the Engine's binaries (SHARED/engines) are not beside the checkout.
ABSENT_BANNER = "ENGINE NOT RUN: ITS BINARIES ARE ABSENT"
# The shared directory CI lays beside the clone: ../shared from the checkout's root.
SHARED = Path(os.environ.get("GA_SHARED") or Path(__file__).resolve().parents[2].parent / "shared")

# What debootstrap prints when the archive, not this machine, is at fault.
ARCHIVE_ERRORS = re.compile(
    r"Failed getting release file|Failed getting release signature|Invalid Release"
    r"|Couldn't download|Failed to retrieve|Couldn't find these debs"
    r"|Couldn't find package|Tried to extract package|Unmet dependencies"
    r"|Release signed by unknown key|Hash Sum mismatch|Size mismatch|Temporary failure",
)


class ArchiveUnavailable(RuntimeError):
    """The Debian archive could not give a working root today (not our code's fault)."""


class BinariesAbsent(ArchiveUnavailable):
    """The shared directory with an Engine's own binaries is not beside this checkout."""


class RootError(RuntimeError):
    """A root could not be built or does not hold the Engine it should."""


@dataclass(frozen=True)
class Engine:
    """One Engine the tests can run: the host's, or one from a Debian suite's root."""

    name: str  # what GA_ENGINE says: "20.10", "26", "28", "29"
    suite: str | None  # None: the host's own dockerd
    version: str  # the dockerd version prefix this Engine must report
    # The build (SHARED/engines/dockerd-<binaries>.xz) replacing the suite's dockerd, if any.
    binaries: str | None = None

    @property
    def host(self) -> bool:
        return self.suite is None

    @property
    def root(self) -> Path | None:
        if self.suite is None:
            return None
        return CACHE / (f"{self.suite}-{self.name}" if self.binaries else self.suite)


ENGINES = {
    "20.10": Engine("20.10", None, "20.10."),
    "26": Engine("26", "trixie", "26.1."),
    "28": Engine("28", "sid", "28.5."),
    "29": Engine("29", "sid", "29.7.", binaries="29.7.2-dev"),
}
ALIASES = {"20": "20.10", "host": "20.10", "trixie": "26", "sid": "28", "unstable": "28"}
# The binaries an Engine from SHARED/engines brings into its root, as usr/sbin/<name>.
SHARED_BINARIES = ("dockerd", "docker-proxy")


def lookup(name: str) -> Engine:
    key = ALIASES.get(name.strip(), name.strip())
    if key not in ENGINES:
        raise ValueError(f"unknown Engine {name!r}: choose one of {', '.join(ENGINES)}")
    return ENGINES[key]


def selected() -> Engine:
    """The Engine of this run: $GA_ENGINE (pytest's --engine sets it), else the host's 20.10."""
    return lookup(os.environ.get("GA_ENGINE") or "20.10")


def host_user(base: str) -> str:
    """`base` made this Engine's own (``gaann`` -> ``gaann28``): the parts of `make test`
    run in parallel, and a part that removes its host users at its end must not remove
    those another part is still using."""
    return base + re.sub(r"[^a-z0-9]", "", selected().name)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock: two pytest processes never build the same root at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_root(engine: Engine) -> Path:
    """The built root of `engine`, building it first if no complete one is cached."""
    root = engine.root
    assert root is not None and engine.suite is not None, "the host Engine has no root"
    if (root / STAMP).exists():
        return root
    if engine.binaries:
        why = binaries_absent(engine)
        if why:
            raise BinariesAbsent(why)
        suite = (e for e in ENGINES.values() if e.suite == engine.suite and not e.binaries)
        base = ensure_root(next(suite))
        with locked(CACHE / f"{root.name}.lock"):
            if not (root / STAMP).exists():
                _overlay(engine, base, root)
        return root
    with locked(CACHE / f"{engine.suite}.lock"):
        if (root / STAMP).exists():  # another process built it while we waited
            return root
        _build(engine, root)
    return root


def binaries_absent(engine: Engine) -> str | None:
    """Why `engine`'s own binaries cannot be had here (None: they can, or it needs none)."""
    if not engine.binaries:
        return None
    engines = SHARED / "engines"
    wanted = [f"{name}-{engine.binaries}.xz" for name in SHARED_BINARIES]
    missing = [w for w in ["SHA256SUMS", *wanted] if not (engines / w).is_file()]
    if missing:
        return (
            f"Engine {engine.name} (dockerd {engine.binaries}) needs {', '.join(missing)} "
            f"in {engines} (the shared directory beside the checkout; GA_SHARED overrides)"
        )
    return None


def debootstrap(suite: str, packages: Sequence[str], partial: Path, log: Path) -> None:
    """Build `partial` from scratch with debootstrap (`log` gets its output); on failure
    remove it and raise `ArchiveUnavailable` when the archive is at fault, else `RootError`."""
    if shutil.which("debootstrap") is None:
        raise RootError("debootstrap is not installed (make deps)")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [
        "debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
        suite, str(partial), MIRROR,
    ]  # fmt: skip
    with open(log, "w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=BUILD_TIMEOUT, check=False)  # fmt: skip
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = -1
    if rc == 0:
        return
    text = log.read_text(errors="replace")
    shutil.rmtree(partial, ignore_errors=True)
    tail = "\n".join(text.splitlines()[-15:])
    if rc == -1 or ARCHIVE_ERRORS.search(text):
        raise ArchiveUnavailable(
            f"debootstrap {suite} failed on the archive ({MIRROR}); log {log}:\n{tail}"
        )
    raise RootError(f"debootstrap {suite} failed (status {rc}); log {log}:\n{tail}")


def _build(engine: Engine, root: Path) -> None:
    assert engine.suite is not None
    partial = root.with_name(root.name + ".partial")
    started = time.monotonic()
    debootstrap(engine.suite, PACKAGES, partial, root.with_name(root.name + ".log"))
    versions = package_versions(partial)
    dockerd = dockerd_version(partial)
    if not dockerd.startswith(f"Docker version {engine.version}"):
        # The suite moved on to another Engine: the archive no longer gives this one.
        shutil.rmtree(partial, ignore_errors=True)
        raise ArchiveUnavailable(
            f"Debian {engine.suite} now gives {dockerd!r}, not dockerd {engine.version}x; "
            f"pin a cached root or update tests/support/engine_root.py ENGINES"
        )
    _clean_root(partial)
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    lines = [f"suite: {engine.suite}", f"mirror: {MIRROR}", f"dockerd: {dockerd}",
             f"built: {time.strftime('%Y-%m-%d %H:%M:%S')} in {time.monotonic() - started:.0f} s",
             *versions]  # fmt: skip
    # Written last: a root without its stamp is incomplete and rebuilt.
    (root / STAMP).write_text("\n".join(lines) + "\n")


def _overlay(engine: Engine, base: Path, root: Path) -> None:
    """`root` as a copy of the suite's `base` root with the shared binaries in usr/sbin."""
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(partial)], check=True)
    (partial / STAMP).unlink()
    try:
        lines = install_shared_binaries(engine, partial)
    except RootError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    base_stamp = [ln for ln in (base / STAMP).read_text().splitlines()
                  if not ln.startswith(("dockerd:", "built:"))]  # fmt: skip
    lines = [*lines,
             f"built: {time.strftime('%Y-%m-%d %H:%M:%S')} in {time.monotonic() - started:.0f} s",
             *base_stamp]  # fmt: skip
    (root / STAMP).write_text("\n".join(lines) + "\n")


def install_shared_binaries(engine: Engine, root: Path) -> list[str]:
    """`engine`'s own dockerd and docker-proxy (SHARED/engines, checked against SHA256SUMS)
    put in `root`'s usr/sbin over the suite's; the stamp lines that say so, the dockerd
    version first.  Raises `RootError` on a digest or version that is not the expected one."""
    sums = _sha256sums(SHARED / "engines" / "SHA256SUMS")
    lines = [f"binaries: {SHARED / 'engines'}"]
    for name in SHARED_BINARIES:
        packed = SHARED / "engines" / f"{name}-{engine.binaries}.xz"
        digest = subprocess.run(["sha256sum", str(packed)], capture_output=True, text=True,
                                check=True).stdout.split()[0]  # fmt: skip
        if sums.get(packed.name) != digest:
            raise RootError(f"{packed}: sha256 {digest} is not the one SHA256SUMS lists")
        target = root / "usr/sbin" / name
        with open(target.with_suffix(".new"), "wb") as out:
            subprocess.run(["xz", "-dc", str(packed)], stdout=out, check=True)
        target.with_suffix(".new").chmod(0o755)
        target.with_suffix(".new").rename(target)
        lines.append(f"usr/sbin/{name}: {packed.name} sha256 {digest}")
    dockerd = dockerd_version(root)
    if not dockerd.startswith(f"Docker version {engine.version}"):
        raise RootError(f"{engine.binaries} says {dockerd!r}, not dockerd {engine.version}x")
    return [f"dockerd: {dockerd}", *lines]


def _sha256sums(path: Path) -> dict[str, str]:
    """SHA256SUMS as {file name: digest}."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name:
            out[name.strip().lstrip("*")] = digest.strip()
    return out


def _clean_root(root: Path) -> None:
    """What the root must not carry into every dockerd started from it."""
    for path in ("etc/docker/daemon.json", "etc/docker/key.json"):
        with contextlib.suppress(FileNotFoundError):
            (root / path).unlink()
    (root / "etc/docker/plugins").mkdir(parents=True, exist_ok=True)
    (root / "etc/docker/plugins").chmod(0o755)


def _in_root(root: Path, *argv: str) -> str:
    out = subprocess.run(
        ["chroot", str(root), "env", "-i", f"PATH={ROOT_PATH}", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return (out.stdout or out.stderr).strip()


def dockerd_version(root: Path) -> str:
    return _in_root(root, "dockerd", "--version")


def package_versions(root: Path) -> list[str]:
    fmt = "${Package} ${Version}\n"
    wanted = ("docker.io", "docker-cli", "docker-compose", "containerd", "runc")
    return _in_root(root, "dpkg-query", "-W", f"-f={fmt}", *wanted).splitlines()


def stamp(engine: Engine) -> str:
    """What a built root says about itself (suite, dockerd, package versions)."""
    root = engine.root
    if root is None:
        return ""
    with contextlib.suppress(OSError):
        return (root / STAMP).read_text()
    return ""


def find_in_root(root: Path, *names: str) -> str | None:
    """The first of `names` (paths inside the root) that exists, as a path inside the root."""
    for name in names:
        if (root / name.lstrip("/")).exists():
            return name
    return None


def root_launcher(root: Path, binds: Sequence[Path], path: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` (dockerd) inside `root`, with `binds` seen at the
    same paths inside, in a private mount namespace so every mount vanishes with it.

    ROOT is bind-mounted on itself (without it `docker import` fails to remount /), /tmp
    inside is a fresh tmpfs (the state directories bound there leave nothing in the cached
    root), and `exec` keeps one pid from unshare to dockerd: the pid we started is dockerd's.
    """
    r = str(root)
    steps = [
        f"mount --bind {r} {r}",
        f"mount -t proc proc {r}/proc",
        f"mount --rbind /sys {r}/sys",
        f"mount --rbind /dev {r}/dev",
        f"mount -t tmpfs tmpfs {r}/run",
        f"mount -t tmpfs tmpfs {r}/tmp",
    ]
    for b in binds:
        steps += [f"mkdir -p {r}{b}", f"mount --bind {b} {r}{b}"]
    script = " && ".join(steps) + ' && exec chroot "$0" env -i PATH="$1" "${@:2}"'
    return ["unshare", "-m", "--propagation", "private", "bash", "-c", script, r, path, *argv]


def mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def hold_namespace(pid: int) -> int | None:
    """An open fd on `pid`'s mount namespace.  Holding it keeps the namespace alive, so
    its inode is not reused by someone else's namespace (a container's, another test
    engine's) before `kill_namespace` compares against it."""
    try:
        return os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def kill_namespace(held: int | None) -> list[int]:
    """SIGKILL every process in the mount namespace `held` (an fd from `hold_namespace`):
    the containerd and shims a dockerd left behind."""
    killed: list[int] = []
    if held is None:
        return killed
    ns = os.fstat(held)
    own = os.stat(f"/proc/{os.getpid()}/ns/mnt")
    if (ns.st_dev, ns.st_ino) == (own.st_dev, own.st_ino):
        return killed  # never the host's own namespace
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(entry / "ns" / "mnt")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), 9)
                killed.append(int(entry.name))
    return killed


def cgroup_dirs(name: str) -> list[Path]:
    """Every cgroup directory /NAME (cgroup v1: one per controller; v2: one)."""
    base = Path("/sys/fs/cgroup")
    found = [base / name] if (base / name).is_dir() else []
    with contextlib.suppress(OSError):
        found += [d / name for d in base.iterdir() if (d / name).is_dir()]
    return found


def remove_cgroups(name: str) -> None:
    """Kill what is left in the /NAME cgroups (containers of a dead dockerd), remove them."""
    for top in cgroup_dirs(name):
        remove_cgroup_tree(top)


def remove_cgroup_tree(top: Path) -> None:
    """Kill every process in the cgroup `top` and below, then remove the folders, depth first."""
    if not top.is_dir():
        return
    dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda p: -len(p.parts))
    for d in [*dirs, top]:
        with contextlib.suppress(OSError, ValueError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
    for d in [*dirs, top]:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
