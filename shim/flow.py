"""Flow control between a client's socket and its upstream, each way.

Nothing is buffered without bound: when one side's socket has more than its high water
mark waiting to be written, reading from the other side pauses, and resumes once the
backlog drains below the low water mark (asyncio calls `pause_writing` and
`resume_writing` at those marks).  The client's side pauses for any of three reasons at
once (the Engine's socket is full, enough pipelined bytes are held, no upstream yet) and
resumes only when none is left.
"""

from __future__ import annotations

import asyncio

from shim.states import Pause

HIGH_WATER = 64 * 1024  # bytes waiting to be written that pause reading the other side
LOW_WATER = 16 * 1024  # and the backlog that resumes it


class FlowControl:
    """Pauses and resumes reading on a connection's two transports."""

    __slots__ = ("client", "paused", "reasons", "upstream", "upstream_paused")

    def __init__(self) -> None:
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.reasons = Pause(0)
        self.paused = False  # reading the client is paused (for any reason): a cheap test
        self.upstream_paused = False

    def attach_client(self, transport: asyncio.Transport) -> None:
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        self.client = transport

    def attach_upstream(self, transport: asyncio.Transport | None) -> None:
        """A new upstream connection (None: none): reading it starts unpaused."""
        if transport is not None:
            transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        self.upstream = transport
        self.upstream_paused = False
        self.resume_client(Pause.PEER)

    def pause_client(self, reason: Pause) -> None:
        if not self.paused and self.client is not None:
            self.client.pause_reading()
        self.reasons |= reason
        self.paused = True

    def resume_client(self, reason: Pause) -> None:
        if self.paused and self.reasons & reason:
            self.reasons &= ~reason
            if not self.reasons:
                self.paused = False
                if self.client is not None:
                    self.client.resume_reading()

    def pause_upstream(self) -> None:
        """The client's socket is full: stop reading the Engine."""
        if self.upstream is not None:
            self.upstream.pause_reading()
            self.upstream_paused = True

    def resume_upstream(self) -> None:
        if self.upstream is not None and self.upstream_paused:
            self.upstream.resume_reading()
        self.upstream_paused = False
