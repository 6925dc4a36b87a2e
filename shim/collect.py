"""`forward`'s answer, buffered whole, sans I/O: the Engine's bytes in, a `Response` out.

Only the interceptor's own exchanges are answered this way (a create's 201 carries the id
its lease is bound to); every other answer streams through the connection unchanged
(shim/connection.py).  What is buffered is bounded by `framing.MAX_BODY`.
"""

from __future__ import annotations

from shim.framing import MAX_BODY, NO_BODY_STATUS, BadMessage, Closed, Response
from shim.headlimit import response_head_end
from shim.parser import Parser


class Collector:
    """One answer being buffered for `forward`."""

    __slots__ = (
        "done", "head_req", "headed", "headers", "keep", "parts", "reason", "size", "status",
        "until_close",
    )  # fmt: skip

    def __init__(self, head_req: bool) -> None:
        self.head_req = head_req  # the request was HEAD: its answer has no body
        self.done = False  # settled: later bytes are not its
        self.headed = False  # its final head has come
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.keep = True
        self.until_close = False  # its body ends when the Engine closes the connection
        self.parts: list[bytes] = []
        self.size = 0

    def feed(self, p: Parser, buf: bytes, eof: bool) -> tuple[Response | None, bytes]:
        """Take the Engine's bytes (`eof`: it closed the connection after them): the answer
        once whole (else None) and the bytes left over.  Closed or BadMessage when it
        cannot be whole."""
        while not self.headed:
            end = response_head_end(buf)
            if not end:
                if eof:
                    raise Closed("the Engine closed the connection before answering")
                return None, buf
            if p.head(buf, end) and (p.upgraded or p.status >= 200):
                self._headed(p)  # else an interim answer (100 Continue): skipped
            buf = buf[end:]
        if self.until_close:
            self.parts.append(buf)
            self.size += len(buf)
            buf = b""
            if self.size > MAX_BODY:
                raise BadMessage("response too large")
            if not eof:
                return None, buf
        else:
            if buf and not p.done:
                pos = p.body(buf, 0)
                self.size += pos
                buf = buf[pos:]
            if self.size > MAX_BODY:
                raise BadMessage("response too large")
            if not p.done:
                if eof:
                    raise Closed("the Engine closed the connection inside a response")
                return None, buf
        return Response(self.status, self.reason, self.headers, b"".join(self.parts)), buf

    def _headed(self, p: Parser) -> None:
        """The final head has been fed: take what it says."""
        if p.upgraded:
            raise BadMessage("the Engine switched protocols on a forwarded request")
        self.headed = True
        self.status, self.keep = p.status, p.keep_alive
        self.reason = p.reason.decode("latin-1")
        self.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in p.headers]
        framing = p.framing
        if self.head_req:
            p.skip_body()
        elif self.status not in NO_BODY_STATUS:
            if framing.chunked or framing.length is not None:
                if (framing.length or 0) > MAX_BODY:
                    raise BadMessage("response too large")
                p.parts = self.parts
            else:
                self.until_close, self.keep = True, False
