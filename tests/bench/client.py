"""Minimal HTTP/1.1 clients on unix sockets, so the client's own cost stays small and equal.

The docker SDK (requests + urllib3) costs more per call than the plugin budget being
measured; these clients send pre-built request bytes and parse only the framing.  The
synchronous `Conn` is for sequential latency and streams; `run_load` and `run_contention`
are asyncio load generators meant to run in worker processes (see __main__), so on a
2-core machine the load is spread over both cores instead of one interpreter's GIL.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Sequence

API = "/v1.41"  # dockerd 20.10's API version: no negotiation round trip per call
READ = 256 * 1024


class HTTPError(Exception):
    pass


def encode(
    method: str, target: str, body: bytes | None = None, headers: Sequence[str] = ()
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: docker", *headers]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _framing(head: bytes) -> tuple[int, int | None, bool]:
    """(status, content-length or None, chunked) from a response head."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    if status in (204, 304) or 100 <= status < 200:
        length = 0
    return status, length, chunked


class Conn:
    """One keep-alive connection; `request` returns (status, body) or counts a body it skips."""

    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = bytearray()

    def connect(self) -> socket.socket:
        if self.sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            s.connect(self.path)
            self.sock = s
            self.buf = bytearray()
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _fill(self) -> None:
        assert self.sock is not None
        data = self.sock.recv(READ)
        if not data:
            raise HTTPError("connection closed")
        self.buf += data

    def _head(self) -> bytes:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        head = bytes(self.buf[:end])
        del self.buf[: end + 4]
        return head

    def _take(self, n: int, keep: bool) -> bytes:
        """Consume n body bytes; return them only when keep (else count and drop)."""
        parts = []
        while n > 0:
            if not self.buf:
                self._fill()
            chunk = self.buf[:n]
            n -= len(chunk)
            if keep:
                parts.append(bytes(chunk))
            del self.buf[: len(chunk)]
        return b"".join(parts)

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return line

    def request(
        self, raw: bytes, *, keep_body: bool = True, head_only: bool = False
    ) -> tuple[int, bytes, int]:
        """Send pre-encoded `raw`; return (status, body or b"", body size)."""
        self.connect().sendall(raw)
        return self.response(keep_body=keep_body, head_only=head_only)

    def response(
        self, *, keep_body: bool = True, head_only: bool = False
    ) -> tuple[int, bytes, int]:
        status, length, chunked = _framing(self._head())
        if head_only:
            return status, b"", 0
        if length is not None and not chunked:
            body = self._take(length, keep_body)
            return status, body, length
        if chunked:
            parts, size = [], 0
            while (n := int(self._line().split(b";")[0], 16)) > 0:
                parts.append(self._take(n, keep_body))
                size += n
                self._take(2, False)
            while self._line():  # trailers
                pass
            return status, b"".join(parts), size
        size = len(self.buf)  # read to close
        self.buf.clear()
        assert self.sock is not None
        while data := self.sock.recv(READ):
            size += len(data)
        self.close()
        return status, b"", size

    def call(self, method: str, target: str, body: object = None) -> tuple[int, object]:
        raw = encode(method, target, None if body is None else json.dumps(body).encode())
        status, data, _ = self.request(raw)
        return status, (json.loads(data) if data.strip() else None)


def timed_calls(conn: Conn, raw: bytes, count: int) -> list[float]:
    """Latency in ms of `count` sequential calls of `raw` on one keep-alive connection."""
    out = []
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        status, _, _ = conn.request(raw, keep_body=False)
        out.append((clock() - t0) * 1000)
        if status != 200:
            raise HTTPError(f"{raw.split(b' ', 2)[:2]} answered {status}")
    return out


def attach_echo(path: str, container: str, payload: int, start: bytes) -> float:
    """Stream `payload` bytes through `cat` in an attached container; return seconds.

    The container was created with OpenStdin/StdinOnce; it is attached (hijacked with
    `Upgrade: tcp`, as the docker CLI does), started, fed, half-closed, and read to EOF.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(path)
    s.sendall(
        encode(
            "POST",
            f"{API}/containers/{container}/attach?stream=1&stdin=1&stdout=1&stderr=1",
            headers=("Connection: Upgrade", "Upgrade: tcp"),
        )
    )
    head = b""
    while b"\r\n\r\n" not in head:
        data = s.recv(4096)
        if not data:
            raise HTTPError("attach: connection closed")
        head += data
    rest = head.split(b"\r\n\r\n", 1)[1]
    status = int(head.split(b" ", 2)[1])
    if status not in (101, 200):
        raise HTTPError(f"attach answered {status}")
    starter = Conn(path)
    try:
        code, _, _ = starter.request(start)
    finally:
        starter.close()
    if code not in (204, 304):
        raise HTTPError(f"start answered {code}")
    block = b"x" * 65536
    received = [len(rest)]

    def reader() -> None:
        buf = bytearray(READ)
        while n := s.recv_into(buf):
            received[0] += n

    t0 = time.perf_counter()
    th = threading.Thread(target=reader)
    th.start()
    left = payload
    while left > 0:
        s.sendall(block if left >= len(block) else block[:left])
        left -= len(block)
    s.shutdown(socket.SHUT_WR)
    th.join()
    elapsed = time.perf_counter() - t0
    s.close()
    # Each frame of the multiplexed stream carries an 8-byte header: expect a little more.
    if received[0] < payload:
        raise HTTPError(f"attach echoed {received[0]} of {payload} bytes")
    return elapsed


# --- asyncio load generators (run in worker processes) ---------------------------------------


async def _aresponse(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status, length, chunked = _framing((await reader.readuntil(b"\r\n\r\n"))[:-4])
    if chunked:
        parts = []
        while (n := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)) > 0:
            parts.append((await reader.readexactly(n + 2))[:-2])
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass
        return status, b"".join(parts)
    return status, (await reader.readexactly(length) if length else b"")


async def _load_client(
    path: str, raws: Sequence[bytes], until: float, lat: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=READ)
    clock = time.perf_counter
    i = 0
    try:
        while time.time() < until:
            t0 = clock()
            writer.write(raws[i % len(raws)])
            status, _ = await _aresponse(reader)
            lat.append((clock() - t0) * 1000)
            if status != 200:
                errors.append(status)
            i += 1
    finally:
        writer.close()


def run_load(path: str, raws: Sequence[bytes], clients: int, start: float, duration: float):
    """Worker entry: `clients` keep-alive connections cycling `raws` from `start` (epoch s)."""

    async def main() -> tuple[int, list[float], list[int]]:
        await asyncio.sleep(max(0.0, start - time.time()))
        lat: list[float] = []
        errors: list[int] = []
        until = start + duration
        await asyncio.gather(
            *(_load_client(path, raws, until, lat, errors) for _ in range(clients))
        )
        return len(lat), lat, errors

    return asyncio.run(main())


async def _racer(path: str, create: bytes, until: float, out: dict[str, list]) -> None:
    reader, writer = await asyncio.open_unix_connection(path, limit=READ)
    clock = time.perf_counter
    try:
        while time.time() < until:
            t0 = clock()
            writer.write(create)
            status, body = await _aresponse(reader)
            ms = (clock() - t0) * 1000
            if status == 201:
                out["grant_ms"].append(ms)
                cid = json.loads(body)["Id"]
                writer.write(encode("DELETE", f"{API}/containers/{cid}?force=1"))
                status, _ = await _aresponse(reader)
                if status != 204:
                    out["errors"].append(f"delete {status}")
            elif status == 409:
                out["refusal_ms"].append(ms)
            else:
                out["errors"].append(f"create {status}: {body[:200]!r}")
    finally:
        writer.close()


def run_contention(path: str, image: str, clients: int, start: float, duration: float) -> dict:
    """Worker entry: `clients` racers doing create --gpus 1 (then rm on success) in a loop."""
    spec = {
        "Image": image,
        "Cmd": ["true"],
        "HostConfig": {"DeviceRequests": [{"Driver": "", "Count": 1, "Capabilities": [["gpu"]]}]},
    }
    create = encode("POST", f"{API}/containers/create", json.dumps(spec).encode())

    async def main() -> dict:
        await asyncio.sleep(max(0.0, start - time.time()))
        out: dict[str, list] = {"grant_ms": [], "refusal_ms": [], "errors": []}
        await asyncio.gather(*(_racer(path, create, start + duration, out) for _ in range(clients)))
        return out

    return asyncio.run(main())
