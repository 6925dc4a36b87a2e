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
from typing import TYPE_CHECKING

from shim.flow import Pause
from shim.framing import Request, UpstreamError, encode_response, error_bytes
from shim.states import Ev

if TYPE_CHECKING:
    from shim.ports import Client

log = logging.getLogger(__name__)


class Interception:
    """A connection's intercepted request: its body as it is collected, then its handling."""

    __slots__ = ("conn", "gone", "pending", "size")

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        self.pending: tuple[str, str, list[tuple[str, str]], bool] | None = None
        self.size = 0  # body bytes so far
        self.gone: asyncio.Event | None = None  # the intercepted request's client left

    def start(self, method: str, target: str, keep: bool, end: int) -> None:
        """Buffer the body of the request whose head (buf[:end]) the parser just read."""
        conn = self.conn
        p = conn.parser
        cap = conn.proxy.max_body
        if p.framing.length is not None and p.framing.length > cap:
            conn.reply_error(413, f"request body too large for gpu-alloc (limit {cap} bytes)")
            return
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in p.headers]
        if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in headers):
            assert conn.ct is not None  # the client's bytes came on it
            conn.ct.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.pending = (method, target, headers, keep)
        p.parts = []
        buf = conn.buf
        pos = p.body(buf, end)
        self.size = pos - end
        conn.buf = buf[pos:]
        conn.req.fire(Ev.COLLECT)
        self.collected(0)

    def collected(self, more: int) -> None:
        """`more` body bytes came: hand the request to the interceptor once it is whole."""
        conn = self.conn
        p = conn.parser
        assert p.parts is not None and self.pending is not None
        self.size += more
        if self.size > conn.proxy.max_body:
            limit = conn.proxy.max_body
            conn.reply_error(413, f"request body too large for gpu-alloc (limit {limit} bytes)")
            return
        if not p.done:
            return
        method, target, headers, keep = self.pending
        body = b"".join(p.parts)
        self.pending = p.parts = None
        conn.req.fire(Ev.COLLECTED)
        self.gone = asyncio.Event()
        request = Request(method, target, headers, body, conn.peer, self.gone)
        conn.task = asyncio.create_task(self._intercept(request, keep))
        if conn.link.up is None and conn.link.connecting is None:
            # Connect to the Engine while the interceptor leases: `forward` finds the
            # connection made (or makes it, and reports why it cannot).
            early = asyncio.ensure_future(conn.link.ensure())
            early.add_done_callback(_quiet)

    async def _intercept(self, request: Request, keep: bool) -> None:
        conn = self.conn
        started = time.monotonic()
        note = ""
        head_req = request.method == "HEAD"  # as asked: the interceptor may rewrite it
        try:
            response = await conn.proxy.interceptor.handle(request, conn.link.forward)
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
        conn.task = None
        if not conn.closed:
            assert conn.ct is not None  # set from connection_made until closed
            conn.ct.write(out)
        # Logged once the answer is on its way: the client does not wait for the line.
        log.info(
            "%s %s -> %d (%.1f ms)%s", request.method, request.target, status, elapsed,
            f", {note}" if note else "",
        )  # fmt: skip
        if conn.closed:
            return
        if not keep:
            conn.close()
            return
        conn.req.fire(Ev.ANSWERED)
        conn.flow.resume_client(Pause.AHEAD)
        conn.advance()


def _quiet(task: asyncio.Future[None]) -> None:
    """An early connect that failed: `forward` tries again and says why."""
    if not task.cancelled():
        task.exception()
