"""An event loop's hand-off to threads (allocator/service/handoff.py): work runs off the loop,
its result or its exception comes back to the loop's future, threads start only when
none is idle, and a stop cancels what no thread has begun."""

from __future__ import annotations

import asyncio
import threading

import pytest

from allocator.service.handoff import Handoff


def test_work_runs_on_a_thread_and_its_result_comes_back_to_the_loop() -> None:
    async def main() -> tuple[str, str]:
        pool = Handoff(4, "t")
        try:
            return await pool.submit(
                lambda: threading.current_thread().name
            ), threading.current_thread().name
        finally:
            pool.stop()

    ran_on, loop_on = asyncio.run(main())
    assert ran_on == "t-0"
    assert ran_on != loop_on


def test_an_exception_in_the_work_is_raised_from_the_future() -> None:
    def boom() -> None:
        raise ValueError("the ledger is locked")

    async def main() -> None:
        pool = Handoff(4, "t")
        try:
            await pool.submit(boom)
        finally:
            pool.stop()

    with pytest.raises(ValueError, match="the ledger is locked"):
        asyncio.run(main())


def test_an_idle_thread_takes_the_next_work_rather_than_a_new_thread_starting() -> None:
    async def main() -> list[str]:
        pool = Handoff(4, "t")
        names = []
        try:
            for _ in range(5):
                names.append(await pool.submit(lambda: threading.current_thread().name))
            return names
        finally:
            pool.stop()

    assert set(asyncio.run(main())) == {"t-0"}


def test_work_that_waits_gets_threads_of_its_own_up_to_the_size() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def wait() -> str:
        started.release()
        release.wait(5)
        return threading.current_thread().name

    async def main() -> tuple[list[str], int]:
        pool = Handoff(2, "t")
        try:
            futures = [pool.submit(wait) for _ in range(3)]
            for _ in range(2):  # two run at once; the third waits for a thread
                await asyncio.to_thread(started.acquire, True, 5)
            threads = len(pool._threads)
            release.set()
            return list(await asyncio.gather(*futures)), threads
        finally:
            pool.stop()

    names, threads = asyncio.run(main())
    assert threads == 2
    assert sorted(set(names)) == ["t-0", "t-1"]


def test_a_stop_cancels_the_work_no_thread_has_begun() -> None:
    release = threading.Event()
    began = threading.Event()

    def hold() -> None:
        began.set()
        release.wait(5)

    async def main() -> tuple[bool, bool]:
        pool = Handoff(1, "t")
        running = pool.submit(hold)
        await asyncio.to_thread(began.wait, 5)
        queued = pool.submit(lambda: "never")
        pool.stop()
        release.set()
        await running  # the work already begun finishes
        await asyncio.to_thread(pool._threads[0].join, 5)
        return queued.cancelled(), pool._threads[0].is_alive()

    cancelled, alive = asyncio.run(main())
    assert cancelled
    assert not alive


def test_a_result_after_the_loop_has_closed_is_dropped_quietly() -> None:
    release = threading.Event()
    done = threading.Event()
    loop = asyncio.new_event_loop()
    pool = Handoff(1, "t")

    def late() -> str:
        release.wait(5)
        return "too late"

    async def hand_over() -> None:
        pool.submit(late)

    loop.run_until_complete(hand_over())
    loop.close()
    errors: list[BaseException] = []
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment]
    try:
        release.set()
        pool.stop()
        pool._threads[0].join(5)
        done.set()
    finally:
        threading.excepthook = threading.__excepthook__
    assert done.is_set() and not pool._threads[0].is_alive()
    assert errors == []


def test_work_handed_over_after_the_stop_is_refused_not_left_waiting() -> None:
    async def main() -> None:
        pool = Handoff(1, "t")
        assert await pool.submit(lambda: 1) == 1
        pool.stop()
        with pytest.raises(RuntimeError, match="after its stop"):
            pool.submit(lambda: 2)

    asyncio.run(main())
