"""What the parts of a shim connection see of it: narrow interfaces, not the connection.

`Relay` (shim/response.py) and `Interception` (shim/intercept.py) work on a client
connection through `Client`, and `Link` (shim/upstream.py) is handed plain values and
callables, so none of them imports shim/splice.py, whose `Connection` composes them: the
parts depend on these descriptions, the composition on the parts, and nothing runs back.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from allocator.host.peers import Peer
from shim.flow import FlowControl
from shim.framing import Interceptor
from shim.parser import Parser
from shim.states import Conversation, Exchange, Machine, Req
from shim.upstream import Link


class Settings(Protocol):
    """What every connection of one server shares (shim/server.py's `Proxy`)."""

    @property
    def upstream_path(self) -> str: ...
    @property
    def interceptor(self) -> Interceptor: ...
    @property
    def forward_timeout(self) -> float: ...
    @property
    def max_body(self) -> int: ...
    @property
    def conns(self) -> set[Any]:  # the open connections (a set of the server's own type)
        ...


class Client(Protocol):
    """The client's side of a connection, as the Engine's answers and the interceptor's
    requests act on it: its transport, unforwarded bytes, parser and state, the way to
    the Engine, and the three ways the connection goes on or ends."""

    proxy: Settings
    ct: asyncio.Transport | None
    peer: Peer | None
    buf: bytes
    parser: Parser
    talk: Conversation
    req: Machine[Req]  # talk.req
    flow: FlowControl
    link: Link
    exchange: Exchange | None
    client_eof: bool
    task: asyncio.Task[None] | None

    @property
    def closed(self) -> bool: ...

    def advance(self) -> None:
        """Make progress on the client's held bytes."""

    def close(self, *, abort: bool = False) -> None:
        """End the connection, both sides."""

    def reply_error(self, status: int, message: str) -> None:
        """Answer in the Engine's error format and end the connection."""
