"""The MPS control daemons gpu-alloc runs, one per shared GPU: their directories and
the ``nvidia-cuda-mps-control`` calls that start, set and stop them.

Each GPU's daemon lives under ``<mps.dir>/<GPU UUID>/``: ``pipe`` (its
CUDA_MPS_PIPE_DIRECTORY, bound into each share's container), ``log`` (its
CUDA_MPS_LOG_DIRECTORY) and ``shm``, the /dev/shm its servers and its clients share
(bound over /dev/shm in the daemon's own mount namespace and in each share's
container, so no share needs the host's IPC).  ``started`` marks a daemon gpu-alloc
started and has not stopped: it survives the shim's restart, so a daemon is never
started twice nor left running unseen.

While its daemon runs, a GPU is in compute mode EXCLUSIVE_PROCESS, as NVIDIA's
Kubernetes device plugin sets it (cmd/mps-control-daemon/mps/daemon.go): only the MPS
server then holds a context on it, so a share that unsets CUDA_MPS_PIPE_DIRECTORY cannot
use the GPU its device request opens directly, past its caps.  The mode it had is kept in
``compute-mode`` and set again when the daemon stops (DEFAULT where none was kept, as the
plugin does).  Simulated GPUs have no mode (`modes_for`).  Nothing else about a GPU
(persistence, MIG) is changed.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from allocator.core.rules import sharing
from allocator.host.devices import NVML
from allocator.host.nvml import COMPUTE_MODES, DEFAULT, EXCLUSIVE_PROCESS, NvmlModes

log = logging.getLogger("gpu-alloc")
TIMEOUT = 30.0  # seconds for one control call
MARK = "started"
MODE_KEPT = "compute-mode"  # the GPU's compute mode before its daemon started
READY_TRIES, READY_WAIT = 50, 0.1  # a fresh daemon's first command: 5 s to answer


class MpsError(Exception):
    """A daemon could not be started or told its caps."""


class ComputeModes(Protocol):
    """A GPU's compute mode by UUID (`allocator.host.nvml.NvmlModes`)."""

    def get(self, uuid: str) -> int: ...

    def set(self, uuid: str, mode: int) -> int: ...


def modes_for(gpus: str) -> ComputeModes | None:
    """The driver's compute modes for the config's ``gpus:``; none for simulated GPUs."""
    return NvmlModes() if gpus == NVML else None


class Daemons:
    """``nvidia-cuda-mps-control`` per GPU, under ``root`` (``mps.dir``); ``modes``: the
    GPUs' compute modes, set while a daemon runs (None: simulated GPUs, none to set)."""

    def __init__(
        self,
        root: str,
        control: str = "nvidia-cuda-mps-control",
        modes: ComputeModes | None = None,
    ):
        self.root = Path(root)
        self.control = control
        self.modes = modes
        # systemd is PID 1: each daemon is a transient unit of its own (`launch`)
        self.systemd = os.path.isdir("/run/systemd/system")

    def running(self) -> set[str]:
        """The GPUs (UUIDs) whose daemon gpu-alloc started and has not stopped."""
        try:
            return {d.name for d in self.root.iterdir() if (d / MARK).exists()}
        except OSError:
            return set()

    def env(self, uuid: str) -> dict[str, str]:
        top = self.root / uuid
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": uuid,
            sharing.PIPE_ENV: str(top / sharing.PIPE),
            "CUDA_MPS_LOG_DIRECTORY": str(top / sharing.LOG),
        }

    def start(self, uuid: str, commands: list[str]) -> None:
        """Start ``uuid``'s daemon on its own /dev/shm and give it ``commands`` (its caps)."""
        top = self.root / uuid
        for sub, mode in ((sharing.PIPE, 0o755), (sharing.LOG, 0o755), (sharing.SHM, 0o1777)):
            (top / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(top / sub, mode)
        # An MPS server runs as its clients' uid and reaches the pipe by this path: the
        # directories above it must let any user through (the shim's umask is 0077).
        for above in (self.root, top):
            os.chmod(above, 0o755)
        control = shutil.which(self.control) or self.control
        self._exclusive(uuid)
        try:
            self._run(launch(uuid, top, control, self.env(uuid), self.systemd), "", uuid)
            for command in commands:
                self._ready([control], command + "\n", uuid)
        except MpsError:
            self.stop(uuid)
            raise
        (top / MARK).write_text("")
        log.info("MPS daemon for %s started: %s", uuid, "; ".join(commands) or "no caps")

    def stop(self, uuid: str) -> None:
        """Tell ``uuid``'s daemon to quit (it waits for its clients' servers to end)."""
        control = shutil.which(self.control) or self.control
        try:
            self._run([control], "quit\n", uuid)
        except MpsError as e:
            log.warning("MPS daemon for %s: %s", uuid, e)
        self._restore(uuid)
        (self.root / uuid / MARK).unlink(missing_ok=True)
        log.info("MPS daemon for %s stopped: its last share ended", uuid)

    def _exclusive(self, uuid: str) -> None:
        """Put ``uuid`` in EXCLUSIVE_PROCESS, keeping the mode it had (once: a start
        again after a failed one keeps the first)."""
        if self.modes is None:
            return
        try:
            before = self.modes.set(uuid, EXCLUSIVE_PROCESS)
        except Exception as e:
            raise MpsError(
                f"its compute mode cannot be set to EXCLUSIVE_PROCESS ({e}), without which a "
                "share could use the GPU directly, past its caps"
            ) from None
        kept = self.root / uuid / MODE_KEPT
        if not kept.exists():
            kept.write_text(str(before))

    def _restore(self, uuid: str) -> None:
        """Give ``uuid`` back the compute mode it had before its daemon started."""
        if self.modes is None:
            return
        kept = self.root / uuid / MODE_KEPT
        try:
            mode = int(kept.read_text())
        except (OSError, ValueError):
            mode = DEFAULT
        try:
            self.modes.set(uuid, mode)
        except Exception as e:
            log.warning("GPU %s: compute mode not set back to %s: %s",
                        uuid, COMPUTE_MODES.get(mode, mode), e)  # fmt: skip
            return
        kept.unlink(missing_ok=True)

    def _ready(self, argv: list[str], stdin: str, uuid: str) -> None:
        """``_run`` once the daemon answers: it may still be creating its pipe."""
        for _ in range(READY_TRIES - 1):
            try:
                return self._run(argv, stdin, uuid)
            except MpsError:
                time.sleep(READY_WAIT)
        return self._run(argv, stdin, uuid)

    def _run(self, argv: list[str], stdin: str, uuid: str) -> None:
        try:
            done = subprocess.run(
                argv, input=stdin, env=self.env(uuid), capture_output=True, text=True,
                timeout=TIMEOUT, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"{argv[-1] if stdin else argv[0]}: {e}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-300:]
            raise MpsError(f"{' '.join(argv[-2:])} exited {done.returncode}: {said}")


def launch(uuid: str, top: Path, control: str, env: Mapping[str, str], systemd: bool) -> list[str]:
    """The command that starts ``uuid``'s control daemon with ``top/shm`` as its /dev/shm.

    Under systemd, a transient unit ``gpu-alloc-mps-<uuid>``: it lives outside the
    shim's cgroup (a shim restart or stop leaves it running, its clients served) and
    systemd gives it the bind (BindPaths=), so the shim needs no mount rights of its
    own.  Elsewhere, ``unshare`` puts it in a mount namespace of its own (root).
    """
    shm = str(top / sharing.SHM)
    if not systemd:
        return [
            "unshare", "--mount", "--propagation", "slave", "sh", "-c",
            'mount --bind "$1" /dev/shm && exec "$2" -d', "sh", shm, control,
        ]  # fmt: skip
    keep = ("CUDA_VISIBLE_DEVICES", sharing.PIPE_ENV, "CUDA_MPS_LOG_DIRECTORY")
    return [
        "systemd-run", f"--unit=gpu-alloc-mps-{uuid}", "--collect", "--quiet",
        "--property=Type=forking", f"--property=BindPaths={shm}:/dev/shm",
        *(f"--setenv={k}={env[k]}" for k in keep), control, "-d",
    ]  # fmt: skip
