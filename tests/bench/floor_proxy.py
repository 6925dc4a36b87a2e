"""The proxy floor: the least a Python proxy in front of the Engine can cost.

A byte pump on the shim's own event loop (uvloop where installed): each client
connection gets an upstream connection, and bytes are copied both ways as they
arrive, with no parsing at all (a half-close passes on, as a write-EOF).  Put in front
of the same dockerd as the shim, it shows what one more process in the path costs by
itself; the shim's per-call and streaming rows are read against it.

Run: ``python -m tests.bench.floor_proxy LISTEN UPSTREAM``.
"""

from __future__ import annotations

import asyncio
import os
import sys

from shim.server import event_loop


class _Pipe(asyncio.Protocol):
    """One side of a connection: what arrives is written to the other side."""

    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream  # set on the client side: where to connect to
        self.peer: asyncio.Transport | None = None
        self.transport: asyncio.Transport | None = None
        self.early = b""  # what the client sent before the upstream connection was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.upstream is not None:
            asyncio.get_running_loop().create_task(self._connect(self.upstream))

    async def _connect(self, upstream: str) -> None:
        loop = asyncio.get_running_loop()
        up, other = await loop.create_unix_connection(_Pipe, upstream)
        other.peer = self.transport
        self.peer = up
        if self.early:
            up.write(self.early)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early += data
        else:
            self.peer.write(data)

    def eof_received(self) -> bool:
        """A half-close passes on (an attach's stdin ends; its output still flows)."""
        if self.peer is not None and self.peer.can_write_eof():
            self.peer.write_eof()
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


async def main(listen: str, upstream: str) -> None:
    if os.path.exists(listen):
        os.unlink(listen)
    server = await asyncio.get_running_loop().create_unix_server(lambda: _Pipe(upstream), listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=event_loop) as runner:
        runner.run(main(sys.argv[1], sys.argv[2]))
