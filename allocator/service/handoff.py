"""Work an event loop hands to threads, and each result handed back: the shim's lease,
the plugin's decisions that wait.

Why not ``loop.run_in_executor`` on a ``ThreadPoolExecutor``: its hand-off does its
Python work on the loop after the thread is woken (the executor's bookkeeping, a
concurrent future chained to an asyncio one under their locks), so the woken thread
first waits for the GIL the loop still holds, and the result comes back through the
same chain.  Here the loop makes its future, puts the work on a queue and goes back to
waiting; the thread answers with one ``call_soon_threadsafe``.  On the AuthZRes of a
GPU create (its bind is the work), the hop to a thread and back took 380 to 400 µs
through the executor and 240 to 300 here (`make bench-stages`, BENCHMARKS.md).

Threads start as work finds none idle, up to ``size``; each runs until `stop`, which
cancels what no thread has begun (a lease not yet taken is never taken) and refuses
what comes after it, as an executor shut down does.  A result that comes once its loop
has closed is dropped: nobody is left to send it.  The threads are daemons: work in
flight is waited for by whoever stops (gunicorn's graceful stop counts the plugin's,
`Background.stop` joins the shim's up to its deadline), and a process that exits
anyway leaves the ledger whole, since its every write is atomic.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

_Item = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[], Any]] | None


class Handoff:
    """Up to ``size`` threads named ``<name>-N`` running what `submit` hands them."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one count per thread waiting for work
        self._threads: list[threading.Thread] = []
        self._stopped = False

    def submit(self, work: Callable[[], Any]) -> asyncio.Future[Any]:
        """``work()`` on a thread; its result (or exception) in the future returned, on
        the running loop.  RuntimeError once stopped."""
        if self._stopped:
            raise RuntimeError(f"{self.name}: cannot take work after its stop")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((loop, future, work))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self.size:
            thread = threading.Thread(
                target=self._run, name=f"{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return future

    def stop(self) -> None:
        """Cancel what no thread has begun; each thread ends after its current work."""
        self._stopped = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:  # cancelled on its own loop, from whichever thread stops
                _back(item[0], _cancel, item[1])
        for _ in self._threads:
            self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, future, work = item
            try:
                result = work()
            except BaseException as e:  # the future carries it to the loop
                outcome: tuple[Callable[..., None], Any] = (_fail, e)
            else:
                outcome = (_settle, result)
            # idle before the loop hears back, so work it submits next finds this thread
            self._idle.release()
            _back(loop, outcome[0], future, outcome[1])

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)


def _back(loop: asyncio.AbstractEventLoop, how: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: its server stopped
        loop.call_soon_threadsafe(how, *args)


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _cancel(future: asyncio.Future[Any]) -> None:
    future.cancel()


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
