"""The plugin's own gunicorn worker (plugin/worker.py), served as `gpu-alloc plugin` serves it.

No dockerd: the tests speak dockerd's side of the plugin protocol over the socket.
What they pin: calls that touch no GPU are answered while a decision waits for the
ledger lock; answers on one connection come back in request order; activation still
goes through Flask; a malformed request gets a 400, not a hang.
"""

from __future__ import annotations

import base64
import http.server
import json
import signal
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import portalocker
import pytest
import yaml

from allocator.core import labels
from tests import engine


class _Engine(http.server.BaseHTTPRequestHandler):
    """The little of an Engine a create's verdict asks: its version and its info."""

    ANSWERS: ClassVar[dict[str, dict]] = {
        "version": {"Version": "20.10.24", "ApiVersion": "1.41", "MinAPIVersion": "1.12"},
        "info": {"DefaultRuntime": "runc", "Runtimes": {"runc": {}}, "DockerRootDir": "/x"},
    }

    def do_GET(self) -> None:
        answer = self.ANSWERS.get(self.path.rstrip("/").rsplit("/", 1)[-1], {})
        data = json.dumps(answer).encode()
        self.send_response(200 if answer else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "engine"

    def log_message(self, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    state = tmp_path / "state"
    state.mkdir()
    sock = str(tmp_path / "plugin.sock")
    fake = _UnixServer(str(tmp_path / "engine.sock"), _Engine)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    config = {
        "engine": {"socket": str(tmp_path / "engine.sock"), "timeout": 2},
        "plugin": {"socket": sock, "workers": 1},
        "state_dir": str(state),
        "gpus": str(engine.write_sim_gpus(tmp_path / "gpus.yaml", 2)),
        "policy": {"lock_timeout": 5},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "plugin.log"
    argv = [*engine.gpu_alloc_command(), "--config", str(tmp_path / "config.yaml"), "plugin"]
    proc = engine._spawn(argv, log)
    try:
        engine.wait_until(lambda: engine.can_connect(sock), "plugin", proc, log, 30)
        yield sock, state, proc
    finally:
        engine.stop_process(proc)
        fake.shutdown()


def _authz(method: str, uri: str, body: dict | None = None) -> bytes:
    req: dict = {"User": "", "RequestMethod": method, "RequestUri": uri}
    if body is not None:
        req["RequestBody"] = base64.b64encode(json.dumps(body).encode()).decode()
    data = json.dumps(req).encode()
    return (
        b"POST /AuthZPlugin.AuthZReq HTTP/1.1\r\nHost: plugin\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    )


def _leased_create() -> bytes:
    """A create carrying a lease label: its verdict needs the ledger lock."""
    gpu = engine.sim_gpu_uuid(0)
    body = {
        "Image": "busybox",
        "Env": [f"NVIDIA_VISIBLE_DEVICES={gpu}"],
        "Labels": {labels.LEASE: labels.lease_label("l-nope", "token")},
        "HostConfig": {
            "DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": [gpu], "Capabilities": [["gpu"]]}]
        },
    }
    return _authz("POST", "/v1.41/containers/create", body)


def _read_answers(conn: socket.socket, count: int, timeout: float = 10) -> list[dict]:
    conn.settimeout(timeout)
    buf, answers = b"", []
    while len(answers) < count:
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buf[:head_end].decode()
            length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
            if len(buf) >= head_end + 4 + length:
                status = int(head.split()[1])
                payload = buf[head_end + 4 : head_end + 4 + length]
                answers.append({"status": status, **json.loads(payload)})
                buf = buf[head_end + 4 + length :]
                continue
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(answers)} answers")
        buf += chunk
    return answers


def _connect(sock: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock)
    return conn


def test_reads_are_answered_while_a_create_waits_for_the_lock(
    plugin: tuple[str, Path, subprocess.Popen],
) -> None:
    sock, state, _ = plugin
    with portalocker.Lock(str(state / "lock"), flags=portalocker.LOCK_EX):
        slow = _connect(sock)
        slow.sendall(_leased_create())
        time.sleep(0.2)  # the create's verdict is now waiting for the lock we hold
        fast = _connect(sock)
        t0 = time.perf_counter()
        fast.sendall(_authz("GET", "/v1.41/containers/json"))
        [answer] = _read_answers(fast, 1)
        assert answer == {"status": 200, "Allow": True}
        assert time.perf_counter() - t0 < 1.0
        slow.settimeout(0.3)
        with pytest.raises(TimeoutError):
            slow.recv(1)  # still waiting: nothing was answered before the lock
    [refused] = _read_answers(slow, 1)
    assert refused["Allow"] is False
    assert "gpu-alloc refused the container create" in refused["Msg"]


def test_answers_on_one_connection_keep_request_order(
    plugin: tuple[str, Path, subprocess.Popen],
) -> None:
    sock, state, _ = plugin
    conn = _connect(sock)
    with portalocker.Lock(str(state / "lock"), flags=portalocker.LOCK_EX):
        conn.sendall(_leased_create() + _authz("GET", "/_ping") + _authz("GET", "/info"))
        time.sleep(0.3)
    answers = _read_answers(conn, 3)
    assert [a["Allow"] for a in answers] == [False, True, True]


def test_activation_goes_through_flask(plugin: tuple[str, Path, subprocess.Popen]) -> None:
    sock, _, _ = plugin
    conn = _connect(sock)
    conn.sendall(b"POST /Plugin.Activate HTTP/1.1\r\nHost: plugin\r\nContent-Length: 0\r\n\r\n")
    assert _read_answers(conn, 1) == [{"status": 200, "Implements": ["authz"]}]


def test_a_malformed_request_gets_a_400_and_the_worker_keeps_serving(
    plugin: tuple[str, Path, subprocess.Popen],
) -> None:
    sock, _, _ = plugin
    bad = _connect(sock)
    bad.settimeout(5)
    bad.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    assert bad.recv(4096).startswith(b"HTTP/1.1 400 ")
    assert bad.recv(4096) == b""  # closed
    good = _connect(sock)
    good.sendall(_authz("GET", "/_ping"))
    assert _read_answers(good, 1) == [{"status": 200, "Allow": True}]


def test_sigterm_stops_the_plugin_within_its_grace(
    plugin: tuple[str, Path, subprocess.Popen],
) -> None:
    sock, _, proc = plugin
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=8) == 0
    assert not engine.can_connect(sock)
