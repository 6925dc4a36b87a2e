"""HTTP over a unix socket, for gpu-alloc's own small calls to its sockets and the Engine."""

from __future__ import annotations

import http.client
import socket
import threading


class _Connection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def request(
    path: str, method: str, target: str, body: bytes | None = None, timeout: float = 5.0
) -> tuple[int, bytes]:
    """(status, body); OSError or http.client.HTTPException when the socket does not answer."""
    conn = _Connection(path, timeout)
    try:
        conn.request(method, target, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class KeepAlive:
    """GETs on one kept-alive connection per thread.

    The plugin inspects a container at every start and the shim an image at every GPU
    create: through the docker SDK (requests, urllib3) each inspect cost about 1 ms of
    Python, here a fraction of that.  A reused connection the server closed meanwhile
    is retried once on a fresh one (a GET may be repeated).
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
