"""What a shim connection sees of its server: a narrow interface, not the server.

shim/splice.py's protocol takes its settings through `Settings`, so it never imports
shim/server.py, whose `Proxy` implements it: the server depends on the protocol, and
nothing runs back.
"""

from __future__ import annotations

from typing import Any, Protocol

from shim.framing import Interceptor


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
