"""allocator.service.background: one owner starts, stops and watches every thread and pool; the
shim's background work, started and stopped, leaves no gpu-alloc thread alive."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allocator.host import unixhttp
from allocator.host.config import Config, MetricsConfig, PolicyConfig
from allocator.host.watcher import watch
from allocator.service import background as bg
from allocator.service.background import PREFIX, Background
from allocator.service.views import wire
from allocator.service.views.gpus import LiveView
from allocator.service.wiring import Allocator
from shim import metrics_server
from shim import serve as shim_serve
from tests.support.engine import can_connect
from tests.support.fake_engine import FakeEngine
from tests.unit.test_observe import free_port, scrape, write_gpus


def ours() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(PREFIX)}


def until(check: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


@pytest.fixture
def work() -> Iterator[Background]:
    owner = Background()
    yield owner
    owner.stop(1.0)


def test_a_step_runs_every_period_and_a_failed_one_is_recorded_and_survived(work) -> None:
    runs: list[int] = []

    def step() -> None:
        runs.append(1)
        if len(runs) == 2:
            raise OSError("ledger unreadable")

    work.every("look", 0.01, step)
    work.start()
    until(lambda: len(runs) >= 4)
    [health] = work.health()
    assert (health.name, health.alive, health.errors) == ("look", True, 1)
    assert health.last_error == "OSError: ledger unreadable" and health.last_error_at


def test_a_step_says_when_it_runs_next_and_the_first_may_run_at_once(work) -> None:
    ran = threading.Event()
    work.every("soon", 3600.0, lambda: ran.set() or 3600.0, first=0.0)
    work.start()
    assert ran.wait(5)


def test_a_worker_that_dies_is_run_again_and_its_error_reported(work) -> None:
    calls: list[int] = []

    def run(stop: threading.Event) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("stream broke")
        stop.wait()

    work.add("follow", run)
    work.start()
    until(lambda: len(calls) == 2)
    [health] = work.health()
    assert health.alive and health.errors == 1 and "stream broke" in health.last_error


def test_a_worker_added_once_started_starts_at_once_and_a_name_is_added_once(work) -> None:
    work.start()
    ran = threading.Event()
    work.add("late", lambda stop: ran.set())
    assert ran.wait(5)
    with pytest.raises(ValueError, match="'late' is added twice"):
        work.add("late", lambda stop: None)


def test_stop_wakes_a_blocked_worker_and_waits_for_tasks_and_pools() -> None:
    work = Background()
    unblock = threading.Event()
    work.add("stream", lambda stop: unblock.wait(), wake=unblock.set)
    work.start()
    work.once("stop-c0ffee", time.sleep, 0.2)
    work.ledger_pool.submit(time.sleep, 0.2)
    until(lambda: f"{PREFIX}ledger_0" in ours())
    assert work.stop(5.0) == []
    assert not {f"{PREFIX}stream", f"{PREFIX}stop-c0ffee", f"{PREFIX}ledger_0"} & ours()
    assert [h.alive for h in work.health()] == [False, False]


def test_stop_names_a_thread_that_outlives_the_deadline() -> None:
    work = Background()
    release = threading.Event()
    work.add("stuck", lambda stop: release.wait())
    work.start()
    try:
        assert work.stop(0.1) == [f"{PREFIX}stuck"]
    finally:
        release.set()
    until(lambda: f"{PREFIX}stuck" not in ours())


def test_work_queued_on_a_pool_still_runs_at_stop() -> None:
    """A grant's fsync or a settle queued behind others is not dropped (nothing lost)."""
    work = Background(ledger_threads=1)
    done: list[int] = []
    work.ledger_pool.submit(time.sleep, 0.1)
    work.ledger_pool.submit(done.append, 1)
    assert work.stop(5.0) == []
    assert done == [1]


def test_a_hand_off_is_one_per_name_named_in_health_and_stopped_with_the_rest() -> None:
    """What a request waits on (the shim's lease): queued work no thread has begun is
    cancelled at stop, never run, and its threads end with the owner's."""
    work = Background()
    leasing = work.handoff("lease", 1)
    assert work.handoff("lease", 1) is leasing
    release, began = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> None:
        began.set()
        release.wait(5)

    async def main() -> bool:
        running = leasing.submit(hold)
        await asyncio.to_thread(began.wait, 5)
        queued = leasing.submit(lambda: ran.append("taken"))
        assert "lease pool" in [h.name for h in work.health()]
        stopping = asyncio.ensure_future(asyncio.to_thread(work.stop, 5.0))
        await asyncio.to_thread(work.stopping.wait, 5)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(queued), 5)
        release.set()  # the work already begun ends; so does its thread
        await running
        assert await stopping == []
        return queued.cancelled()

    assert asyncio.run(main())
    assert ran == []
    assert not any(t.is_alive() for t in leasing.threads)


def test_no_task_starts_once_stopping(work) -> None:
    work.stop(1.0)
    ran: list[int] = []
    work.once("late", ran.append, 1)
    time.sleep(0.05)
    assert ran == []


def test_the_ledger_pool_is_bounded() -> None:
    work = Background()
    assert work.ledger_pool is work.ledger_pool
    assert work.ledger_pool._max_workers == bg.LEDGER_THREADS
    work.stop(1.0)


# ---------------------------------------------------------------- the shim's work


class Blocking:
    """An Engine event stream that brings nothing until aborted, as a quiet dockerd's."""

    def __init__(self) -> None:
        self.aborted = threading.Event()

    def __iter__(self) -> Blocking:
        return self

    def __next__(self) -> dict[str, Any]:
        self.aborted.wait()
        raise StopIteration

    def abort(self) -> None:
        self.aborted.set()


class QuietEngine(FakeEngine):
    def destroyed(self) -> Blocking:
        return Blocking()

    def events(self, filters: dict, since: int | None = None) -> Blocking:  # type: ignore[override]
        return Blocking()


def shim_config(tmp_path: Path, listen: str) -> Config:
    gpus = tmp_path / "gpus.yaml"
    write_gpus(gpus, {0: {"utilization": 0.5}})
    (tmp_path / "state").mkdir()
    return Config(
        state_dir=str(tmp_path / "state"),
        gpus=str(gpus),
        policy=PolicyConfig(idle_after=2.0),
        metrics=MetricsConfig(listen=listen),
    )


def test_starting_and_stopping_the_shims_work_leaves_no_gpu_alloc_thread(tmp_path) -> None:
    before = ours()  # another test's, still ending
    port = free_port()
    config = shim_config(tmp_path, f"127.0.0.1:{port}")
    alloc = Allocator(config, QuietEngine())  # type: ignore[arg-type]
    live = LiveView(alloc)
    metrics = metrics_server.listener(config.metrics.listen or "", live)
    assert watch(alloc)
    work = shim_serve.background(config, alloc, live, metrics)
    work.start()
    try:
        alloc.lookups.image_config("busybox")  # the image event stream, started on demand
        work.ledger_pool.submit(alloc.ledger.read).result(5)
        names = {
            "policy-watch", "restart-check", "expire", "departures", "timekeeper", "mps", "sampler",
            "metrics", "health", "image-events",
        }  # fmt: skip
        until(lambda: {f"{PREFIX}{n}" for n in names} <= ours())
        up = {s[0]["worker"]: s[1] for s in scrape(port)["gpu_alloc_worker_up"]}
        assert {n: up[n] for n in names} == dict.fromkeys(names, 1.0)
    finally:
        left = work.stop(5.0)
        metrics.server_close()
    assert left == []
    assert ours() - before == set()


def test_the_shim_serves_on_the_ledger_pool_and_stops_every_thread_it_started(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`shim.serve.serve` whole: its loop's blocking calls run on the ledger pool, and
    SIGTERM stops the server and all its background work."""
    before = ours()
    config = shim_config(tmp_path, f"127.0.0.1:{free_port()}")
    config = replace(config, shim=replace(config.shim, socket=str(tmp_path / "shim.sock")))
    alloc = Allocator(config, QuietEngine())  # type: ignore[arg-type]
    ran_on: list[str] = []
    real = LiveView.snapshot

    def snapshot(self: LiveView) -> dict[str, Any]:
        ran_on.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(LiveView, "snapshot", snapshot)
    answers: list[int] = []

    def client() -> None:
        try:
            # Accepting, not only there: the file is made at bind, before the listen.
            until(lambda: can_connect(config.shim.socket), 30)
            answers.append(unixhttp.request(config.shim.socket, "GET", wire.GPUS_PATH)[0])
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the shim's own stop

    hup = signal.getsignal(signal.SIGHUP)
    threading.Thread(target=client).start()
    try:
        shim_serve.serve(config, alloc)
    finally:
        signal.signal(signal.SIGHUP, hup)
    assert answers == [200]
    assert ran_on and ran_on[0].startswith(f"{PREFIX}ledger")
    assert ours() - before == set()
    # SIGTERM is the default's again: a process forked after the shim stopped still dies
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
