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

import httptools

from shim.framing import (
    Request,
    UpstreamError,
    _Body,
    _encode_response,
    _error_bytes,
    _Framing,
    _Head,
)
from shim.upstream import (
    _P_AHEAD,
    _RQ_COLLECT,
    _RQ_HEAD,
    _RQ_INTERCEPT,
    ClientState,
)

log = logging.getLogger(__name__)


class InterceptSide(ClientState):
    """The interception half of `shim.splice._Client`."""

    def _start_collect(
        self,
        parser: httptools.HttpRequestParser | None,
        head: _Head,
        framing: _Framing,
        method: str,
        target: str,
        keep: bool,
        end: int,
    ) -> None:
        cap = self.proxy.max_body
        if framing.length is not None and framing.length > cap:
            self.reply_error(413, f"request body too large for gpu-alloc (limit {cap} bytes)")
            return
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in head.headers]
        if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in headers):
            assert self.ct is not None  # the client's bytes came on it
            self.ct.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.pending = (method, target, headers, keep, method == "HEAD")
        self.body = _Body(parser, head, framing, [])
        buf = self.buf
        pos = self.body.take(buf, end)
        self.size = pos - end
        self.buf = buf[pos:]
        self.rq = _RQ_COLLECT
        self._collected()

    def _collected(self) -> None:
        body = self.body
        assert body is not None and body.parts is not None and self.pending is not None
        if self.size > self.proxy.max_body:
            limit = self.proxy.max_body
            self.reply_error(413, f"request body too large for gpu-alloc (limit {limit} bytes)")
            return
        if not body.done:
            return
        method, target, headers, keep, head_req = self.pending
        self.body = self.pending = None
        self.rq = _RQ_INTERCEPT
        self.gone = asyncio.Event()
        request = Request(method, target, headers, b"".join(body.parts), self.peer, self.gone)
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
            out = _encode_response(response, head_only=head_req, close=not keep)
            status, note = response.status, response.note
        except Exception as e:
            if isinstance(e, UpstreamError):
                log.error("%s %s: Engine exchange failed: %s", request.method, request.target, e)
                msg = f"gpu-alloc shim: the Engine did not answer: {e}"
            else:
                log.exception("%s %s: interceptor failed", request.method, request.target)
                msg = f"gpu-alloc shim: internal error: {type(e).__name__}: {e}"
            status = 500
            out = _error_bytes(500, msg, close=not keep)
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
        self.rq = _RQ_HEAD
        self.resume_client(_P_AHEAD)
        self.advance()


def _quiet(task: asyncio.Future[None]) -> None:
    """An early connect that failed: `forward` tries again and says why."""
    if not task.cancelled():
        task.exception()
