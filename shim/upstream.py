"""The Engine's side of a shim connection, as I/O: one upstream connection per client's.

Opened lazily and reopened when the Engine closed it between requests, so the Engine
sees the client's connection pattern.  What comes on it goes to its hearer
(shim/splice.py), which hands it to the sans-IO connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from shim.flow import FlowControl
from shim.framing import Closed, UpstreamError
from shim.states import Pause


class Hearer(Protocol):
    """What an upstream connection reports to (shim/splice.py's `Splice`)."""

    def data(self, up: Upstream, data: bytes) -> None: ...
    def eof(self, up: Upstream) -> bool: ...
    def lost(self, up: Upstream) -> None: ...


class Upstream(asyncio.Protocol):
    """One connection to the Engine: everything it hears goes to its hearer."""

    __slots__ = ("eof", "flow", "hearer", "transport")

    def __init__(self, hearer: Hearer, flow: FlowControl) -> None:
        self.hearer = hearer
        self.flow = flow
        self.eof = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # typeshed: BaseTransport

    def data_received(self, data: bytes) -> None:
        self.hearer.data(self, data)

    def eof_received(self) -> bool:
        self.eof = True
        return self.hearer.eof(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.hearer.lost(self)

    def pause_writing(self) -> None:
        self.flow.pause_client(Pause.PEER)

    def resume_writing(self) -> None:
        self.flow.resume_client(Pause.PEER)


class Link:
    """A client connection's way to the Engine: the current upstream connection, if any.

    It knows of its client connection only what it is given: where the Engine is, the
    flow control both sides share, whom upstream connections report to, whether the
    client has gone, and whom to tell when a new upstream connection is open.
    """

    __slots__ = (
        "client_gone", "connecting", "flow", "hearer", "opened", "path", "transport", "up",
    )  # fmt: skip

    def __init__(
        self,
        path: str,
        flow: FlowControl,
        hearer: Hearer,
        client_gone: Callable[[], bool],
        opened: Callable[[], None],
    ) -> None:
        self.path = path
        self.flow = flow
        self.hearer = hearer
        self.client_gone = client_gone
        self.opened = opened
        self.up: Upstream | None = None
        self.transport: asyncio.Transport | None = None  # up's, read once per write
        self.connecting: asyncio.Future[None] | None = None

    @property
    def live(self) -> bool:
        """Whether a request can go upstream now, without connecting."""
        up = self.up
        return (
            up is not None
            and not up.eof
            and up.transport is not None
            and not (up.transport.is_closing())
        )

    async def ensure(self) -> None:
        """Open the upstream connection unless a live one exists; UpstreamError if it can't."""
        while self.connecting is not None:
            await asyncio.shield(self.connecting)
        if self.live:
            return
        self.drop()
        loop = asyncio.get_running_loop()
        path = self.path
        self.connecting = loop.create_future()
        try:
            transport, up = await loop.create_unix_connection(
                lambda: Upstream(self.hearer, self.flow), path
            )
        except OSError as e:
            raise UpstreamError(
                f"cannot connect to the Engine at {path}: {e}", maybe_delivered=False
            ) from e
        finally:
            self.connecting.set_result(None)
            self.connecting = None
        if self.client_gone():
            transport.abort()
            raise Closed("client went away")
        self.up, self.transport = up, up.transport
        self.flow.attach_upstream(transport)
        self.opened()

    def drop(self) -> None:
        """Abort the upstream connection, if any: the next request opens a new one."""
        if self.up is not None and self.up.transport is not None:
            self.up.transport.abort()
        self.up = self.transport = None
        self.flow.attach_upstream(None)
