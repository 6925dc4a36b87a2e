"""The intercepted half of a shim connection: buffer the request, hand it over, answer.

Only requests the interceptor wants (creates, starts, other device-relevant writes,
gpu-alloc's own read routes) come here; the rest is spliced (shim/splice.py).  The
body is collected whole (bounded by ``max_body``), the interceptor's ``handle`` runs
as a task, and its answer is written back; the connection then goes on reading.
"""

from __future__ import annotations

import asyncio
import logging
import time

from shim.flow import Pause
from shim.framing import Request, UpstreamError, encode_response, error_bytes
from shim.states import Ev
from shim.upstream import ClientState

log = logging.getLogger(__name__)


class InterceptSide(ClientState):
    """The interception half of `shim.splice.Connection`."""

    def start_collect(self, method: str, target: str, keep: bool, end: int) -> None:
        """Buffer the body of the request whose head (buf[:end]) the parser just read."""
        p = self.parser
        cap = self.proxy.max_body
        if p.framing.length is not None and p.framing.length > cap:
            self.reply_error(413, f"request body too large for gpu-alloc (limit {cap} bytes)")
            return
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in p.headers]
        if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in headers):
            assert self.ct is not None  # the client's bytes came on it
            self.ct.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.pending = (method, target, headers, keep, method == "HEAD")
        p.parts = []
        buf = self.buf
        pos = p.body(buf, end)
        self.size = pos - end
        self.buf = buf[pos:]
        self.req.fire(Ev.COLLECT)
        self.collected()

    def collected(self) -> None:
        """The body grew: hand the request to the interceptor once it is whole."""
        p = self.parser
        assert p.parts is not None and self.pending is not None
        if self.size > self.proxy.max_body:
            limit = self.proxy.max_body
            self.reply_error(413, f"request body too large for gpu-alloc (limit {limit} bytes)")
            return
        if not p.done:
            return
        method, target, headers, keep, head_req = self.pending
        body = b"".join(p.parts)
        self.pending = p.parts = None
        self.req.fire(Ev.COLLECTED)
        self.gone = asyncio.Event()
        request = Request(method, target, headers, body, self.peer, self.gone)
        self.task = asyncio.create_task(self._intercept(request, keep, head_req))
        if self.ut is None and self.connecting is None:
            # Connect to the Engine while the interceptor leases: `forward` finds the
            # connection made (or makes it, and reports why it cannot).
            early = asyncio.ensure_future(self.ensure_upstream())
            early.add_done_callback(_quiet)

    async def _intercept(self, request: Request, keep: bool, head_req: bool) -> None:
        started = time.monotonic()
        note = ""
        try:
            response = await self.proxy.interceptor.handle(request, self.forward)
            out = encode_response(response, head_only=head_req, close=not keep)
            status, note = response.status, response.note
        except Exception as e:
            if isinstance(e, UpstreamError):
                log.error("%s %s: Engine exchange failed: %s", request.method, request.target, e)
                msg = f"gpu-alloc shim: the Engine did not answer: {e}"
            else:
                log.exception("%s %s: interceptor failed", request.method, request.target)
                msg = f"gpu-alloc shim: internal error: {type(e).__name__}: {e}"
            status = 500
            out = error_bytes(500, msg, close=not keep)
        elapsed = (time.monotonic() - started) * 1000
        self.task = None
        if not self.closed:
            assert self.ct is not None  # set from connection_made until closed
            self.ct.write(out)
        # Logged once the answer is on its way: the client does not wait for the line.
        log.info(
            "%s %s -> %d (%.1f ms)%s", request.method, request.target, status, elapsed,
            f", {note}" if note else "",
        )  # fmt: skip
        if self.closed:
            return
        if not keep:
            self.close()
            return
        self.req.fire(Ev.ANSWERED)
        self.flow.resume_client(Pause.AHEAD)
        self.advance()


def _quiet(task: asyncio.Future[None]) -> None:
    """An early connect that failed: `forward` tries again and says why."""
    if not task.cancelled():
        task.exception()
