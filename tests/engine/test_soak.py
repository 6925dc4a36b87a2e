"""A bounded soak: clients and chaos at once, then the invariants and every GPU free.

Client threads create, start, stop and remove containers with and without GPUs
through both sockets (GPU creates through the shim; on the real socket they must
be denied), while a chaos thread SIGKILLs the shim (and starts a new one) or a
plugin worker every few seconds.  It stops by itself: about a minute in
``make test``; ``GPU_ALLOC_SOAK_SECONDS`` sets the length of the busy phase for
the long form.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time

from tests.support import engine
from tests.support.faults import (
    IMAGE,
    FaultStack,
    assert_all_free,
    assert_invariants,
    real,
    remove_all,
    shim,
)

GPUS = 4
PENDING_TTL = 12.0
CLIENTS = 4
SECONDS = float(os.environ.get("GPU_ALLOC_SOAK_SECONDS") or 35)
UUIDS = [engine.sim_gpu_uuid(k) for k in range(GPUS)]


def make_stack() -> FaultStack:
    return FaultStack(gpus=GPUS, pending_ttl=PENDING_TTL)


class Client:
    """One user: random operations on its own containers, counting what happened."""

    def __init__(self, stack: FaultStack, k: int, stop: threading.Event) -> None:
        self.stack, self.k, self.stop = stack, k, stop
        self.rng = random.Random()
        self.mine: list[str] = []
        self.n = 0
        self.counts: dict[str, int] = {}
        self.real_gpu_creates: list[subprocess.CompletedProcess] = []

    def via(self):
        return self.rng.choice((shim, real))

    def count(self, what: str, result: subprocess.CompletedProcess) -> None:
        key = f"{what}:{'ok' if result.returncode == 0 else 'failed'}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def run(self) -> None:
        while not self.stop.is_set():
            action = self.rng.choice(
                ("gpu", "gpu", "plain", "real-gpu", "stop", "start", "rm", "rm")
            )
            getattr(self, "do_" + action.replace("-", "_"))()

    def _create(self, via, *args: str) -> subprocess.CompletedProcess:
        self.n += 1
        name = f"s{self.k}n{self.n}"
        out = via(self.stack, "run", "-d", "--name", name, *args, timeout=60)
        if out.returncode == 0 or "Conflict" in out.stderr or "may exist" in out.stderr:
            self.mine.append(name)
        return out

    def do_gpu(self) -> None:
        n = str(self.rng.choice((1, 1, 2)))
        self.count("gpu", self._create(shim, "--gpus", n, IMAGE, "sleep", "300"))

    def do_plain(self) -> None:
        self.count("plain", self._create(self.via(), IMAGE, "sleep", "300"))

    def do_real_gpu(self) -> None:
        out = self._create(real, "--gpus", "1", IMAGE, "sleep", "300")
        self.count("real-gpu", out)
        self.real_gpu_creates.append(out)

    def _pick(self) -> str | None:
        return self.rng.choice(self.mine) if self.mine else None

    def do_stop(self) -> None:
        if name := self._pick():
            self.count("stop", self.via()(self.stack, "stop", "-t", "0", name, timeout=60))

    def do_start(self) -> None:
        if name := self._pick():
            self.count("start", self.via()(self.stack, "start", name, timeout=60))

    def do_rm(self) -> None:
        if name := self._pick():
            out = self.via()(self.stack, "rm", "-f", name, timeout=60)
            self.count("rm", out)
            if out.returncode == 0:
                self.mine.remove(name)


def chaos(stack: FaultStack, stop: threading.Event, log: list[str]) -> None:
    rng = random.Random()
    while not stop.wait(rng.uniform(2.0, 5.0)):
        if rng.random() < 0.5:
            stack.kill_shim()
            log.append("shim")
            time.sleep(rng.uniform(0.0, 1.0))
            stack.start_shim()
        else:
            workers = stack.plugin_workers()
            if workers:
                stack.kill_plugin_worker(rng.choice(workers))
                log.append("worker")
            stack.wait_plugin_workers()


def test_soak_clients_and_chaos_leave_nothing_leaked_or_granted_twice(stack):
    stop = threading.Event()
    clients = [Client(stack, k, stop) for k in range(CLIENTS)]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    kills: list[str] = []
    chaos_thread = threading.Thread(target=chaos, args=(stack, stop, kills), daemon=True)
    for t in (*threads, chaos_thread):
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in (*threads, chaos_thread):
        t.join(120)
        assert not t.is_alive(), "a soak thread did not stop"
    if stack.shim is None:
        stack.start_shim()
    stack.wait_plugin_workers()

    counts: dict[str, int] = {}
    for c in clients:
        for key, value in c.counts.items():
            counts[key] = counts.get(key, 0) + value
    summary = f"operations {sorted(counts.items())}, kills {kills}"
    assert kills, summary
    assert counts.get("gpu:ok", 0) > 0 and counts.get("plain:ok", 0) > 0, summary
    leaked = [r for c in clients for r in c.real_gpu_creates if r.returncode == 0]
    assert not leaked, f"real-socket GPU creates allowed: {leaked}"
    assert_invariants(stack)
    remove_all(stack)
    assert_all_free(stack, wait=PENDING_TTL + 5)
    out = shim(stack, "run", "--rm", "--gpus", "all", IMAGE, "printenv", "NVIDIA_VISIBLE_DEVICES")
    assert out.returncode == 0 and sorted(out.stdout.strip().split(",")) == UUIDS, out.stderr
