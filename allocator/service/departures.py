"""Leases end when their containers do, with nobody asking.

A container removed by ``--rm``, by its name or through another socket ends without
a request that names its lease, so for the shim's whole life this follows the
Engine's container ``destroy`` events and ends the lease of each container that
goes, proving it gone the way a removal does (its full id answers 404,
`LeaseBook.settle` with `Forget`).  A container adopted as a claim, or one whose
GPUs went back while it stopped, is settled by a reconcile instead.

The Engine does not replay what happened while the stream was down, so every
(re)connection is followed by one reconcile: the stream is opened first, then the
ledger made to agree, so nothing falls between the two.  A stream that fails is
opened again ever more slowly, back to quickly once one stays open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from allocator.core.leases.outcomes import Forget
from allocator.service.wiring import Allocator

log = logging.getLogger("gpu-alloc")
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0


class Departures:
    """Run by the shim's background work: `run` until ``stop`` is set, `wake` then."""

    def __init__(self, alloc: Allocator, clock: Callable[[], float] = time.monotonic) -> None:
        self.alloc = alloc
        self.clock = clock
        self.stop = threading.Event()
        self._stream: object = None

    def wake(self) -> None:
        """End the stream being followed, so `run` sees ``stop`` now, not at the next
        removal.  (A stream opened after this sees ``stop`` set as it opens.)"""
        _abort(self._stream)

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        engine = self.alloc.engine
        if engine is None:
            return
        backoff = BACKOFF_MIN
        while not self.stop.is_set():
            opened = self.clock()
            try:
                stream = self._stream = engine.destroyed()
                if self.stop.is_set():
                    _abort(stream)
                self._resync()
                for cid in stream:
                    if self.stop.is_set():
                        return
                    self.gone(cid)
            except Exception as e:  # the Engine went away: open the stream again later
                log.info("following container removals: %s; trying again", e)
            if self.clock() - opened > BACKOFF_MAX:
                backoff = BACKOFF_MIN
            self.stop.wait(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)

    def _resync(self) -> None:
        """One reconcile for whatever went while nobody listened; a failure (the GPU
        inventory unreadable, say) is logged and the removals still followed."""
        try:
            self.alloc.reconciler.reconcile()
        except Exception as e:
            log.warning("reconcile after (re)connecting to the Engine's events failed: %s", e)

    def gone(self, cid: str) -> None:
        """The Engine destroyed ``cid``: end what it held."""
        if not cid:
            return
        self.alloc.lookups.forget_creator(cid)
        state = self.alloc.ledger.read()
        if cid in state.claims or cid in state.expired:
            self.alloc.reconciler.reconcile()
        elif any(le.container == cid for le in state.leases.values()):
            self.alloc.book.settle(Forget(cid))


def _abort(stream: object) -> None:
    """An Engine stream's `abort` (a test's list has none)."""
    abort = getattr(stream, "abort", None)
    if abort is not None:
        abort()
