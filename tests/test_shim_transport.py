"""The shim transport (framing, splice, upstream, server): edge cases against fake upstreams,
then the real Engine through the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import docker
import pytest

from shim import framing, server
from tests import engine

# --- helpers -------------------------------------------------------------------------------


class Recorder:
    """Intercepts POST .../containers/create: adds a label, keeps what happened."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[framing.Request] = []
        self.errors: list[framing.UpstreamError] = []

    def wants(self, method: str, target: str) -> bool:
        return method == "POST" and target.split("?", 1)[0].endswith("/containers/create")

    async def handle(self, request: framing.Request, forward: framing.Forward) -> framing.Response:
        self.seen.append(framing.Request(**vars(request)))  # a copy: the body is rewritten below
        if self.fail:
            raise RuntimeError("boom")
        body = json.loads(request.body or b"{}")
        body["Labels"] = {**(body.get("Labels") or {}), "io.test.proxy": "seen"}
        request.body = json.dumps(body).encode()
        try:
            return await forward(request)
        except framing.UpstreamError as e:
            self.errors.append(e)
            return framing.Response(503, "", [("Content-Type", "application/json")], b"{}")


_made: list[str] = []


def short_dir() -> str:
    """A short /tmp dir (unix socket paths are limited to 108 bytes), removed after the test."""
    _made.append(tempfile.mkdtemp(prefix="gap-", dir="/tmp"))
    return _made[-1]


@pytest.fixture(autouse=True)
def _remove_short_dirs() -> Iterator[None]:
    yield
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


async def start_proxy(
    upstream: str, interceptor: object, **kwargs: object
) -> tuple[str, asyncio.Task[None]]:
    path = os.path.join(short_dir(), "p.sock")
    ready = asyncio.Event()
    task = asyncio.create_task(
        server.serve(path, upstream, interceptor, ready=ready.set, **kwargs)  # type: ignore[arg-type]
    )
    await asyncio.wait_for(ready.wait(), 5)
    return path, task


async def fake_upstream(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[str, asyncio.AbstractServer]:
    path = os.path.join(short_dir(), "up.sock")
    server = await asyncio.start_unix_server(handler, path)
    return path, server


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One Content-Length response: (status line, lower-cased headers, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(
        (k.strip().lower(), v.strip()) for k, v in (x.split(":", 1) for x in lines[1:] if x)
    )
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0].encode(), headers, body


def run_async(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


async def echo_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A fake Engine: answers each request with its own raw head+body as the JSON body."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            break
        body = b""
        low = head.lower()
        if b"transfer-encoding: chunked" in low:
            while (line := await reader.readline()) != b"0\r\n":
                body += (await reader.readexactly(int(line.split(b";")[0], 16) + 2))[:-2]
            await reader.readexactly(2)
        elif b"content-length:" in low:
            n = int(low.split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(n)
        payload = json.dumps({"head": head.decode(), "body": body.decode()}).encode()
        writer.write(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        await writer.drain()
    writer.close()


# --- unit tests with fake upstreams ----------------------------------------------------------


def test_chunked_body_is_spliced_raw_and_pipelined_requests_split() -> None:
    async def scenario() -> None:
        up, server = await fake_upstream(echo_requests)
        path, task = await start_proxy(up, Recorder())
        reader, writer = await asyncio.open_unix_connection(path)
        # Two requests in one write: a chunked PUT (with an extension) and a GET.
        writer.write(
            b"PUT /containers/x/archive?path=/ HTTP/1.1\r\nHost: d\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n"
        )
        status, _, body = await read_response(reader)
        assert status == b"HTTP/1.1 201 Created"
        echoed = json.loads(body)
        assert echoed["body"] == "hello world"
        assert "Transfer-Encoding: chunked" in echoed["head"]  # the client's bytes, unchanged
        status, _, body = await read_response(reader)
        assert json.loads(body)["head"].startswith("GET /_ping HTTP/1.1")
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_intercepted_chunked_request_is_rewritten_with_content_length() -> None:
    async def scenario() -> None:
        up, server = await fake_upstream(echo_requests)
        rec = Recorder()
        path, task = await start_proxy(up, rec)
        reader, writer = await asyncio.open_unix_connection(path)
        for _ in range(3):  # keep-alive: every request on the connection is offered
            writer.write(
                b"POST /v1.41/containers/create?name=a HTTP/1.1\r\nHost: d\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'4\r\n{"Im\r\n9\r\nage":"x"}\r\n0\r\n\r\n'
            )
            status, headers, body = await read_response(reader)
            assert status == b"HTTP/1.1 201 Created"
            assert headers.get("connection") != "close"
            echoed = json.loads(body)
            forwarded = json.loads(echoed["body"])
            assert forwarded == {"Image": "x", "Labels": {"io.test.proxy": "seen"}}
            assert "Transfer-Encoding" not in echoed["head"]
            assert f"Content-Length: {len(echoed['body'])}" in echoed["head"]
        assert [r.target for r in rec.seen] == ["/v1.41/containers/create?name=a"] * 3
        assert rec.seen[0].body == b'{"Image":"x"}'
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_intercepted_body_over_the_cap_gets_413() -> None:
    async def scenario() -> None:
        up, server = await fake_upstream(echo_requests)
        rec = Recorder()
        path, task = await start_proxy(up, rec, max_body=100)
        for frame in (b"Content-Length: 200\r\n\r\n", b"Transfer-Encoding: chunked\r\n\r\n"):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"POST /containers/create HTTP/1.1\r\nHost: d\r\n" + frame)
            if b"chunked" in frame:
                writer.write(b"c8\r\n" + b"x" * 200 + b"\r\n0\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert status.startswith(b"HTTP/1.1 413")
            assert headers["content-type"] == "application/json"
            assert headers["connection"] == "close"
            assert "too large" in json.loads(body)["message"]
            assert await reader.read() == b""
            writer.close()
        assert rec.seen == []
        task.cancel()
        server.close()

    run_async(scenario())


def test_interceptor_error_is_a_500_in_engine_format_and_connection_survives() -> None:
    async def scenario() -> None:
        up, server = await fake_upstream(echo_requests)
        path, task = await start_proxy(up, Recorder(fail=True))
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}")
        status, headers, body = await read_response(reader)
        assert status == b"HTTP/1.1 500 Internal Server Error"
        assert headers["content-type"] == "application/json"
        assert "RuntimeError: boom" in json.loads(body)["message"]
        writer.write(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
        status, _, _ = await read_response(reader)
        assert status == b"HTTP/1.1 201 Created"
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_upstream_dropping_mid_response_closes_the_client() -> None:
    async def truncating(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        up, server = await fake_upstream(truncating)
        path, task = await start_proxy(up, Recorder())
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"GET /containers/json HTTP/1.1\r\nHost: d\r\n\r\n")
        data = await reader.read()  # EOF must come: the client must not wait for 90 bytes
        assert data.endswith(b"\r\n\r\n0123456789")
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_upstream_closing_before_answering_gives_502_and_forward_raises() -> None:
    async def hangup(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    async def scenario() -> None:
        up, server = await fake_upstream(hangup)
        rec = Recorder()
        path, task = await start_proxy(up, rec)
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"GET /info HTTP/1.1\r\nHost: d\r\n\r\n")
        status, _, body = await read_response(reader)
        assert status == b"HTTP/1.1 502 Bad Gateway"
        assert "closed the connection" in json.loads(body)["message"]
        writer.close()
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}")
        status, _, _ = await read_response(reader)
        assert status.startswith(b"HTTP/1.1 503")  # the handler's answer to UpstreamError
        assert [e.maybe_delivered for e in rec.errors] == [True]
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_forward_timeout_and_engine_down_are_told_apart() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async def scenario() -> None:
        up, server = await fake_upstream(silent)
        rec = Recorder()
        path, task = await start_proxy(up, rec, forward_timeout=0.2)
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}")
        status, _, _ = await read_response(reader)
        assert status.startswith(b"HTTP/1.1 503")
        server.close()
        await server.wait_closed()
        os.unlink(up)  # the Engine is gone: the next forward cannot even connect
        writer.write(b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}")
        status, _, _ = await read_response(reader)
        assert status.startswith(b"HTTP/1.1 503")
        assert [e.maybe_delivered for e in rec.errors] == [True, False]
        assert "timed out" in str(rec.errors[0])
        writer.close()
        task.cancel()

    run_async(scenario())


def test_head_response_has_no_body_and_keep_alive_continues() -> None:
    async def pings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            if not head.startswith(b"HEAD"):
                writer.write(b"OK")

    async def scenario() -> None:
        up, server = await fake_upstream(pings)
        path, task = await start_proxy(up, Recorder())
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"HEAD /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
        )
        writer.write(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
        assert (await read_response(reader))[2] == b"OK"
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_upgrade_hijack_is_raw_both_ways_with_half_close() -> None:
    async def attach(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
            b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\nhello "
        )
        stdin = await reader.read()  # until the client's write-EOF arrives
        writer.write(b"got:" + stdin)  # output continues after stdin closed
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        up, server = await fake_upstream(attach)
        path, task = await start_proxy(up, Recorder())
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(
            b"POST /containers/x/attach?stream=1&stdin=1 HTTP/1.1\r\nHost: d\r\n"
            b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        )
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"GET / HTTP/1.1\r\n\r\n not http at all")
        writer.write_eof()
        assert await reader.read() == b"hello got:GET / HTTP/1.1\r\n\r\n not http at all"
        writer.close()
        task.cancel()
        server.close()

    run_async(scenario())


def test_serve_sets_socket_mode_and_removes_stale_socket() -> None:
    async def scenario() -> None:
        path = os.path.join(short_dir(), "s.sock")
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)  # a leftover socket file nobody listens on
        stale.close()
        ready = asyncio.Event()
        task = asyncio.create_task(
            server.serve(path, "/nonexistent", Recorder(), mode=0o600, ready=ready.set)
        )
        await asyncio.wait_for(ready.wait(), 5)
        assert os.stat(path).st_mode & 0o777 == 0o600
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not os.path.exists(path)

    run_async(scenario())


# --- the real Engine through the proxy -------------------------------------------------------


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


@pytest.mark.engine
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


@pytest.mark.engine
def test_logs_follow_exec_and_events_stream(shim: tuple[str, Recorder]) -> None:
    sock, _ = shim
    events = subprocess.Popen(
        ["docker", "-H", f"unix://{sock}", "events", "--format", "{{.Action}}"],
        stdout=subprocess.PIPE,
        text=True,
    )
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


@pytest.mark.engine
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


@pytest.mark.engine
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


@pytest.mark.engine
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


@pytest.mark.engine
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
