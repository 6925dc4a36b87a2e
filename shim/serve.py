"""Run the shim: the proxy transport with its admin endpoints and the create
interception, from a config."""

from __future__ import annotations

import logging
import signal
import threading
import time

from allocator.departures import Departures
from allocator.host import listener
from allocator.host.config import Config
from allocator.host.samples import Samples
from allocator.service import Allocator
from allocator.views.gpus import LiveView
from shim import metrics_server, server
from shim.admin import Admin
from shim.create import CreateInterceptor
from shim.waitline import Waitline

log = logging.getLogger("gpu-alloc.shim")
EXPIRY_CHECK_MAX = 60.0  # seconds between release_stopped_after checks, at most


def serve(config: Config, allocator: Allocator, claim: listener.Claim | None = None) -> None:
    # SIGHUP re-reads the policy now; a changed file is picked up within seconds anyway.
    signal.signal(signal.SIGHUP, lambda *_: allocator.gather.reload_policy())
    allocator.gather.watch_policy()
    threading.Thread(target=_expire, args=(allocator,), name="expire", daemon=True).start()
    live = LiveView(allocator)
    stop = threading.Event()
    Departures(allocator, stop).start()
    allocator.timekeeper.start(stop)
    allocator.mps.start(stop)
    every = max(0.5, min(10.0, config.policy.idle_after / 4))
    samples = Samples(config.state_dir)
    threading.Thread(
        target=metrics_server.sample_forever, args=(live, every, stop, samples), daemon=True
    ).start()
    line = Waitline(allocator)
    metrics = (
        metrics_server.serve(config.metrics.listen, live, line.snapshot)
        if config.metrics.listen
        else None
    )
    try:
        server.run(
            config.shim.socket,
            config.engine.socket,
            Admin(allocator, live, line, CreateInterceptor(allocator, line)),
            mode=config.shim.mode,
            group=config.shim.group,
            forward_timeout=config.shim.create_timeout,
            claim=claim,
        )
    finally:
        stop.set()
        if metrics is not None:
            metrics.shutdown()


def _expire(allocator: Allocator) -> None:
    """Reconcile now and then, so stopped containers lose their GPUs with nobody asking."""
    while True:
        after = allocator.gather.rules.release_stopped_after
        time.sleep(
            EXPIRY_CHECK_MAX if after is None else min(EXPIRY_CHECK_MAX, max(1.0, after / 4))
        )
        if after is None:
            continue
        try:
            allocator.reconciler.reconcile()
        except Exception:  # a broken Engine or ledger is reported by the creates themselves
            log.warning("release_stopped_after check failed", exc_info=True)
