"""The shim transport with the real Engine behind it: docker, the SDK, streams and uploads
through the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator

import docker
import pytest

from shim import server
from tests.support import engine
from tests.support.proxy import Recorder, read_response, remove_short_dirs, short_dir


@pytest.fixture(autouse=True)
def _remove_short_dirs() -> Iterator[None]:
    yield
    remove_short_dirs()


@pytest.fixture
def shim(bare_engine: engine.Dockerd) -> Iterator[tuple[str, Recorder]]:
    """The proxy in a thread of its own, in front of the shared private dockerd."""
    rec = Recorder()
    path = os.path.join(short_dir(), "p.sock")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    task: asyncio.Task[None] | None = None

    def serve() -> None:
        nonlocal task
        asyncio.set_event_loop(loop)
        task = loop.create_task(server.serve(path, bare_engine.sock, rec, ready=ready.set))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield path, rec
    loop.call_soon_threadsafe(task.cancel)  # type: ignore[union-attr]
    thread.join(10)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def cli(sock: str, *args: str, **kwargs: object) -> subprocess.CompletedProcess:
    return engine.docker_cli(sock, *args, timeout=60, **kwargs)  # type: ignore[arg-type]


def test_docker_run_through_the_proxy_and_the_rewrite_reaches_the_engine(
    shim: tuple[str, Recorder], bare_engine: engine.Dockerd
) -> None:
    sock, rec = shim
    out = cli(sock, "run", "--rm", engine.BUSYBOX_TAG, "echo", "hi")
    assert (out.returncode, out.stdout) == (0, "hi\n"), out.stderr
    out = cli(sock, "run", "-i", "--rm", engine.BUSYBOX_TAG, "cat", input="data\n")
    assert (out.returncode, out.stdout) == (0, "data\n"), out.stderr
    out = cli(sock, "create", "--name", "proxy-label", engine.BUSYBOX_TAG, "true")
    assert out.returncode == 0, out.stderr
    try:
        labels = engine.engine_api(bare_engine.sock).inspect_container("proxy-label")
        assert labels["Config"]["Labels"] == {"io.test.proxy": "seen"}
    finally:
        cli(sock, "rm", "-f", "proxy-label")
    assert len(rec.seen) == 3


def test_logs_follow_exec_and_events_stream(shim: tuple[str, Recorder]) -> None:
    sock, _ = shim
    # From a moment before the run: dockerd replays what it logged since, so a create the
    # stream was not yet subscribed for still shows.
    since = str(int(time.time()) - 1)
    argv = ["docker", "-H", f"unix://{sock}", "events", "--since", since,
            "--filter", "container=proxy-logs", "--format", "{{.Action}}"]  # fmt: skip
    events = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        script = "for i in 1 2 3; do echo line$i; sleep 0.2; done; sleep 30"
        out = cli(sock, "run", "-d", "--name", "proxy-logs", engine.BUSYBOX_TAG, "sh", "-c", script)
        assert out.returncode == 0, out.stderr
        follow = subprocess.Popen(
            ["docker", "-H", f"unix://{sock}", "logs", "-f", "proxy-logs"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert follow.stdout is not None
        lines = [follow.stdout.readline() for _ in range(3)]  # arrive while it still runs
        follow.kill()
        follow.wait()
        assert lines == ["line1\n", "line2\n", "line3\n"]
        out = cli(sock, "exec", "proxy-logs", "echo", "from-exec")
        assert (out.returncode, out.stdout) == (0, "from-exec\n"), out.stderr
        out = cli(sock, "exec", "-i", "proxy-logs", "cat", input="exec-stdin\n")
        assert (out.returncode, out.stdout) == (0, "exec-stdin\n"), out.stderr
    finally:
        cli(sock, "rm", "-f", "proxy-logs")
    assert events.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while "destroy" not in seen and time.monotonic() < deadline:
        seen.append(events.stdout.readline().strip())
    events.kill()
    events.wait()
    assert {"create", "start", "exec_start: echo from-exec", "destroy"} <= set(seen)


def test_large_upload_streams_through(shim: tuple[str, Recorder]) -> None:
    sock, _ = shim
    tmp = short_dir()
    try:
        blob = os.path.join(tmp, "blob")
        with open(blob, "wb") as f:
            f.write(os.urandom(1 << 20) * 24)  # 24 MiB: over the interception cap
        out = cli(sock, "run", "-d", "--name", "proxy-cp", engine.BUSYBOX_TAG, "sleep", "30")
        assert out.returncode == 0, out.stderr
        out = cli(sock, "cp", blob, "proxy-cp:/tmp/blob")  # a chunked PUT of a tar stream
        assert out.returncode == 0, out.stderr
        out = cli(sock, "exec", "proxy-cp", "sh", "-c", "wc -c < /tmp/blob")
        assert out.stdout.strip() == str(24 << 20), out.stderr
        back = os.path.join(tmp, "back")
        assert cli(sock, "cp", "proxy-cp:/tmp/blob", back).returncode == 0
        with open(blob, "rb") as a, open(back, "rb") as b:
            assert a.read() == b.read()
    finally:
        cli(sock, "rm", "-f", "proxy-cp")
        shutil.rmtree(tmp, ignore_errors=True)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("docker")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def test_many_requests_on_one_keep_alive_connection(shim: tuple[str, Recorder]) -> None:
    sock, rec = shim
    conn = UnixHTTPConnection(sock)
    conn.connect()
    first = conn.sock
    for i in range(300):
        # HEAD (only /_ping routes it) has a Content-Length but no body.
        method, target = [("GET", "/v1.41/containers/json"), ("HEAD", "/_ping"), ("GET", "/_ping")][
            i % 3
        ]
        conn.request(method, target)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    body = json.dumps({"Image": engine.BUSYBOX_TAG, "Cmd": ["true"]})
    conn.request("POST", "/v1.41/containers/create", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    created = json.loads(resp.read())
    assert resp.status == 201, created
    conn.request("DELETE", f"/v1.41/containers/{created['Id']}")
    assert conn.getresponse().status == 204
    assert conn.sock is first  # never reconnected
    conn.close()
    assert len(rec.seen) == 1


def test_a_copy_goes_on_the_connection_its_stat_kept(shim: tuple[str, Recorder]) -> None:
    """`docker cp` asks HEAD /containers/{id}/archive (the path's stat, whose answer has no
    length) and sends its tar on the same connection: the answer must not end it."""
    sock, _ = shim
    out = cli(sock, "run", "-d", engine.BUSYBOX_TAG, "sleep", "30")
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("payload"), io.BytesIO(b""))
    conn = UnixHTTPConnection(sock)
    try:
        conn.connect()
        first = conn.sock
        conn.request("HEAD", f"/v1.41/containers/{cid}/archive?path=%2Ftmp")
        stat = conn.getresponse()
        stat.read()
        assert stat.status == 200 and stat.getheader("Content-Length") is None
        assert stat.getheader("X-Docker-Container-Path-Stat")
        conn.request(
            "PUT", f"/v1.41/containers/{cid}/archive?path=%2Ftmp", data.getvalue(),
            {"Content-Type": "application/x-tar"},
        )  # fmt: skip
        put = conn.getresponse()
        put.read()
        assert put.status == 200
        assert conn.sock is first
    finally:
        conn.close()
        cli(sock, "rm", "-f", cid)


def test_docker_py_sdk_run(shim: tuple[str, Recorder]) -> None:
    sock, rec = shim
    client = docker.DockerClient(base_url=f"unix://{sock}", version="auto", timeout=60)
    try:
        out = client.containers.run(engine.BUSYBOX_TAG, ["echo", "sdk"], remove=True)
        assert out == b"sdk\n"
        assert len(rec.seen) == 1
    finally:
        client.close()


def _long_get(size: int) -> bytes:
    """A GET head of exactly `size` bytes, most of it one long query value."""
    pre, post = b"GET /v1.41/containers/json?pad=", b" HTTP/1.1\r\nHost: docker\r\n\r\n"
    return pre + b"a" * (size - len(pre) - len(post)) + post


def _exchange(sock: str, head: bytes, piece: int) -> tuple[bytes, dict[str, str], bytes]:
    """Send `head` in writes of `piece` bytes, each one sent before the next is written; a
    server may answer and close before the last one (as Go does past its limit)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sock)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for at in range(0, len(head), piece):
                s.sendall(head[at : at + piece])
                if piece < len(head):
                    time.sleep(0.001)  # separate reads on the shim's side
        return asyncio.run(_read_one(s))


async def _read_one(s: socket.socket) -> tuple[bytes, dict[str, str], bytes]:
    reader, writer = await asyncio.open_unix_connection(sock=s.dup())
    try:
        return await asyncio.wait_for(read_response(reader), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("piece", [1 << 21, 4096], ids=["one-write", "many-writes"])
def test_request_heads_up_to_dockerds_limit_pass_and_longer_get_431(
    shim: tuple[str, Recorder], bare_engine: engine.Dockerd, piece: int
) -> None:
    sock, _ = shim
    limit = (1 << 20) + 4096  # Go's DefaultMaxHeaderBytes plus net/http's bufio slack
    for size in (900 << 10, limit):  # a legacy build's --build-arg values go in the query
        status, _, body = _exchange(sock, _long_get(size), piece)
        assert status == b"HTTP/1.1 200 OK", (size, body[:200])
        assert json.loads(body) == []
    # dockerd itself draws the line there, whatever the reads
    assert _exchange(bare_engine.sock, _long_get(limit), piece)[0] == b"HTTP/1.1 200 OK"
    engine_says = _exchange(bare_engine.sock, _long_get(limit + 1), piece)[0]
    assert engine_says == b"HTTP/1.1 431 Request Header Fields Too Large"
    status, headers, body = _exchange(sock, _long_get(limit + 1), piece)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert headers["connection"] == "close"
    assert "Go's MaxHeaderBytes" in json.loads(body)["message"]


# What dockerd's Go server answers to each framing (None: it reads the message one way,
# and a proxy in front might read it another; the shim refuses those too).
AMBIGUOUS = {
    "two Content-Lengths": (b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", 400),
    "a signed Content-Length": (b"Content-Length: +2\r\n\r\n{}", 400),
    "Content-Length beside Transfer-Encoding": (
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        None,
    ),
    "a chunk size that is not hex": (
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        None,
    ),
    "bare LFs in a chunked body": (b"Transfer-Encoding: chunked\r\n\r\n2\n{}\n0\n\n", None),
}


@pytest.mark.parametrize("what", list(AMBIGUOUS))
def test_a_create_with_ambiguous_framing_gets_400_and_goes_nowhere(
    shim: tuple[str, Recorder], bare_engine: engine.Dockerd, what: str
) -> None:
    sock, rec = shim
    framing, engine_status = AMBIGUOUS[what]
    data = b"POST /v1.41/containers/create HTTP/1.1\r\nHost: docker\r\n" + framing
    if engine_status is not None:  # dockerd itself refuses these bytes the same way
        assert _exchange(bare_engine.sock, data, len(data))[0].startswith(b"HTTP/1.1 400")
    status, headers, body = _exchange(sock, data, len(data))
    assert status == b"HTTP/1.1 400 Bad Request"
    assert headers["connection"] == "close"
    message = json.loads(body)["message"]
    assert message.startswith("bad request: ") and message.count("bad request") == 1, message
    assert rec.seen == []  # neither the interceptor nor the Engine got the create
