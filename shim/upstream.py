"""The Engine side of a shim connection: one upstream connection per client connection.

Opened lazily and reopened when the Engine closed it between requests, so the
Engine sees the client's connection pattern.  `Link.forward` is what the
interceptor calls to send a (rewritten) request and buffer its answer; spliced
traffic never goes through it (shim/response.py passes the Engine's answers on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from shim.flow import FlowControl, Pause
from shim.framing import (
    MAX_BODY,
    NO_BODY_STATUS,
    BadMessage,
    Closed,
    Request,
    Response,
    UpstreamError,
    encode_request,
)
from shim.headlimit import response_head_end
from shim.parser import Parser
from shim.states import Ev, Machine, Resp

log = logging.getLogger(__name__)


class Hearer(Protocol):
    """What an upstream connection reports to (shim/response.py's `Relay`)."""

    def data(self, up: Upstream, data: bytes) -> None: ...
    def eof(self, up: Upstream) -> bool: ...
    def lost(self, up: Upstream) -> None: ...


class Upstream(asyncio.Protocol):
    """One connection to the Engine: its unread bytes and the parser of its answers.
    Everything it hears goes to its hearer (the connection's relay, shim/response.py)."""

    __slots__ = ("buf", "eof", "flow", "hearer", "parser", "transport")

    def __init__(self, hearer: Hearer, flow: FlowControl) -> None:
        self.hearer = hearer
        self.flow = flow
        self.eof = False
        self.transport: asyncio.Transport | None = None
        self.buf = b""  # the Engine's bytes not yet passed on
        self.parser = Parser(response=True)

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


class Link:
    """A client connection's way to the Engine: the current upstream connection (if any),
    the state of the Engine's side, and `forward` for the interceptor.

    It knows of its client connection only what it is given: where the Engine is, the
    forward timeout, the flow control both sides share, whom upstream connections report
    to, whether the client has gone, and the Engine's side of the connection's states.
    """

    __slots__ = (
        "client_gone", "collector", "connecting", "eof_sent", "flow", "forward_timeout",
        "hearer", "path", "resp", "up",
    )  # fmt: skip

    def __init__(
        self,
        path: str,
        forward_timeout: float,
        flow: FlowControl,
        hearer: Hearer,
        client_gone: Callable[[], bool],
        resp: Machine[Resp],
    ) -> None:
        self.path = path
        self.forward_timeout = forward_timeout
        self.flow = flow
        self.hearer = hearer
        self.client_gone = client_gone
        self.up: Upstream | None = None
        self.resp = resp  # the Engine's side of the connection's Conversation
        self.connecting: asyncio.Future[None] | None = None
        self.collector: Collector | None = None
        self.eof_sent = False  # the client's EOF went upstream as a write-EOF

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.up.transport if self.up is not None else None

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

    async def forward(self, request: Request, *, timeout: float | None = None) -> Response:
        """Send `request` on this connection's upstream; return the whole response."""
        raw = encode_request(request)
        limit = self.forward_timeout if timeout is None else timeout
        written = False
        try:
            async with asyncio.timeout(limit):
                if self.client_gone():
                    raise Closed("client went away")
                await self.ensure()
                assert self.up is not None and self.up.transport is not None
                future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
                self.collector = Collector(future, request.method == "HEAD")
                self.resp.fire(Ev.FORWARD)
                self.up.transport.write(raw)
                written = True
                return await future
        except (TimeoutError, OSError, Closed, BadMessage) as e:
            self.drop()
            what = "timed out" if isinstance(e, TimeoutError) else f"failed: {e}"
            raise UpstreamError(
                f"{request.method} {request.target} {what}", maybe_delivered=written
            ) from e
        finally:
            self.collector = None
            if self.resp.state is Resp.COLLECTING:
                self.resp.fire(Ev.RESPONSE_END)

    def collect(self, up: Upstream, eof: bool = False) -> None:
        """Advance the buffered response for `forward`; settle its future when complete."""
        c = self.collector
        assert c is not None
        if c.future.done():
            return
        p = up.parser
        try:
            while not c.headed:
                end = response_head_end(up.buf)
                if not end:
                    if eof:
                        raise Closed("the Engine closed the connection before answering")
                    return
                if p.head(up.buf, end) and (p.upgraded or p.status >= 200):
                    _headed(c, p)  # else an interim answer (100 Continue): skipped
                up.buf = up.buf[end:]
            if c.until_close:
                c.parts.append(up.buf)
                c.size += len(up.buf)
                up.buf = b""
                if c.size > MAX_BODY:
                    raise BadMessage("response too large")
                if not eof:
                    return
            else:
                if up.buf and not p.done:
                    pos = p.body(up.buf, 0)
                    c.size += pos
                    up.buf = up.buf[pos:]
                if c.size > MAX_BODY:
                    raise BadMessage("response too large")
                if not p.done:
                    if eof:
                        raise Closed("the Engine closed the connection inside a response")
                    return
        except (Closed, BadMessage) as e:
            c.future.set_exception(e)
            return
        if not c.keep or up.buf or eof:
            self.drop()
        c.future.set_result(Response(c.status, c.reason, c.headers, b"".join(c.parts)))

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
        self.up = up
        self.flow.attach_upstream(transport)

    def drop(self) -> None:
        """Abort the upstream connection, if any: the next request opens a new one."""
        if self.up is not None and self.up.transport is not None:
            self.up.transport.abort()
        self.up = None
        self.eof_sent = False
        self.flow.attach_upstream(None)


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
