"""The shim's HTTP/1.1 framing, sans I/O: parse heads, find where bodies end, encode.

Why it is shaped this way: the Go docker client and docker-py keep connections
alive, so every request head on a connection is read and offered to the
interceptor: the everyday bodiless GET and its fixed-length answer by the quick
path below (a few C-level scans), everything else by llhttp (via httptools).
Body boundaries come from the framing (Content-Length, or a small chunk scanner
that finds where a chunked body ends in the raw bytes, cross-checked by llhttp),
so pipelined requests split correctly and spliced bytes are never re-encoded.
Nothing here touches a socket: shim/splice.py feeds it bytes and acts on what it
returns.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

import httptools

from allocator.core import errors
from allocator.host.peers import Peer
from shim.headlimit import MAX_REQUEST_HEAD

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024  # the Engine's response heads; requests: shim/headlimit.py
MAX_BODY = 16 * 1024 * 1024  # cap for intercepted request bodies and forwarded responses
READ_AHEAD = 256 * 1024  # client bytes kept while a response streams (pipelining)
FORWARD_TIMEOUT = 120.0

_CRLF2 = b"\r\n\r\n"
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
# Hop-by-hop headers: `forward` rebuilds the request and owns the framing and the connection.
_HOP = frozenset(
    {
        "connection",
        "content-length",
        "expect",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_HIJACK_TYPES = (b"application/vnd.docker.raw-stream", b"application/vnd.docker.multiplexed-stream")
_NO_BODY_STATUS = frozenset({204, 304})


@dataclass
class Request:
    """A complete, buffered request (Transfer-Encoding already undone)."""

    method: str
    target: str  # raw request-target as received, e.g. "/v1.41/containers/create?name=x"
    headers: list[tuple[str, str]]
    body: bytes
    peer: Peer | None = None  # the client's credentials, where the socket gives them
    # Set when the client closes its side while the request is intercepted (a create
    # waiting for GPUs leaves the queue then), as Go's server cancels the request.
    gone: asyncio.Event | None = field(default=None, compare=False, repr=False)


@dataclass
class Response:
    """A complete, buffered response (Transfer-Encoding already undone).  ``note``: what
    the interceptor adds to the request's log line (the lease a create was granted);
    never sent."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    note: str = ""


Forward = Callable[[Request], Awaitable[Response]]


class Interceptor(Protocol):
    def wants(self, method: str, target: str) -> bool:
        """Cheap and synchronous: called on every request head."""
        ...

    async def handle(self, request: Request, forward: Forward) -> Response:
        """Answer `request`; `forward` sends a (rewritten) request to the Engine."""
        ...


class UpstreamError(Exception):
    """`forward` could not complete an exchange with the Engine.

    `maybe_delivered` is False only when the request certainly never reached the Engine
    (connecting failed); otherwise the Engine may have acted on it (the connection dropped or
    the timeout fired after the request was written), so the outcome is ambiguous.
    """

    def __init__(self, message: str, *, maybe_delivered: bool) -> None:
        super().__init__(message)
        self.maybe_delivered = maybe_delivered


class _BadMessage(Exception):
    """Malformed or oversized HTTP from a peer: the connection cannot continue."""


class _Closed(Exception):
    """A peer closed the connection in the middle of a message."""


# --- parsing -------------------------------------------------------------------------------


class _Head:
    """httptools callbacks for one message; no on_body, so bodies cost no Python calls."""

    __slots__ = ("complete", "headers", "reason", "url")

    def __init__(self) -> None:
        self.url = b""
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_message_complete(self) -> None:
        self.complete = True


class _Framing:
    """What a head says about its body and its connection."""

    __slots__ = ("chunked", "close", "length", "raw_type", "upgrade")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.length: int | None = None
        self.chunked = False
        self.close = False
        self.upgrade = False
        self.raw_type = False
        te = None
        for name, value in headers:
            n = name.lower()
            if n == b"content-length":
                self.length = int(value)  # llhttp accepted it: digits only, not repeated
            elif n == b"transfer-encoding":
                te = value.lower()
            elif n == b"connection":
                tokens = value.lower()
                self.close = self.close or b"close" in tokens
                self.upgrade = self.upgrade or b"upgrade" in tokens
            elif n == b"content-type":
                self.raw_type = value.lower().startswith(_HIJACK_TYPES)
        if te is not None:
            self.length = None
            # A request's coding must end in chunked (llhttp enforces it); a response whose
            # coding does not is read until close.
            self.chunked = te.rstrip().endswith(b"chunked")


class _Chunks:
    """Finds where a chunked body ends inside raw bytes, optionally collecting its data.

    The bytes themselves are forwarded untouched; llhttp checks the same bytes, and the two
    must agree on where the message ends (see _Body).
    """

    __slots__ = ("crlf", "done", "left", "line", "trailer")

    def __init__(self) -> None:
        self.left = 0  # data bytes still to come in the current chunk
        self.crlf = 0  # bytes of the CRLF after the chunk's data still to come
        self.line = b""  # partial size or trailer line
        self.trailer = False
        self.done = False

    def scan(self, buf: bytes, pos: int, parts: list[bytes] | None) -> int:
        """Consume body bytes from buf[pos:]; return where the body (or buf) ends."""
        n = len(buf)
        while pos < n and not self.done:
            if self.left:
                take = min(self.left, n - pos)
                if parts is not None:
                    parts.append(buf[pos : pos + take])
                self.left -= take
                pos += take
                continue
            if self.crlf:
                take = min(self.crlf, n - pos)
                self.crlf -= take
                pos += take
                continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                self.line += buf[pos:]
                if len(self.line) > 4096:
                    raise _BadMessage("chunk line too long")
                return n
            line = self.line + buf[pos:nl] if self.line else buf[pos:nl]
            self.line = b""
            pos = nl + 1
            if not line.endswith(b"\r"):
                raise _BadMessage("bare LF in chunked body")
            if self.trailer:
                self.done = line == b"\r"
                continue
            size = line[:-1].split(b";", 1)[0]
            if not _HEX.fullmatch(size):
                raise _BadMessage("bad chunk size")
            self.left = int(size, 16)
            if self.left:
                self.crlf = 2
            else:
                self.trailer = True
        return pos


class _Body:
    """Tracks one message body through successive buffers."""

    __slots__ = ("chunks", "head", "left", "parser", "parts")

    def __init__(
        self,
        parser: httptools.HttpRequestParser | httptools.HttpResponseParser | None,
        head: _Head,
        framing: _Framing,
        parts: list[bytes] | None = None,
    ) -> None:
        # parser is None when llhttp has stopped (an upgrade request): the framing still
        # follows Go's server, which reads such a request's body by its length.
        self.parser = parser
        self.head = head
        self.chunks = _Chunks() if framing.chunked else None
        self.left = framing.length or 0
        self.parts = parts

    @property
    def done(self) -> bool:
        return self.chunks.done if self.chunks is not None else self.left == 0

    def take(self, buf: bytes, pos: int) -> int:
        """Consume what belongs to this body from buf[pos:]; return the end offset."""
        if self.chunks is None:  # Content-Length: opaque bytes, nothing for llhttp to check
            end = pos + min(self.left, len(buf) - pos)
            self.left -= end - pos
            if self.parts is not None and end > pos:
                self.parts.append(buf[pos:end])
            return end
        end = self.chunks.scan(buf, pos, self.parts)
        if self.parser is not None:
            if end > pos:
                try:
                    self.parser.feed_data(memoryview(buf)[pos:end])
                except httptools.HttpParserUpgrade:
                    pass
                except httptools.HttpParserError as e:
                    raise _BadMessage(str(e)) from None
            if self.head.complete != self.chunks.done:
                raise _BadMessage("chunked framing disagrees with llhttp")
        return end


def _parse_request(buf: bytes, end: int) -> tuple[httptools.HttpRequestParser | None, _Head]:
    """Parse a request head; the parser is None when llhttp switched to upgrade mode."""
    head = _Head()
    parser = httptools.HttpRequestParser(head)
    try:
        parser.feed_data(memoryview(buf)[:end])
    except httptools.HttpParserUpgrade:
        return None, head
    except httptools.HttpParserError as e:
        raise _BadMessage(str(e)) from None
    return parser, head


def _parse_response(buf: bytes, end: int) -> tuple[httptools.HttpResponseParser | None, _Head]:
    head = _Head()
    parser = httptools.HttpResponseParser(head)
    try:
        parser.feed_data(memoryview(buf)[:end])
    except httptools.HttpParserUpgrade:
        return None, head
    except httptools.HttpParserError as e:
        raise _BadMessage(f"bad response from the Engine: {e}") from None
    return parser, head


# --- the quick path ------------------------------------------------------------------------
#
# Most calls on a connection are a GET head with no body and a fixed-length answer.  Parsing
# them with llhttp (a parser object, a Python callback per header) would be most of the shim's
# own cost per call.  These two recognise exactly that shape with a few C-level scans and say
# None for anything else, which then takes the full parse: they never decide a boundary the
# full parse would draw elsewhere (tests/unit/test_shim_quick.py holds them to that).

# A request head as the Docker clients send one: the request line as Go's server splits it
# (method, one space, origin-form target, one space, HTTP/1.1), then well-formed header
# lines (a token, a colon, a value of visible characters, spaces and tabs), none of them
# one that could give the request a body, close the connection, upgrade it or wait for a
# 100-continue.  Header names are matched ignoring ASCII case, as Go folds them.
_SPECIAL = rb"(?!(?i:content-length|transfer-encoding|connection|expect|upgrade):)"
_QUICK_HEAD = re.compile(
    rb"([A-Z]{1,16}) (/[!-~]*) HTTP/1\.1\r\n"
    rb"(?:" + _SPECIAL + rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*\r\n"
)
# A response head from the Engine with a status that has a body, no Connection header and
# exactly one framing header: Content-Length (group 2) or a plain `chunked` coding (group 3).
_PLAIN = rb"(?:(?!(?i:content-length|transfer-encoding|connection):)[^\r\n:]+:[^\r\n]*\r\n)*"
_QUICK_RESPONSE = re.compile(
    rb"HTTP/1\.1 (?!204|304)([2-5][0-9][0-9]) [^\r\n]*\r\n"
    + _PLAIN
    + rb"(?:(?i:content-length):[ \t]*([0-9]{1,15})|(?i:transfer-encoding):[ \t]*(chunked))"
    + rb"[ \t]*\r\n"
    + _PLAIN
    + rb"\r\n"
)
_QUICK_CHUNK = re.compile(rb"([0-9a-fA-F]{1,8})\r\n")


def quick_request(data: bytes) -> tuple[str, str] | None:
    """(method, target) when `data` is exactly one bodiless keep-alive HTTP/1.1 request head
    within dockerd's limit."""
    if len(data) > MAX_REQUEST_HEAD:
        return None
    head = _QUICK_HEAD.fullmatch(data)
    if head is None:
        return None
    return head[1].decode("latin-1"), head[2].decode("latin-1")


def quick_response(data: bytes) -> bool:
    """Whether `data` is exactly one whole keep-alive response, framed by its Content-Length
    or by plain chunks (no extensions, no trailers)."""
    head = _QUICK_RESPONSE.match(data)
    if head is None:
        return False
    if head[2] is not None:
        return head.end() + int(head[2]) == len(data)
    return _whole_chunks(data, head.end())


def _whole_chunks(data: bytes, pos: int) -> bool:
    """Whether data[pos:] is a chunked body that ends exactly where data does."""
    while True:
        line = _QUICK_CHUNK.match(data, pos)
        if line is None:
            return False
        size = int(line[1], 16)
        pos = line.end() + size
        if size == 0:
            return pos + 2 == len(data) and data.endswith(b"\r\n")
        if data[pos : pos + 2] != b"\r\n":
            return False
        pos += 2


def _error_bytes(status: int, message: str, *, close: bool) -> bytes:
    """A response in the Engine's error format (`errors.body`), framed for the wire."""
    body = errors.body(message)
    head = (
        f"HTTP/1.1 {status} {errors.reason(status)}\r\n"
        f"Content-Type: {errors.CONTENT_TYPE}\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if close:
        head += "Connection: close\r\n"
    return head.encode("latin-1") + b"\r\n" + body


# One regular-expression scan a field: a generator over the characters costs more than the
# rest of a create's encoding.
_NOT_TOKEN = re.compile("[ \r\n\0]").search
_NOT_VALUE = re.compile("[\r\n\0]").search


def _check_token(text: str, what: str) -> str:
    if not text or _NOT_TOKEN(text):
        raise ValueError(f"invalid {what}: {text!r}")
    return text


def _check_value(text: str, what: str) -> str:
    if _NOT_VALUE(text):
        raise ValueError(f"invalid {what}: {text!r}")
    return text


def _encode_request(req: Request) -> bytes:
    """The wire form of a rewritten request: fresh Content-Length, no hop-by-hop headers."""
    lines = [f"{_check_token(req.method, 'method')} {_check_token(req.target, 'target')} HTTP/1.1"]
    for name, value in req.headers:
        if name.lower() not in _HOP:
            lines.append(f"{_check_token(name, 'header name')}: {_check_value(value, 'header')}")
    if req.body or req.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(req.body)}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1") + req.body


def _encode_response(resp: Response, *, head_only: bool, close: bool) -> bytes:
    reason = _check_value(resp.reason or HTTPStatus(resp.status).phrase, "reason")
    lines = [f"HTTP/1.1 {resp.status} {reason}"]
    for name, value in resp.headers:
        if name.lower() not in _HOP:
            lines.append(f"{_check_token(name, 'header name')}: {_check_value(value, 'header')}")
    no_body = resp.status in _NO_BODY_STATUS or resp.status < 200
    if not no_body:
        lines.append(f"Content-Length: {len(resp.body)}")
    if close:
        lines.append("Connection: close")
    lines.append("\r\n")
    head = "\r\n".join(lines).encode("latin-1")
    return head if head_only or no_body else head + resp.body


def _keep_alive(head: bytes, framing: _Framing) -> bool:
    """Whether a response (head bytes start with the status line) leaves the connection open."""
    return not framing.close and head.startswith(b"HTTP/1.1")
