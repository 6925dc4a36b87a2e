"""One HTTP exchange over a unix socket, for gpu-alloc's own small calls to its sockets."""

from __future__ import annotations

import http.client
import socket


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
