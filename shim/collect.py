"""What a shim connection reads whole, sans I/O: the interceptor's requests, and
`forward`'s answers.

Only the interceptor's own exchanges are read this way (a create's body is rewritten, and
its 201 carries the id its lease is bound to); every other message streams through the
connection unchanged (shim/connection.py).  A request's body is bounded by the server's
``max_body``, an answer by `framing.MAX_BODY`.
"""

from __future__ import annotations

from shim.framing import MAX_BODY, NO_BODY_STATUS, BadMessage, Closed, Response
from shim.headlimit import response_head_end
from shim.parser import Parser


class TooLarge(Exception):
    """An intercepted request's body is over the cap: answered 413."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"request body too large for gpu-alloc (limit {cap} bytes)")


class Intercepted:
    """A request the interceptor wants, read whole (Transfer-Encoding undone) before it
    is handed over."""

    __slots__ = ("body", "cap", "headers", "keep", "method", "size", "target")

    def __init__(self, p: Parser, method: str, target: str, cap: int) -> None:
        """From the head `p` just read; TooLarge when its length is over `cap`."""
        if p.framing.length is not None and p.framing.length > cap:
            raise TooLarge(cap)
        self.method = method
        self.target = target
        self.cap = cap
        self.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in p.headers]
        self.keep = p.keep_alive  # the client keeps the connection alive after the answer
        self.body = b""
        self.size = 0
        p.parts = []

    @property
    def expects_continue(self) -> bool:
        return any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in self.headers)

    def feed(self, p: Parser, buf: bytes, pos: int) -> int:
        """Take the body's bytes from buf[pos:]; return where they stop.  Once `p.done`
        the body is whole; TooLarge as soon as it is over the cap."""
        end = p.body(buf, pos)
        self.size += end - pos
        if self.size > self.cap:
            raise TooLarge(self.cap)
        if p.done:
            assert p.parts is not None
            self.body = b"".join(p.parts)
            p.parts = None
        return end


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

    def take(self, p: Parser, buf: bytes, eof: bool) -> tuple[Response | Exception | None, bytes]:
        """`feed`, settled once: the answer, or why there is none (None: not yet, or
        settled before), and the bytes left over."""
        if self.done:
            return None, buf
        try:
            response, buf = self.feed(p, buf, eof)
        except (Closed, BadMessage) as e:
            self.done = True
            return e, buf
        self.done = response is not None
        return response, buf

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
