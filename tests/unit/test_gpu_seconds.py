"""GPU time from the shim's sampler: the GPU-seconds counters and the utilisation samples."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from allocator.host import metrics
from allocator.host.samples import Samples
from allocator.service.views import gpus
from allocator.service.wiring import Allocator
from shim import metrics_server
from tests.unit.test_observe import UUIDS, free_port, scrape, world, write_gpus

__all__ = ["world"]  # the fixture


def test_each_look_adds_the_time_since_the_last_to_the_holders_counters(
    world: tuple[Allocator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc, gpus_file = world
    write_gpus(gpus_file, {0: {"utilization": 0.75}, 1: {"utilization": 1.0}})
    counted: list[tuple[str, str, float, float | None]] = []
    monkeypatch.setattr(metrics, "gpu_seconds", lambda *a: counted.append(a))
    [lease] = alloc.ledger.read().leases.values()
    metrics_server.count_gpu_seconds(gpus.LiveView(alloc).read(), 2.0)
    assert counted == [(lease.owner, "", 2.0, 1.5)]  # GPU 1 is busy, but nobody holds it


def test_the_sampler_keeps_each_gpus_utilisation(world: tuple[Allocator, Path]) -> None:
    alloc, gpus_file = world
    write_gpus(gpus_file, {0: {"utilization": 0.75}})
    samples = Samples(alloc.config.state_dir)
    stop = threading.Event()
    live = gpus.LiveView(alloc)
    sampler = threading.Thread(
        target=metrics_server.sample_forever, args=(live, lambda: 0.05, stop, samples)
    )
    sampler.start()
    try:
        deadline = time.monotonic() + 30
        while not (kept := samples.read(time.time() - 120, time.time()).get(UUIDS[0])):
            assert time.monotonic() < deadline, "no sample kept"
            time.sleep(0.05)
    finally:
        stop.set()
        sampler.join()
    [*_, last] = kept
    assert (last.utilization, last.active) == (0.75, 1.0)


def test_the_counters_are_labelled_by_owner_and_pool_and_bounded(
    world: tuple[Allocator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc, _ = world
    env_dir = metrics.directory(alloc.config.state_dir)
    os.makedirs(env_dir, exist_ok=True)
    monkeypatch.setenv(metrics.ENV, env_dir)
    code = (
        "from allocator.host import metrics; import sys; metrics.enable(sys.argv[1]);"
        "metrics.MAX_OWNERS = 2;"
        "metrics.gpu_seconds('alice', 'big', 2.0, 1.5);"
        "metrics.gpu_seconds('alice', 'big', 2.0, 1.5);"
        "metrics.gpu_seconds('bob', '', 1.0, None); metrics.gpu_seconds('carol', '', 1.0, 0.5)"
    )
    env = {**os.environ, metrics.ENV: env_dir}
    subprocess.run([sys.executable, "-c", code, alloc.config.state_dir], env=env, check=True)
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    try:
        got = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    held = {(lab["owner"], lab["pool"]): v for lab, v in got["gpu_alloc_gpu_seconds_held_total"]}
    used = {(lab["owner"], lab["pool"]): v for lab, v in got["gpu_alloc_gpu_seconds_used_total"]}
    assert held == {("alice", "big"): 4.0, ("bob", ""): 1.0, ("other", ""): 1.0}
    assert used == {("alice", "big"): 3.0, ("other", ""): 0.5}  # bob's use was not known
