"""The shim's one HTTP parser: llhttp (via httptools), one per direction of a connection.

llhttp alone decides what a message is: its head, where its body ends, and whether the
bytes are HTTP at all.  It refuses what Go's server refuses (two Content-Lengths, a signed
one) and what Go would read one way and another hop another (Content-Length beside
Transfer-Encoding, a bad chunk size, a bare LF): the shim answers 400 and never forwards
a message whose end is in doubt.  The connection (shim/connection.py) still
forwards the client's and the Engine's bytes unchanged, so it must know at which byte a
message ends; llhttp says that only through its callbacks, so each feed stops where a
message can end: a head at its blank line (`headlimit.request_head_end`, which also draws
dockerd's size limit), a Content-Length body after its length, a chunked body after each
CRLF CRLF (its last chunk and trailers end with one).  A message llhttp ends anywhere else
is refused.  The parser lives as long as its connection, so a keep-alive request costs
no new parser object.
"""

from __future__ import annotations

import httptools

from shim.framing import BadMessage, Framing

_CRLF2 = b"\r\n\r\n"
# The lengths of the names `Framing` reads (Content-Type, Content-Length,
# Transfer-Encoding): a cheap test that passes most other headers by.
_FRAMING_NAMES = frozenset({12, 14, 17})


class Parser:
    """llhttp over one byte stream (requests from a client, or responses from the Engine),
    message after message: `head` feeds a head, `body` feeds the body's bytes."""

    __slots__ = (
        "begun",
        "complete",
        "framing",
        "headers",
        "headers_done",
        "keep_alive",
        "left",
        "llhttp",
        "method",
        "parts",
        "reason",
        "response",
        "status",
        "tail",
        "upgraded",
        "url",
    )

    def __init__(self, *, response: bool = False) -> None:
        self.response = response
        self.llhttp: httptools.HttpRequestParser | httptools.HttpResponseParser = (
            httptools.HttpResponseParser(self) if response else httptools.HttpRequestParser(self)
        )
        self.begun = 0  # messages llhttp has begun since the last head was fed
        self.complete = False
        self.headers_done = False
        self.upgraded = False  # llhttp stopped after an upgrade: what follows is not HTTP
        self.url = b""
        self.reason = b""
        self.method = b""
        self.status = 0
        self.keep_alive = True
        self.headers: list[tuple[bytes, bytes]] = []
        self.framing = Framing()
        self.parts: list[bytes] | None = None  # the body's data, where it is kept
        self.left = 0  # Content-Length bytes still to come
        self.tail = b""  # the last bytes fed of a chunked body: a CRLF CRLF may straddle feeds

    # -- llhttp's callbacks

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        if len(name) in _FRAMING_NAMES:
            self.framing.add(name, value)

    def on_headers_complete(self) -> None:
        self.headers_done = True
        llhttp = self.llhttp
        if self.response:
            self.status = llhttp.get_status_code()  # type: ignore[union-attr]
        else:
            self.method = llhttp.get_method()  # type: ignore[union-attr]
        self.keep_alive = llhttp.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        if self.parts is not None:
            self.parts.append(data)

    def on_message_complete(self) -> None:
        self.complete = True

    @property
    def done(self) -> bool:
        """Whether the current message has ended (an upgrade request's body: by its length)."""
        return self.complete and (not self.upgraded or self.left == 0)

    # -- feeding

    def head(self, buf: bytes, end: int) -> bool:
        """Feed the head buf[:end] (it ends at its blank line); False when it held only the
        empty lines llhttp skips before a message.  Afterwards: the head's fields, and
        `complete` when the message has no body."""
        self.begun = 0
        self.complete = self.headers_done = self.upgraded = False
        self.url = self.reason = b""
        self.headers = []
        self.framing.reset()
        self.parts = None
        self.tail = b""
        self._feed(buf if end == len(buf) else memoryview(buf)[:end])
        if not self.begun:
            return False
        if not self.headers_done:
            raise BadMessage("the head did not end where llhttp ended it")
        self.left = self.framing.length or 0
        if self.upgraded and self.framing.chunked:
            # llhttp stops at an upgrading head; Go's server reads only a length-framed body
            raise BadMessage("an upgrade request with a chunked body")
        return True

    def body(self, buf: bytes, pos: int) -> int:
        """Feed what belongs to the current body from buf[pos:]; return where it stops."""
        n = len(buf)
        if self.complete and not self.upgraded:
            return pos
        if self.upgraded:  # an upgrade request's body, by its length: llhttp has stopped
            end = pos + min(self.left, n - pos)
            self.left -= end - pos
            if self.parts is not None and end > pos:
                self.parts.append(buf[pos:end])
            return end
        if not self.framing.chunked:  # a body the Engine ends by closing is not fed
            end = pos + min(self.left, n - pos)
            self.left -= end - pos
            if end > pos:
                self._feed(buf if pos == 0 and end == n else memoryview(buf)[pos:end])
            return end
        while pos < n and not self.complete:
            stop = self._chunk_stop(buf, pos)
            self._feed(buf if pos == 0 and stop == n else memoryview(buf)[pos:stop])
            self.tail = (self.tail + buf[max(pos, stop - 3) : stop])[-3:]
            pos = stop
        return pos

    def skip_body(self) -> None:
        """The message has no body whatever its head says (the answer to a HEAD request):
        a fresh llhttp takes the next message.  llhttp read a head with neither length nor
        chunking as a body the Engine ends by closing, so not kept alive; without a body it
        is kept as Go's client keeps it: by the version and the Connection header alone."""
        self.keep_alive = _keeps_alive(self.llhttp.get_http_version(), self.headers)
        self.llhttp = (
            httptools.HttpResponseParser(self)
            if self.response
            else httptools.HttpRequestParser(self)
        )
        self.complete = True

    def _chunk_stop(self, buf: bytes, pos: int) -> int:
        """Just past the next CRLF CRLF at or after `pos` (counting the bytes fed before),
        or the end of `buf`: a chunked message can only end there."""
        if self.tail:
            joined = (self.tail + buf[pos : pos + 3]).find(_CRLF2)
            if joined >= 0:
                return pos + joined + 4 - len(self.tail)
        at = buf.find(_CRLF2, pos)
        return len(buf) if at < 0 else at + 4

    def _feed(self, data: bytes | memoryview) -> None:
        begun = self.begun
        try:
            self.llhttp.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgraded = True  # at the end of a head: what follows is the caller's
        except httptools.HttpParserError as e:
            what = f"bad response from the Engine: {e}" if self.response else str(e)
            raise BadMessage(what) from None
        if self.complete and self.begun > max(begun, 1):
            raise BadMessage("the message did not end where llhttp ended it")


def _keeps_alive(version: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a message of HTTP ``version`` with ``headers`` leaves the connection open,
    its body aside: HTTP/1.1 unless a Connection header says close, HTTP/1.0 only where
    one says keep-alive (llhttp's rule, less its test for a body ended by closing)."""
    said = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    if version == "1.0":
        return b"keep-alive" in said
    return b"close" not in said
