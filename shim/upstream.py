"""The Engine side of a shim connection: one upstream connection per client connection.

Opened lazily and reopened when the Engine closed it between requests, so the
Engine sees the client's connection pattern.  `UpstreamSide.forward` is what the
interceptor calls to send a (rewritten) request and buffer its answer; spliced
traffic never goes through it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from shim.flow import FlowControl, Pause
from shim.framing import (
    MAX_BODY,
    MAX_HEAD,
    NO_BODY_STATUS,
    BadMessage,
    Closed,
    Request,
    Response,
    UpstreamError,
    encode_request,
)
from shim.parser import Parser
from shim.states import Ev, Machine, Req, Resp

if TYPE_CHECKING:
    from allocator.host.peers import Peer
    from shim.server import Proxy

log = logging.getLogger(__name__)

_CRLF2 = b"\r\n\r\n"


class Collector:
    """A response being buffered for `forward`."""

    __slots__ = (
        "future", "head_req", "headed", "headers", "keep", "parts", "reason", "size", "status",
        "until_close",
    )  # fmt: skip

    def __init__(self, future: asyncio.Future[Response], head_req: bool) -> None:
        self.future = future
        self.head_req = head_req
        self.headed = False  # its final head has come
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.keep = True
        self.until_close = False  # its body ends when the Engine closes the connection
        self.parts: list[bytes] = []
        self.size = 0


class Upstream(asyncio.Protocol):
    """The Engine side of a connection: everything is handed to the owning connection."""

    __slots__ = ("client", "eof", "transport")

    def __init__(self, client: ClientState) -> None:
        self.client = client
        self.eof = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # typeshed: BaseTransport

    def data_received(self, data: bytes) -> None:
        self.client.up_data(self, data)

    def eof_received(self) -> bool:
        self.eof = True
        return self.client.up_eof(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.up_lost(self)

    def pause_writing(self) -> None:
        self.client.flow.pause_client(Pause.PEER)

    def resume_writing(self) -> None:
        self.client.flow.resume_client(Pause.PEER)


class ClientState:
    """The state the parts of `shim.splice.Connection` share, declared for the type
    checker: `Connection.__init__` sets it, and the parts' methods read and change it."""

    proxy: Proxy
    ct: asyncio.Transport | None
    up: Upstream | None
    ut: asyncio.Transport | None
    buf: bytes
    ubuf: bytes
    req: Machine[Req]
    resp: Machine[Resp]
    flow: FlowControl
    parser: Parser
    rparser: Parser
    awaiting: bool
    head_req: bool
    req_keep: bool
    rsent: bool
    client_eof: bool
    eof_sent: bool
    size: int
    pending: tuple[str, str, list[tuple[str, str]], bool, bool] | None
    collector: Collector | None
    task: asyncio.Task[None] | None
    gone: asyncio.Event | None
    connecting: asyncio.Future[None] | None
    peer: Peer | None

    @property
    def closed(self) -> bool:
        return self.req.state is Req.CLOSED

    if TYPE_CHECKING:  # the methods one part calls on another

        def advance(self) -> None: ...
        def reply_error(self, status: int, message: str) -> None: ...
        def close(self, *, abort: bool = False) -> None: ...
        def up_data(self, up: Upstream, data: bytes) -> None: ...
        def up_eof(self, up: Upstream) -> bool: ...
        def up_lost(self, up: Upstream) -> None: ...
        def collect(self, eof: bool = False) -> None: ...
        def drop_upstream(self) -> None: ...
        async def ensure_upstream(self) -> None: ...
        async def forward(self, request: Request, *, timeout: float | None = None) -> Response: ...


class UpstreamSide(ClientState):
    """The upstream half of `shim.splice.Connection`: connect, forward, collect."""

    async def forward(self, request: Request, *, timeout: float | None = None) -> Response:
        """Send `request` on this connection's upstream; return the whole response."""
        raw = encode_request(request)
        limit = self.proxy.forward_timeout if timeout is None else timeout
        written = False
        try:
            async with asyncio.timeout(limit):
                if self.closed:
                    raise Closed("client went away")
                await self.ensure_upstream()
                assert self.ut is not None
                future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
                self.collector = Collector(future, request.method == "HEAD")
                self.resp.fire(Ev.FORWARD)
                self.ut.write(raw)
                written = True
                return await future
        except (TimeoutError, OSError, Closed, BadMessage) as e:
            self.drop_upstream()
            what = "timed out" if isinstance(e, TimeoutError) else f"failed: {e}"
            raise UpstreamError(
                f"{request.method} {request.target} {what}", maybe_delivered=written
            ) from e
        finally:
            self.collector = None
            if self.resp.state is Resp.COLLECTING:
                self.resp.fire(Ev.RESPONSE_END)

    def collect(self, eof: bool = False) -> None:
        """Advance the buffered response for `forward`; settle its future when complete."""
        c = self.collector
        assert c is not None
        if c.future.done():
            return
        p = self.rparser
        try:
            while not c.headed:
                end = self.ubuf.find(_CRLF2)
                if end < 0:
                    if eof:
                        raise Closed("the Engine closed the connection before answering")
                    if len(self.ubuf) > MAX_HEAD:
                        raise BadMessage("response header section too large")
                    return
                end += 4
                if p.head(self.ubuf, end) and (p.upgraded or p.status >= 200):
                    self._headed(c, p)  # else an interim answer (100 Continue): skipped
                self.ubuf = self.ubuf[end:]
            if c.until_close:
                c.parts.append(self.ubuf)
                c.size += len(self.ubuf)
                self.ubuf = b""
                if c.size > MAX_BODY:
                    raise BadMessage("response too large")
                if not eof:
                    return
            else:
                if self.ubuf and not p.done:
                    pos = p.body(self.ubuf, 0)
                    c.size += pos
                    self.ubuf = self.ubuf[pos:]
                if c.size > MAX_BODY:
                    raise BadMessage("response too large")
                if not p.done:
                    if eof:
                        raise Closed("the Engine closed the connection inside a response")
                    return
        except (Closed, BadMessage) as e:
            c.future.set_exception(e)
            return
        if not c.keep or self.ubuf or eof:
            self.drop_upstream()
        c.future.set_result(Response(c.status, c.reason, c.headers, b"".join(c.parts)))

    @staticmethod
    def _headed(c: Collector, p: Parser) -> None:
        """The final head of `forward`'s answer has been fed: take what it says."""
        if p.upgraded:
            raise BadMessage("the Engine switched protocols on a forwarded request")
        c.headed = True
        c.status, c.keep = p.status, p.keep_alive
        c.reason = p.reason.decode("latin-1")
        c.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in p.headers]
        framing = p.framing
        if c.head_req:
            p.skip_body()
        elif c.status not in NO_BODY_STATUS:
            if framing.chunked or framing.length is not None:
                if (framing.length or 0) > MAX_BODY:
                    raise BadMessage("response too large")
                p.parts = c.parts
            else:
                c.until_close, c.keep = True, False

    # -- upstream

    async def ensure_upstream(self) -> None:
        """Open the upstream connection unless a live one exists; UpstreamError if it can't."""
        while self.connecting is not None:
            await asyncio.shield(self.connecting)
        if self.ut is not None and not self.ut.is_closing() and self.up and not self.up.eof:
            return
        self.drop_upstream()
        loop = asyncio.get_running_loop()
        self.connecting = loop.create_future()
        try:
            transport, protocol = await loop.create_unix_connection(
                lambda: Upstream(self), self.proxy.upstream_path
            )
        except OSError as e:
            raise UpstreamError(
                f"cannot connect to the Engine at {self.proxy.upstream_path}: {e}",
                maybe_delivered=False,
            ) from e
        finally:
            self.connecting.set_result(None)
            self.connecting = None
        if self.closed:
            transport.abort()
            raise Closed("client went away")
        self.ut, self.up = transport, protocol
        self.rparser = Parser(response=True)
        self.flow.attach_upstream(transport)

    def drop_upstream(self) -> None:
        if self.ut is not None:
            self.ut.abort()
        self.ut = self.up = None
        self.ubuf = b""
        self.eof_sent = False
        self.flow.attach_upstream(None)
