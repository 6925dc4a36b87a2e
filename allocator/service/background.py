"""The one owner of background work: every long-lived thread, short task and thread
pool of the service, started, stopped and watched in one place.

A part says what runs (a loop, a step every few seconds, a task); the owner runs it on
a thread named ``gpu-alloc-<name>``, records each failure that escapes it (the count,
the last one and when), runs a worker again after a failure (a thread that died would
stop its job for the rest of the process's life), and stops everything at once:
`stop` sets the one stop event, wakes each worker blocked on something else (an
event stream, a socket) with its ``wake``, shuts the pools down (taking no more work,
finishing what is queued: nothing lost) and waits for every thread up to a deadline,
and names those still alive.

`ledger_pool` is the pool for blocking work on the ledger: the shim makes it its event
loop's default executor, so its judging, settling, line and admin views run there; a
GPU create's lease, which the create waits on before dockerd sees it, has a hand-off of
its own (`handoff`: one thread wake each way, allocator/service/handoff.py), and so do
the plugin's decisions that wait (plugin/worker.py).  Each of
these may wait up to the ledger's lock timeout (5 s) on the lock or an fsync, not on a
CPU: each is sized (`LEDGER_THREADS`) so that a burst of creates queued on the lock
leaves the pool's threads to the calls that take no lock (status, a judgement on facts
at hand), and bounded so that a flood makes no more threads than that.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from allocator.service.handoff import Handoff

log = logging.getLogger("gpu-alloc")
PREFIX = "gpu-alloc-"  # every thread the owner starts is named so
LEDGER_THREADS = 16
RESTART_AFTER = 1.0  # seconds before a worker that failed runs again
STOP_DEADLINE = 5.0


@dataclass(frozen=True)
class Health:
    """One worker or pool, as `gpu-alloc doctor`, status or metrics would show it."""

    name: str
    alive: bool
    errors: int = 0
    last_error: str = ""
    last_error_at: float | None = None


class _Worker:
    def __init__(self, name: str, run: Callable[[threading.Event], Any], wake: Any) -> None:
        self.name, self.run, self.wake = name, run, wake
        self.thread: threading.Thread | None = None
        self.errors = 0
        self.last_error = ""
        self.last_error_at: float | None = None

    def failed(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error, self.last_error_at = f"{type(e).__name__}: {e}", time.time()


class Background:
    def __init__(self, ledger_threads: int = LEDGER_THREADS) -> None:
        self.stopping = threading.Event()
        self.ledger_threads = ledger_threads
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._tasks: set[threading.Thread] = set()
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._handoffs: dict[str, Handoff] = {}
        self._started = False
        self._ids = itertools.count()

    # -- what runs -----------------------------------------------------------------

    def add(
        self,
        name: str,
        run: Callable[[threading.Event], Any],
        wake: Callable[[], Any] | None = None,
    ) -> None:
        """A long-lived worker: ``run(stop)`` until ``stop`` is set (a return ends it; an
        exception is recorded and it runs again).  ``wake`` unblocks it at `stop`.
        Started at once when the owner is started, else by `start`."""
        worker = _Worker(name, run, wake)
        with self._lock:
            if name in self._workers:
                raise ValueError(f"background worker {name!r} is added twice")
            self._workers[name] = worker
            if self._started:
                self._launch(worker)

    def every(
        self,
        name: str,
        period: float | Callable[[], float],
        step: Callable[[], float | None],
        first: float | None = None,
    ) -> None:
        """``step()`` every ``period`` seconds (a number, or a function asked each time),
        or as many as it returns; the first after ``first`` (default: one period).  A
        failed step is recorded and logged; the next comes a period later."""
        seconds = period if callable(period) else lambda: period

        def loop(stop: threading.Event) -> None:
            wait = seconds() if first is None else first
            while not stop.wait(wait):
                wait = seconds()
                try:
                    got = step()
                except Exception as e:
                    self._workers[name].failed(e)
                    log.warning("%s failed", name, exc_info=True)
                else:
                    wait = wait if got is None else got

        self.add(name, loop)

    def once(self, name: str, task: Callable[..., Any], *args: Any) -> None:
        """A short task on a thread of its own (a container's stop, say), waited for at
        `stop`; not started once the owner is stopping."""
        if self.stopping.is_set():
            log.info("%s not started: gpu-alloc is stopping", name)
            return

        def run() -> None:
            try:
                task(*args)
            except Exception:
                log.exception("%s failed", name)
            finally:
                with self._lock:
                    self._tasks.discard(thread)

        thread = threading.Thread(target=run, name=f"{PREFIX}{name}", daemon=True)
        with self._lock:
            self._tasks.add(thread)
        thread.start()

    def pool(self, name: str, threads: int) -> ThreadPoolExecutor:
        """A bounded pool of its own, shut down at `stop`; one per name."""
        with self._lock:
            found = self._pools.get(name)
            if found is None:
                found = self._pools[name] = ThreadPoolExecutor(threads, f"{PREFIX}{name}")
            return found

    def handoff(self, name: str, threads: int) -> Handoff:
        """An event loop's hand-off to threads of its own (allocator/service/handoff.py:
        one wake each way), for the work a request waits on; what none has begun is
        cancelled at `stop`.  One per name."""
        with self._lock:
            found = self._handoffs.get(name)
            if found is None:
                found = self._handoffs[name] = Handoff(threads, f"{PREFIX}{name}")
            return found

    @property
    def ledger_pool(self) -> ThreadPoolExecutor:
        """The pool for blocking ledger work (the module docstring)."""
        return self.pool("ledger", self.ledger_threads)

    # -- start, stop, health -------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self._started = True
            for worker in self._workers.values():
                if worker.thread is None:
                    self._launch(worker)

    def _launch(self, worker: _Worker) -> None:
        def run() -> None:
            while not self.stopping.is_set():
                try:
                    worker.run(self.stopping)
                    return
                except Exception as e:
                    worker.failed(e)
                    log.exception("%s stopped on an error; it runs again", worker.name)
                    self.stopping.wait(RESTART_AFTER)

        worker.thread = threading.Thread(target=run, name=PREFIX + worker.name, daemon=True)
        worker.thread.start()

    def stop(self, deadline: float = STOP_DEADLINE) -> list[str]:
        """Stop everything, waiting up to ``deadline`` seconds in all; the names of the
        threads still alive then (each logged)."""
        self.stopping.set()
        with self._lock:
            workers = list(self._workers.values())
            pools = list(self._pools.items())
            handoffs = list(self._handoffs.values())
        for worker in workers:
            if worker.wake is not None and worker.thread is not None:
                try:
                    worker.wake()
                except Exception:
                    log.warning("%s not woken to stop", worker.name, exc_info=True)
        for _, pool in pools:  # what is queued still runs: a grant's fsync, a settle
            pool.shutdown(wait=False)
        for handoff in handoffs:  # what no thread has begun is never begun: no lease taken
            handoff.stop()
        ends = time.monotonic() + deadline
        for thread in self._threads():
            thread.join(max(0.0, ends - time.monotonic()))
        left = sorted(t.name for t in self._threads() if t.is_alive())
        for name in left:
            log.warning("%s still running %gs after the stop", name, deadline)
        return left

    def _threads(self) -> list[threading.Thread]:
        with self._lock:
            own = [w.thread for w in self._workers.values() if w.thread is not None]
            own += list(self._tasks)
            own += [t for pool in self._pools.values() for t in list(pool._threads)]
            own += [t for handoff in self._handoffs.values() for t in handoff.threads]
        return [t for t in own if t is not threading.current_thread()]

    def health(self) -> list[Health]:
        """Each worker's and pool's state, by name."""
        with self._lock:
            workers = sorted(self._workers.values(), key=lambda w: w.name)
            pools = sorted(self._pools) + sorted(self._handoffs)
        out = [
            Health(
                w.name,
                w.thread is not None and w.thread.is_alive(),
                w.errors,
                w.last_error,
                w.last_error_at,
            )
            for w in workers
        ]
        return out + [Health(f"{p} pool", not self.stopping.is_set()) for p in pools]
