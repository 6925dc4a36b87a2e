"""Where a message head ends, and the most of it the shim reads: heads are found only here.

Requests get dockerd's own limit.  dockerd serves its API with Go's net/http defaults: a
head (request line through the blank line) may take http.DefaultMaxHeaderBytes (1 << 20)
plus the 4096 bytes of bufio slack net/http allows, and a longer one gets 431.  The shim
draws the same line on the head's length, so what passes does not depend on how the bytes
were split into reads.  The Engine's answers get framing.MAX_HEAD, a bound on what the
shim buffers.
"""

from __future__ import annotations

from shim.framing import MAX_HEAD, BadMessage

MAX_REQUEST_HEAD = (1 << 20) + 4096

_CRLF2 = b"\r\n\r\n"


class HeadTooLarge(Exception):
    """The request head is longer than dockerd accepts: answered 431, the connection ends."""

    def __init__(self) -> None:
        super().__init__(
            f"request header section over {MAX_REQUEST_HEAD} bytes, the Engine's limit "
            "(Go's MaxHeaderBytes and its slack): send large values in the request body"
        )


def request_head_end(buf: bytes) -> int:
    """The offset just past the head at the start of `buf`; 0 while it is incomplete."""
    end = buf.find(_CRLF2)
    if end < 0:
        if len(buf) >= MAX_REQUEST_HEAD:  # the head can only end past the limit
            raise HeadTooLarge
        return 0
    if end + 4 > MAX_REQUEST_HEAD:
        raise HeadTooLarge
    return end + 4


def response_head_end(buf: bytes) -> int:
    """The offset just past the Engine's answer head at the start of `buf`; 0 while it is
    incomplete; BadMessage once more than MAX_HEAD bytes hold no end."""
    end = buf.find(_CRLF2)
    if end < 0:
        if len(buf) > MAX_HEAD:
            raise BadMessage("response header section too large")
        return 0
    return end + 4
