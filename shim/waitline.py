"""GPU creates waiting in line: one asyncio future per waiting client, served in order.

Theory of operation
-------------------
A create that asked to wait (``io.gpu-alloc.wait`` or ``policy.wait.default``) and
could not be granted yet is entered here and its handler awaits a future.  Every
wake-up serves the whole queue at once with `Lineup.serve_waiters` (one ledger
transaction, `core.rules.queue` order), and resolves the futures of the waiters it
granted.  Wake-ups come from:

- the allocator itself, whenever a lease ends in this process (its listeners):
  the shim's own releases and the reconciles it runs;
  these include the leases allocator/service/departures.py ends as the Engine's
  ``destroy`` events arrive (``--rm``, a removal by name or through another socket);
- the state file: while anyone waits it is polled every `POLL` seconds for a new
  (mtime, size, inode), which catches the plugin's releases (other processes) and
  ``gpu-alloc repair``;
- the reservations, polled with it: one made or cancelled, beginning or ending.

Nothing leaks: a waiter that leaves (timeout, client gone, handler cancelled) is
removed from the queue, and a grant that reaches a waiter already gone is
released at once.  A stopping shim answers every waiter with `Stopping`.  The
queue lives in memory only: a restarted shim starts with an empty one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from allocator.core.leases.leases import Lease, StateError
from allocator.core.machine.inventory import InventoryError
from allocator.core.rules import policy, queue
from allocator.host import metrics
from allocator.host.engine import EngineError
from allocator.service.placer import LeaseRequest
from allocator.service.views import queue as queue_view
from allocator.service.wiring import Allocator

log = logging.getLogger("gpu-alloc.shim")
POLL = 0.2  # seconds between state-file checks while anyone waits
_FAILURES = (StateError, EngineError, InventoryError, OSError)


class Stopping(Exception):
    """The shim is stopping: the waiter gets a 503 instead of hanging."""


class Gone(Exception):
    """The waiting client closed its connection."""


@dataclass
class _Entry:
    waiter: queue.Waiter
    future: asyncio.Future[tuple[Lease, str]]
    since: float  # wall clock, for status


class Waitline:
    def __init__(self, alloc: Allocator, poll: float = POLL) -> None:
        self.alloc = alloc
        self.poll = poll
        self._entries: dict[str, _Entry] = {}
        self._seq = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        alloc.recorder.listeners.append(self.wake)
        alloc.line.waiting = self.waiters

    # ---------------------------------------------------------------- waiting

    async def wait(
        self, req: LeaseRequest, seconds: float, gone: asyncio.Event | None = None
    ) -> tuple[Lease, str] | None:
        """The lease once granted; None when ``seconds`` ran out.

        Raises `Gone` when the client left and `Stopping` when the shim stops.
        """
        self._start()
        assert self._loop is not None
        seq = next(self._seq)
        gpus = len(req.ask.required) + req.ask.count
        rules = self.alloc.gather.rules
        waiter = queue.Waiter(
            f"w{seq}",
            req.owner.user,
            policy.priority_of(req.owner, rules),
            seq,
            gpus,
            req,
            time.time(),
        )
        future: asyncio.Future[tuple[Lease, str]] = self._loop.create_future()
        self._entries[waiter.id] = _Entry(waiter, future, time.time())
        metrics.queue_length(len(self._entries))
        started = time.monotonic()
        watch = asyncio.ensure_future(gone.wait()) if gone is not None else None
        handed = False
        self.wake()
        try:
            waits: list[asyncio.Future[Any]] = [future, *([watch] if watch else [])]
            await asyncio.wait(
                waits,
                timeout=seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if future.done():
                handed = True
                return future.result()  # raises Stopping
            if gone is not None and gone.is_set():
                raise Gone()
            return None
        finally:
            if watch is not None:
                watch.cancel()
            self._entries.pop(waiter.id, None)
            metrics.queue_length(len(self._entries))
            metrics.waited(time.monotonic() - started)
            if not future.done():
                future.cancel()
            elif not handed and not future.cancelled() and future.exception() is None:
                self._give_back(future.result()[0])

    def waiters(self) -> list[queue.Waiter]:
        """Who waits now, from any thread (`Lineup.kept`: what every lease leaves alone)."""
        return [e.waiter for e in list(self._entries.values()) if not e.future.done()]

    def wake(self) -> None:
        """Serve the queue soon; safe from any thread (the allocator's listeners)."""
        loop, kick = self._loop, self._kick
        if loop is None or kick is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(kick.set)

    def stop(self) -> None:
        """Answer every waiter with `Stopping`; called by the shim on its way down."""
        for entry in list(self._entries.values()):
            if not entry.future.done():
                entry.future.set_exception(Stopping("gpu-alloc shim is stopping"))
        if self._task is not None:
            self._task.cancel()

    def snapshot(self) -> list[dict[str, Any]]:
        """The queue in serving order, for ``gpu-alloc status`` (reads the ledger, no lock)."""
        entries = [(e.waiter, e.since) for e in list(self._entries.values())]
        if not entries:
            return []
        state, rules = self.alloc.lookups.ledger_state(), self.alloc.gather.rules
        return queue_view.rows(entries, state, rules, time.time(), self.alloc.line.usage())

    # ---------------------------------------------------------------- serving

    def _start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._kick = asyncio.Event()
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        assert self._kick is not None
        stamp = self._stamp()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll if self._entries else None):
                    await self._kick.wait()
            kicked = self._kick.is_set()
            self._kick.clear()
            now = self._stamp()
            if not self._entries or not (kicked or now != stamp):
                stamp = now
                continue
            stamp = now
            try:
                await self._serve()
            except _FAILURES as e:
                log.warning("queue not served this time: %s", e)
            except Exception:  # a bug must not stop the queue: the next wake-up tries again
                log.exception("queue not served this time")

    def _stamp(self) -> object:
        """What moves when a waiter may fit: the ledger, and the reservations' phases."""
        return self.alloc.lookups.ledger_stamp(), self.alloc.reservations.stamp()

    async def _serve(self) -> None:
        waiting = [e.waiter for e in self._entries.values() if not e.future.done()]
        if not waiting:
            return
        granted = await asyncio.to_thread(self.alloc.line.serve_waiters, waiting)
        for waiter, got in granted:
            entry = self._entries.get(waiter.id)
            if entry is None or entry.future.done():
                self._give_back(got[0])  # it left while the queue was served
            else:
                log.info("lease %s: granted to a waiting create of %s", got[0].id, waiter.owner)
                entry.future.set_result(got)

    def _give_back(self, lease: Lease) -> None:
        """Release a grant nobody will use; in a thread, since this may run in a finally."""
        assert self._loop is not None
        self._loop.run_in_executor(
            self.alloc.background.ledger_pool,
            self.alloc.book.release,
            lease.id,
            "its waiting client left",
        )
