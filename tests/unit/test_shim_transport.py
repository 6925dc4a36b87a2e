"""The shim transport (framing, splice, upstream, server): edge cases against fake upstreams.

The real Engine through the proxy is tests/engine/test_shim_transport.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Awaitable, Callable, Iterator

import pytest

from shim import server
from tests.support.proxy import Recorder, read_response, remove_short_dirs, short_dir


@pytest.fixture(autouse=True)
def _remove_short_dirs() -> Iterator[None]:
    yield
    remove_short_dirs()


# --- helpers -------------------------------------------------------------------------------


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


def test_http2_prior_knowledge_is_refused_and_never_reaches_the_engine() -> None:
    """Engine 29 routes HTTP/2 application/grpc on its socket to BuildKit, past every
    authorization plugin: the shim answers the preface 400 and opens no upstream."""
    reached: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.append(await reader.read(100))
        writer.close()

    async def scenario() -> None:
        up, upstream = await fake_upstream(engine)
        path, task = await start_proxy(up, Recorder())
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b'"message"' in answer  # in the Engine's error format
        writer.close()
        task.cancel()
        upstream.close()

    run_async(scenario())
    assert reached == []
