"""The plugin's own gunicorn worker (plugin/worker.py), served as `gpu-alloc plugin` serves it.

No dockerd: the tests speak dockerd's side of the plugin protocol over the socket.
What they pin: calls that touch no GPU are answered while a decision waits for the
Engine (a start inspects its container); answers on one connection come back in
request order; activation answers dockerd's handshake (and clears what a previous
dockerd left in flight) on a kept-alive connection; a call the plugin does not serve gets
a 404 in the plugin protocol's error format; a malformed request gets a 400, not a hang.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import signal
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from allocator.core.leases.inflight import Start
from allocator.host import unixhttp
from allocator.host.inflight import Registry
from tests.support import engine


class _Engine(http.server.BaseHTTPRequestHandler):
    """The little of an Engine the plugin asks: its version, its info, and an inspect
    that answers "no such container" once `RELEASE` is set (`ASKED` says it has begun)."""

    RELEASE = threading.Event()
    ASKED = threading.Event()

    ANSWERS: ClassVar[dict[str, dict]] = {
        "version": {"Version": "20.10.24", "ApiVersion": "1.41", "MinAPIVersion": "1.12"},
        "info": {"DefaultRuntime": "runc", "Runtimes": {"runc": {}}, "DockerRootDir": "/x"},
    }

    def do_GET(self) -> None:
        if "/containers/" in self.path:
            self.ASKED.set()
            self.RELEASE.wait(30)
        answer = self.ANSWERS.get(self.path.rstrip("/").rsplit("/", 1)[-1])
        data = json.dumps(answer or {"message": "No such container: job"}).encode()
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
    # a short poll: shutdown() waits for the loop's next look (0.5 s by default)
    threading.Thread(target=fake.serve_forever, args=(0.05,), daemon=True).start()
    config = {
        "engine": {"socket": str(tmp_path / "engine.sock"), "timeout": 60},
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
        engine.wait_until(lambda: _serving(sock), "plugin", proc, log, 30)
        yield sock, state, proc
    finally:
        engine.stop_process(proc)
        fake.shutdown()


def _authz(method: str, uri: str, body: dict | None = None, headers: dict | None = None) -> bytes:
    req: dict = {"User": "", "RequestMethod": method, "RequestUri": uri}
    if headers:
        req["RequestHeaders"] = headers
    if body is not None:
        req["RequestBody"] = base64.b64encode(json.dumps(body).encode()).decode()
    data = json.dumps(req).encode()
    return (
        b"POST /AuthZPlugin.AuthZReq HTTP/1.1\r\nHost: plugin\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    )


def _start() -> bytes:
    """A start: its verdict inspects the container, which this Engine answers late."""
    return _authz("POST", "/v1.41/containers/job/start")


def _serving(sock: str) -> bool:
    """A worker answers, not only the arbiter's socket: a worker still booting loses a
    SIGTERM (its handlers are not set yet) and is killed only after the grace, 5 s on."""
    try:
        code, _ = unixhttp.request(sock, "POST", "/Plugin.Ready", b"", timeout=2)
    except (OSError, http.client.HTTPException):
        return False
    return code == 404  # a call it does not serve: answered, and nothing changed


@pytest.fixture
def slow_engine() -> Iterator[threading.Event]:
    _Engine.RELEASE.clear()
    _Engine.ASKED.clear()
    yield _Engine.RELEASE
    _Engine.RELEASE.set()


def _read_replies(conn: socket.socket, count: int, timeout: float = 10) -> list[tuple[str, bytes]]:
    """``count`` whole HTTP responses: each one's head and body."""
    conn.settimeout(timeout)
    buf, replies = b"", []
    while len(replies) < count:
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buf[:head_end].decode()
            length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
            if len(buf) >= head_end + 4 + length:
                replies.append((head, buf[head_end + 4 : head_end + 4 + length]))
                buf = buf[head_end + 4 + length :]
                continue
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(replies)} answers")
        buf += chunk
    return replies


def _read_answers(conn: socket.socket, count: int, timeout: float = 10) -> list[dict]:
    return [
        {"status": int(head.split()[1]), **json.loads(body)}
        for head, body in _read_replies(conn, count, timeout)
    ]


def _connect(sock: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock)
    return conn


def test_reads_are_answered_while_a_start_waits_for_the_engine(
    plugin: tuple[str, Path, subprocess.Popen], slow_engine: threading.Event
) -> None:
    sock, _, _ = plugin
    slow = _connect(sock)
    slow.sendall(_start())
    assert _Engine.ASKED.wait(10)  # the start's verdict is now waiting for its inspect
    fast = _connect(sock)
    fast.sendall(_authz("GET", "/v1.41/containers/json"))
    [answer] = _read_answers(fast, 1)  # before the Engine answers the start's inspect
    assert answer == {"status": 200, "Allow": True}
    slow.settimeout(0.3)
    with pytest.raises(TimeoutError):
        slow.recv(1)  # still waiting: nothing is answered before the Engine
    slow_engine.set()
    [started] = _read_answers(slow, 1)
    assert started == {"status": 200, "Allow": True}  # no such container: dockerd says so


def test_answers_on_one_connection_keep_request_order(
    plugin: tuple[str, Path, subprocess.Popen], slow_engine: threading.Event
) -> None:
    sock, _, _ = plugin
    conn = _connect(sock)
    bad = _authz("POST", "/v1.41/containers/create", {"Image": 1})  # answered at once
    conn.sendall(_start() + _authz("GET", "/_ping") + bad)
    assert _Engine.ASKED.wait(10)
    slow_engine.set()
    answers = _read_answers(conn, 3)
    assert [a["Allow"] for a in answers] == [True, True, False]


def _activate() -> bytes:
    """dockerd's handshake, as its plugin client sends it (pkg/plugins: POST, JSON, no body)."""
    return (
        b"POST /Plugin.Activate HTTP/1.1\r\nHost: plugin\r\n"
        b"Accept: application/vnd.docker.plugins.v1.2+json\r\nContent-Length: 0\r\n\r\n"
    )


def test_activation_answers_the_handshake_and_the_connection_serves_on(
    plugin: tuple[str, Path, subprocess.Popen],
) -> None:
    sock, _, _ = plugin
    conn = _connect(sock)
    conn.sendall(_activate() + _authz("GET", "/_ping"))
    (head, body), (_, allowed) = _read_replies(conn, 2)
    assert head.startswith("HTTP/1.1 200 ")
    assert "content-type: application/vnd.docker.plugins.v1+json" in head.lower()
    assert json.loads(body) == {"Implements": ["authz"]}
    assert json.loads(allowed) == {"Allow": True}


def test_activation_clears_what_a_previous_dockerd_left_in_flight(
    plugin: tuple[str, Path, subprocess.Popen], tmp_path: Path
) -> None:
    sock, _, _ = plugin
    board = Registry(tmp_path)  # beside the plugin's socket
    assert board.begin("k1", Start("start", "job", None))[0] is None
    conn = _connect(sock)
    conn.sendall(_activate())
    assert _read_answers(conn, 1) == [{"status": 200, "Implements": ["authz"]}]
    assert board.read().entries == ()


def test_a_call_the_plugin_does_not_serve_gets_a_404_dockerd_can_show(
    plugin: tuple[str, Path, subprocess.Popen],
) -> None:
    sock, _, _ = plugin
    conn = _connect(sock)
    unknown = b"POST /VolumeDriver.Create HTTP/1.1\r\nHost: plugin\r\nContent-Length: 2\r\n\r\n{}"
    conn.sendall(unknown + _authz("GET", "/_ping"))
    missing, allowed = _read_answers(conn, 2)
    assert missing["status"] == 404
    assert "POST /VolumeDriver.Create" in missing["Err"]  # pkg/plugins shows Err
    assert allowed == {"status": 200, "Allow": True}


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
