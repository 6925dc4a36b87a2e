"""The shim's asyncio protocol: it moves bytes and runs what the connection decides.

Every byte either side sends goes into the sans-IO connection (shim/connection.py), and
every action it returns is run here, in order: writes, half-closes, pauses, the upstream
connection opened or dropped, the interceptor run, `forward`'s answer settled, the end.
Nothing here reads HTTP.  Once the connection says a hijack makes both sides raw pipes
(PIPE), their bytes pass here as they come, unread; EOFs still go through it.

* Plain asyncio Protocols, not streams: the common exchange runs inside data_received
  callbacks with no task switch (a task switch per exchange would be much of the latency
  the proxy adds).  Tasks exist only to connect upstream and to run the interceptor.
* A full socket on one side pauses reading on the other (shim/flow.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from allocator.host import peers
from shim import intercept
from shim.actions import Action, Do
from shim.collect import Intercepted
from shim.connection import Connection
from shim.flow import FlowControl
from shim.framing import BadMessage, Closed, Request, Response, UpstreamError, encode_request
from shim.upstream import Link, Upstream

if TYPE_CHECKING:
    from allocator.host.peers import Peer
    from shim.ports import Settings

log = logging.getLogger(__name__)

TO_ENGINE, TO_CLIENT = Do.TO_ENGINE, Do.TO_CLIENT  # read once (see shim/connection.py)


class Splice(asyncio.Protocol):
    """One client connection and (through `link`) its upstream connection."""

    def __init__(self, proxy: Settings) -> None:
        self.proxy = proxy
        self.conn = Connection(proxy.interceptor.wants, proxy.max_body)
        self.ct: asyncio.Transport | None = None
        self.peer: Peer | None = None
        self.flow = FlowControl()
        self.link = Link(proxy.upstream_path, self.flow, self, self._gone, self._opened)
        self.task: asyncio.Task[None] | None = None  # connecting, or the interceptor
        self.gone: asyncio.Event | None = None  # the intercepted request's client left
        self.settle: asyncio.Future[Response] | None = None  # `forward`'s answer
        self.piping = False  # hijacked: the bytes pass as they come, unread
        self.ended = False

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def _gone(self) -> bool:
        return self.conn.closed

    # -- the client's transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ct = transport  # type: ignore[assignment]  # typeshed: BaseTransport, not Transport
        self.flow.attach_client(self.ct)  # type: ignore[arg-type]
        self.peer = peers.of(transport.get_extra_info("socket"))
        self.proxy.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.conns.discard(self)
        self.close(abort=True)

    def pause_writing(self) -> None:
        self.flow.pause_upstream()

    def resume_writing(self) -> None:
        self.flow.resume_upstream()

    def data_received(self, data: bytes) -> None:
        if self.piping:
            self.link.transport.write(data)  # type: ignore[union-attr]  # kept till the end
            return
        try:
            self._run(self.conn.receive_client(data))
        except Exception:
            self._failed()

    def eof_received(self) -> bool:
        try:
            self._run(self.conn.receive_client_eof())
        except Exception:
            self._failed()
        return True  # what ends the connection closes it; a half-close goes on

    # -- the upstream connection's (shim/upstream.py's Hearer)

    def data(self, up: Upstream, data: bytes) -> None:
        if up is not self.link.up:
            return
        if self.piping:
            self.ct.write(data)  # type: ignore[union-attr]  # set from connection_made on
            return
        try:
            self._run(self.conn.receive_engine(data))
        except Exception:
            self._failed()

    def eof(self, up: Upstream) -> bool:
        if up is not self.link.up:
            return False
        hijacked = self.conn.hijacked  # a hijack's other direction goes on
        try:
            self._run(self.conn.receive_engine_eof())
        except Exception:
            self._failed()
        return hijacked

    def lost(self, up: Upstream) -> None:
        if up is not self.link.up:
            return
        try:
            self._run(self.conn.engine_lost())
        except Exception:
            self._failed()

    def _opened(self) -> None:
        try:
            self._run(self.conn.engine_opened())
        except Exception:
            self._failed()

    # -- the actions

    def _run(self, actions: list[Action]) -> None:
        for do, arg in actions:
            if do is TO_ENGINE:
                ut = self.link.transport
                if ut is None:
                    raise Closed("no upstream connection to write to")
                ut.write(arg)
            elif do is TO_CLIENT:
                assert self.ct is not None  # from connection_made on
                self.ct.write(arg)
            else:
                self._act(do, arg)

    def _act(self, do: Do, arg: Any) -> None:
        if do is Do.PAUSE:
            self.flow.pause_client(arg)
        elif do is Do.RESUME:
            self.flow.resume_client(arg)
        elif do is Do.PIPE:
            self.piping = True
        elif do is Do.CONNECT:
            self.task = asyncio.create_task(self._connect())
        elif do is Do.INTERCEPT:
            self._intercept(arg)
        elif do is Do.SETTLE:
            settle = self.settle
            if settle is not None and not settle.done():
                if isinstance(arg, Response):
                    settle.set_result(arg)
                else:
                    settle.set_exception(arg)
        elif do is Do.EOF_TO_ENGINE:
            ut = self.link.transport
            if ut is not None and not ut.is_closing():
                ut.write_eof()
        elif do is Do.EOF_TO_CLIENT:
            if self.ct is not None and not self.ct.is_closing():
                self.ct.write_eof()
        elif do is Do.GONE:
            if self.gone is not None:
                self.gone.set()  # a waiting create leaves the queue
        elif do is Do.DROP:
            self.link.drop()
        else:
            self._teardown(abort=do is Do.ABORT)

    async def _connect(self) -> None:
        """Open the upstream connection a spliced request waits for (`_opened` sends it)."""
        try:
            await self.link.ensure()
        except (UpstreamError, Closed) as e:
            log.error("%s", e)
            self.task = None
            self._run(self.conn.engine_failed(str(e)))
            return
        self.task = None

    def _intercept(self, held: Intercepted) -> None:
        """Run the interceptor on a request read whole, connecting to the Engine meanwhile."""
        self.gone = asyncio.Event()
        request = Request(held.method, held.target, held.headers, held.body, self.peer, self.gone)
        self.task = asyncio.create_task(self._answer(request, held.keep))
        link = self.link
        if link.up is None and link.connecting is None:
            # Connect while the interceptor leases: `forward` finds the connection made
            # (or makes it, and reports why it cannot).
            early = asyncio.ensure_future(link.ensure())
            early.add_done_callback(_quiet)

    async def _answer(self, request: Request, keep: bool) -> None:
        def send(out: bytes) -> None:
            self.task = None
            try:
                self._run(self.conn.answered(out, keep))
            except Exception:
                self._failed()

        async def pass_on(passed: Request) -> None:
            await self._pass_on(passed, keep)

        await intercept.answer(
            self.proxy.interceptor, request, self.forward, send, keep=keep, pass_on=pass_on
        )

    async def _pass_on(self, request: Request, keep: bool) -> None:
        """Send `request` on this connection's upstream, its answer to stream back as a
        spliced request's; UpstreamError (nothing sent) when no upstream can be had."""
        raw = encode_request(request, upgrade=True)
        try:
            async with asyncio.timeout(self.proxy.forward_timeout):
                if self.closed:
                    raise Closed("client went away")
                await self.link.ensure()
        except (TimeoutError, OSError, Closed) as e:
            raise UpstreamError(
                f"{request.method} {request.target} failed: {e}", maybe_delivered=False
            ) from e
        self.task = None
        self._run(self.conn.passed_on(raw, request.method == "HEAD", keep))

    async def forward(self, request: Request, *, timeout: float | None = None) -> Response:
        """Send `request` on this connection's upstream; return the whole response.  What
        the interceptor calls to send a (rewritten) request; spliced traffic never does."""
        raw = encode_request(request)
        limit = self.proxy.forward_timeout if timeout is None else timeout
        written = failed = False
        try:
            async with asyncio.timeout(limit):
                if self.closed:
                    raise Closed("client went away")
                await self.link.ensure()
                self.settle = asyncio.get_running_loop().create_future()
                self._run(self.conn.forward(raw, request.method == "HEAD"))
                written = True
                return await self.settle
        except (TimeoutError, OSError, Closed, BadMessage) as e:
            failed = True
            what = "timed out" if isinstance(e, TimeoutError) else f"failed: {e}"
            raise UpstreamError(
                f"{request.method} {request.target} {what}", maybe_delivered=written
            ) from e
        finally:
            self.settle = None
            self._run(self.conn.forward_ended(failed))

    # -- the end

    def close(self, *, abort: bool = False) -> None:
        """End the connection, both sides (the server stops, or the client went)."""
        self._run(self.conn.close(abort))

    def _failed(self) -> None:
        log.exception("proxy error")
        self.conn.close(abort=True)
        self._teardown(abort=True)

    def _teardown(self, *, abort: bool) -> None:
        if self.ended:
            return
        self.ended = True
        if self.gone is not None:
            self.gone.set()
        if self.task is not None:
            self.task.cancel()
        if self.settle is not None and not self.settle.done():
            self.settle.set_exception(Closed("connection closed"))
        if self.ct is not None:
            self.ct.abort() if abort else self.ct.close()
        ut = self.link.transport
        if ut is not None:
            ut.abort() if abort else ut.close()
        if self.peer is not None:
            self.peer.close()


def _quiet(task: asyncio.Future[None]) -> None:
    """An early connect that failed: `forward` tries again and says why."""
    if not task.cancelled():
        task.exception()
