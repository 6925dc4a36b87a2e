"""``nvidia-cuda-mps-control``: the test harness's stand-in, written from NVIDIA's documents.

NVIDIA ships the control daemon without source, so each behaviour below is taken from
what NVIDIA documents, or from the public code and logs that drive the real one:

- MPS docs, "Appendix: Tools and Interface Reference" (docs.nvidia.com/deploy/mps/
  appendix-tools-and-interface-reference.html) and the man page nvidia-cuda-mps-control(1):
  ``-d`` starts the daemon in the background; ``echo quit | nvidia-cuda-mps-control``
  shuts it down; with no option the program reads commands on stdin and hands them to
  the running daemon; the daemon writes ``nvidia-cuda-mps-control.pid`` in
  CUDA_MPS_PIPE_DIRECTORY; the commands ``get_server_list`` (the PIDs of the server
  instances), ``start_server -uid <uid>``, ``quit``,
  ``set_default_active_thread_percentage <percentage>`` (default 100; lost on ``quit``),
  ``get_default_active_thread_percentage`` and
  ``set_default_device_pinned_mem_limit <dev> <value>`` (an integer and ``M`` or ``G``,
  e.g. ``0 10G``).
- Its "Environment Variables" section: the pipes and sockets live in
  CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps), the logs in CUDA_MPS_LOG_DIRECTORY
  (default /var/log/nvidia-mps); a server starts only when a client connects (or on
  ``start_server``), so ``get_server_list`` lists none before.
- The daemon's ``control.log`` as users post it (NVIDIA/k8s-device-plugin#1614,
  kubernetes-sigs/dra-driver-nvidia-gpu#1153): "Starting control daemon using socket
  <pipe>/control", "To connect CUDA applications to this daemon, set env
  CUDA_MPS_PIPE_DIRECTORY=<pipe>"; NVIDIA/k8s-device-plugin's
  cmd/mps-control-daemon/mps/daemon.go tails ``<log>/control.log``.
- A command with no daemon running: "Cannot find MPS control daemon process"
  (globus-labs/mof-generation-at-scale#29), and the client fails: the device plugin's
  ``EchoPipeToControl`` reports "failed to send command to MPS daemon" only on a
  non-zero exit (NVIDIA/k8s-device-plugin#762).

Not documented, so chosen here and said so: a refused command (unknown, or a set_default_*
outside its documented form) fails the client with exit 1, so a test catches a
malformed command gpu-alloc sends; ``-d`` returns once the socket listens.

The tests' own additions: each call and each command read is recorded in ``CALLS`` (the
lines the tests assert on), and with ``SHM_MARK`` the daemon marks the /dev/shm it sees.
`install` writes this file, so configured, as the executable; it needs only python3.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

CALLS: str | None = None  # install(): the file each call and command is recorded in
SHM_MARK = False  # install(): the daemon leaves /dev/shm/daemon-was-here (a probe)

DEFAULT_PIPE, DEFAULT_LOG = "/tmp/nvidia-mps", "/var/log/nvidia-mps"
SOCKET, PID_FILE, LOG_FILE = "control", "nvidia-cuda-mps-control.pid", "control.log"
NO_DAEMON = "Cannot find MPS control daemon process"
RUNNING = "An MPS control daemon already runs for this pipe directory"
_MEM = re.compile(r"^[0-9]+[MG]$")
_PERCENT = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def install(path: Path, calls: Path, shm_mark: bool = False) -> Path:
    """Write the stand-in at ``path``, recording its calls in ``calls``."""
    source = Path(__file__).read_text()
    source = source.replace("CALLS: str | None = None", f"CALLS: str | None = {str(calls)!r}", 1)
    source = source.replace("SHM_MARK = False", f"SHM_MARK = {shm_mark!r}", 1)
    path.write_text("#!/usr/bin/env python3\n" + source)
    path.chmod(0o755)
    return path


def quit_all(root: Path) -> None:
    """Tell every daemon with a socket under ``root`` to quit (a test's cleanup)."""
    for sock in root.rglob(SOCKET):
        with socket.socket(socket.AF_UNIX) as s:
            if s.connect_ex(str(sock)) == 0:
                s.sendall(b"quit\n")
                s.shutdown(socket.SHUT_WR)
                with contextlib.suppress(ConnectionResetError):  # gone before reading all
                    s.recv(4096)


def pipe_dir() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE


def record(what: str) -> None:
    """``<kind> gpu=<CUDA_VISIBLE_DEVICES> <what>``: a line the tests assert on."""
    if CALLS:
        kind, _, rest = what.partition(" ")
        with open(CALLS, "a") as f:
            f.write(f"{kind} gpu={os.environ.get('CUDA_VISIBLE_DEVICES', '')} {rest}\n")


def main(argv: list[str]) -> int:
    record(f"call pipe={os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '')} args={' '.join(argv)}")
    if argv == ["-d"]:
        return start_daemon(pipe_dir(), os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG)
    if argv:
        print(f"nvidia-cuda-mps-control: unsupported options {argv}", file=sys.stderr)
        return 1
    status = 0
    for line in sys.stdin:
        command = line.strip()
        if command:
            record(f"cmd {command}")
            status = max(status, send(pipe_dir(), command))
    return status


def send(pipe: str, command: str) -> int:
    """Hand ``command`` to the daemon of ``pipe`` and print its reply."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(os.path.join(pipe, SOCKET))
            s.sendall(command.encode() + b"\n")
            s.shutdown(socket.SHUT_WR)
            reply = read_all(s)
    except OSError:
        print(NO_DAEMON)
        return 1
    status, _, text = reply.partition("\n")
    print(text, end="", file=sys.stdout if status == "0" else sys.stderr)
    return int(status or 1)


def start_daemon(pipe: str, logs: str) -> int:
    """Fork the daemon; return once its socket listens (0) or it could not (1)."""
    path = os.path.join(pipe, SOCKET)
    with socket.socket(socket.AF_UNIX) as probe:
        if probe.connect_ex(path) == 0:
            print(RUNNING, file=sys.stderr)
            return 1
    # gpu-alloc and the device plugin create both first; the stand-in does not insist
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    ready_r, ready_w = os.pipe()
    if os.fork():
        os.close(ready_w)
        return 0 if os.read(ready_r, 1) == b"1" else 1
    os.close(ready_r)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        if os.path.exists(path):
            os.unlink(path)  # left by a daemon that did not quit
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen()
        Path(pipe, PID_FILE).write_text(f"{os.getpid()}\n")
        log = Path(logs, LOG_FILE)
        say(log, f"Starting control daemon using socket {path}")
        say(
            log,
            f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}",
        )
        if SHM_MARK:
            Path("/dev/shm/daemon-was-here").touch()
    except OSError:
        os.write(ready_w, b"0")
        os._exit(1)
    os.write(ready_w, b"1")
    os.close(ready_w)
    Daemon(pipe, log, listener).serve()
    os._exit(0)


def say(log: Path, message: str) -> None:
    """A control.log line, in the daemon's format: ``[date time.ms Control PID] message``."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    with log.open("a") as f:
        f.write(f"[{stamp} Control {os.getpid():5d}] {message}\n")


def read_all(conn: socket.socket) -> str:
    chunks = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks).decode()


def is_percentage(value: str) -> bool:
    """``set_default_active_thread_percentage``'s argument: a percentage of the threads."""
    return bool(_PERCENT.match(value)) and 0 < float(value) <= 100


def is_limit(dev: str, value: str) -> bool:
    """``set_default_device_pinned_mem_limit``'s: a device index and an integer with
    ``M`` or ``G`` ("set_default_device_pinned_mem_limit 0 10G")."""
    return dev.isdigit() and bool(_MEM.match(value))


class Daemon:
    """The running daemon: its defaults and its servers, until ``quit``."""

    def __init__(self, pipe: str, log: Path, listener: socket.socket):
        self.pipe, self.log, self.listener = pipe, log, listener
        self.thread_percentage = "100"  # "The default is 100"
        self.pinned: dict[str, str] = {}
        self.servers: list[int] = []

    def serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            with conn:
                command = read_all(conn).strip()
                status, text = self.answer(command.split())
                if command == "quit":
                    self.quit()  # gone before the client hears back: a new -d may follow
                conn.sendall(f"{status}\n{text}".encode())
            if command == "quit":
                return

    def answer(self, words: list[str]) -> tuple[int, str]:
        """(0, reply) for a command in its documented form, else (1, why)."""
        match words:
            case ["quit"]:
                return 0, ""
            case ["get_server_list"]:
                return 0, "".join(f"{pid}\n" for pid in self.servers)
            case ["start_server", "-uid", uid] if uid.isdigit():
                self.servers.append(self.fork_server())
                return 0, ""
            case ["set_default_active_thread_percentage", value] if is_percentage(value):
                self.thread_percentage = value
                return 0, ""
            case ["get_default_active_thread_percentage"]:
                return 0, f"{float(self.thread_percentage):.1f}\n"
            case ["set_default_device_pinned_mem_limit", dev, value] if is_limit(dev, value):
                self.pinned[dev] = value
                return 0, ""
            case ["get_default_device_pinned_mem_limit", dev] if dev in self.pinned:
                return 0, f"{self.pinned[dev]}\n"
        return 1, f"Invalid command: {' '.join(words)}\n"

    def fork_server(self) -> int:
        """A stand-in server process, waiting until the daemon quits."""
        pid = os.fork()
        if pid == 0:
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the socket and the client's
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            while True:
                signal.pause()
        return pid

    def quit(self) -> None:
        """Stop: the servers end, the socket and PID file go (defaults are lost)."""
        for pid in self.servers:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        self.listener.close()
        for name in (SOCKET, PID_FILE):
            Path(self.pipe, name).unlink(missing_ok=True)
        say(self.log, "Exit")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
