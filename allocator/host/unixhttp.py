"""HTTP over a unix socket, for gpu-alloc's own small calls to its sockets and the Engine."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Iterator


class _Connection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def request(
    path: str,
    method: str,
    target: str,
    body: bytes | None = None,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """(status, body); OSError or http.client.HTTPException when the socket does not answer."""
    conn = _Connection(path, timeout)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def lines(path: str, target: str, timeout: float = 10.0) -> Lines:
    """A streamed GET's lines (the Engine's ``/events``): the request is made, and its
    status checked, before this returns; the lines then come with no deadline.  OSError
    (with the Engine's words) when the socket does not answer or the status is not 200."""
    conn = _Connection(path, timeout)
    try:
        conn.request("GET", target)
        resp = conn.getresponse()
        if resp.status != 200:
            raise OSError(f"{resp.status} {resp.read(500).decode(errors='replace').strip()}")
    except http.client.HTTPException as e:
        conn.close()
        raise OSError(f"{type(e).__name__}: {e}") from None
    except BaseException:
        conn.close()
        raise
    assert conn.sock is not None
    conn.sock.settimeout(None)
    return Lines(conn, resp)


class Lines:
    """A streamed response's non-empty lines, until it ends; `abort` ends it from any
    thread (the socket shut down under the reader blocked on it)."""

    def __init__(self, conn: _Connection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            while line := self._resp.readline():
                if line.strip():
                    return line
        except BaseException:
            self._conn.close()
            raise
        self._conn.close()
        raise StopIteration

    def close(self) -> None:
        self._conn.close()

    def abort(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class KeepAlive:
    """GETs on one kept-alive connection per thread.

    The plugin inspects a container at every start and the shim an image at every GPU
    create: a connection per call would cost a connect each (and the docker SDK, with
    requests and urllib3, several times this client's Python).  A reused connection the
    server closed meanwhile is retried once on a fresh one (a GET may be repeated).
    """

    def __init__(self, path: str, timeout: float):
        self.path = path
        self.timeout = timeout
        self._local = threading.local()

    def get(self, target: str) -> tuple[int, bytes]:
        """(status, body); OSError or http.client.HTTPException when the socket fails."""
        while True:
            conn = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._local.conn = _Connection(self.path, self.timeout)
            try:
                conn.request("GET", target)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self._drop(conn)
                if reused:
                    continue
                raise
            if resp.will_close:
                self._drop(conn)
            return resp.status, body

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._local.conn = None
