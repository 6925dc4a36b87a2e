"""The shim's HTTP/1.1 messages, sans I/O: what a head says about its body, and encoding.

The Go docker client and docker-py keep connections alive, so every request head on a
connection is read and offered to the interceptor.  llhttp reads them (shim/parser.py,
the one parser); this module holds what the transport's parts share: the buffered
`Request` and `Response` an interceptor sees, what a parsed head says about its framing
(`Framing`), and the wire form of rewritten requests, answers and errors.  Nothing here
touches a socket.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol

from allocator.core.api import errors
from allocator.host.peers import Peer

MAX_HEAD = 64 * 1024  # the Engine's response heads; requests: shim/headlimit.py
MAX_BODY = 16 * 1024 * 1024  # cap for intercepted request bodies and forwarded responses
READ_AHEAD = 256 * 1024  # client bytes kept while a response streams (pipelining)
FORWARD_TIMEOUT = 120.0

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
_UPGRADE = frozenset({"connection", "upgrade"})
HIJACK_TYPES = (b"application/vnd.docker.raw-stream", b"application/vnd.docker.multiplexed-stream")
NO_BODY_STATUS = frozenset({204, 304})


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


@dataclass(frozen=True)
class PassOn:
    """The interceptor's answer that is no answer: ``request`` (rewritten) goes upstream,
    and the Engine's answer streams back as a spliced request's would, a hijack included
    (an attach, an exec's start)."""

    request: Request


Forward = Callable[[Request], Awaitable[Response]]


class Interceptor(Protocol):
    def wants(self, method: str, target: str) -> bool:
        """Cheap and synchronous: called on every request head."""
        ...

    async def handle(self, request: Request, forward: Forward) -> Response | PassOn:
        """Answer `request`, or pass it on; `forward` sends a (rewritten) request to the
        Engine and reads its answer whole."""
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


class BadMessage(Exception):
    """Malformed or oversized HTTP from a peer: the connection cannot continue."""


class Closed(Exception):
    """A peer closed the connection in the middle of a message."""


class Framing:
    """What a head llhttp accepted says about its body, taken header by header as llhttp
    reads them (shim/parser.py)."""

    __slots__ = ("chunked", "coded", "length", "raw_type")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A new head: no header taken yet."""
        self.length: int | None = None
        self.chunked = False
        self.coded = False  # a Transfer-Encoding came: any Content-Length does not count
        self.raw_type = False

    def add(self, name: bytes, value: bytes) -> None:
        """Take one header; those that do not frame the body change nothing."""
        n = name.lower()
        if n == b"content-length":
            if not self.coded:
                self.length = int(value)  # llhttp accepted it: digits only, not repeated
        elif n == b"transfer-encoding":
            # A request's coding must end in chunked (llhttp enforces it); a response whose
            # coding does not is read until close.
            self.coded = True
            self.length = None
            self.chunked = value.lower().rstrip().endswith(b"chunked")
        elif n == b"content-type":
            self.raw_type = value.lower().startswith(HIJACK_TYPES)


def error_bytes(status: int, message: str, *, close: bool) -> bytes:
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


def encode_request(req: Request, *, upgrade: bool = False) -> bytes:
    """The wire form of a rewritten request: fresh Content-Length, no hop-by-hop headers
    (but for ``upgrade``: the client's Connection and Upgrade, on a request passed on to
    be hijacked as it asked)."""
    drop = _HOP - _UPGRADE if upgrade else _HOP
    lines = [f"{_check_token(req.method, 'method')} {_check_token(req.target, 'target')} HTTP/1.1"]
    for name, value in req.headers:
        if name.lower() not in drop:
            lines.append(f"{_check_token(name, 'header name')}: {_check_value(value, 'header')}")
    if req.body or req.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(req.body)}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1") + req.body


def encode_response(resp: Response, *, head_only: bool, close: bool) -> bytes:
    reason = _check_value(resp.reason or HTTPStatus(resp.status).phrase, "reason")
    lines = [f"HTTP/1.1 {resp.status} {reason}"]
    for name, value in resp.headers:
        if name.lower() not in _HOP:
            lines.append(f"{_check_token(name, 'header name')}: {_check_value(value, 'header')}")
    no_body = resp.status in NO_BODY_STATUS or resp.status < 200
    if not no_body:
        lines.append(f"Content-Length: {len(resp.body)}")
    if close:
        lines.append("Connection: close")
    lines.append("\r\n")
    head = "\r\n".join(lines).encode("latin-1")
    return head if head_only or no_body else head + resp.body
