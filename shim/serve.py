"""Run the shim: the proxy transport with its admin endpoints and the create
interception, from a config, and the service's background work beside it."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from http.server import ThreadingHTTPServer

from allocator.core.timing import timelimits
from allocator.host import listener
from allocator.host.config import Config
from allocator.host.samples import Samples
from allocator.service.background import Background
from allocator.service.departures import Departures
from allocator.service.views.gpus import LiveView
from allocator.service.wiring import Allocator
from shim import metrics_server, server
from shim.admin import Admin
from shim.create import CreateInterceptor
from shim.waitline import Waitline

log = logging.getLogger("gpu-alloc.shim")
EXPIRY_CHECK_MAX = 60.0  # seconds between release_stopped_after checks, at most
METRICS_POLL = 0.5  # seconds the metrics listener waits for a request before a stop look


def serve(config: Config, allocator: Allocator, claim: listener.Claim | None = None) -> None:
    # SIGHUP re-reads the policy now; a changed file is picked up within seconds anyway.
    signal.signal(signal.SIGHUP, lambda *_: allocator.gather.reload_policy())
    live = LiveView(allocator)
    line = Waitline(allocator)
    metrics = (
        metrics_server.listener(config.metrics.listen, live, line.snapshot)
        if config.metrics.listen
        else None
    )
    work = background(config, allocator, live, metrics)
    work.start()

    def ready() -> None:
        """The event loop's blocking calls (asyncio.to_thread) run on the ledger pool."""
        asyncio.get_running_loop().set_default_executor(work.ledger_pool)

    try:
        server.run(
            config.shim.socket,
            config.engine.socket,
            Admin(allocator, live, line, CreateInterceptor(allocator, line)),
            mode=config.shim.mode,
            group=config.shim.group,
            forward_timeout=config.shim.create_timeout,
            claim=claim,
            ready=ready,
        )
    finally:
        work.stop()
        if metrics is not None:
            metrics.server_close()


def background(
    config: Config,
    allocator: Allocator,
    live: LiveView,
    metrics: ThreadingHTTPServer | None = None,
) -> Background:
    """The shim's long-lived work, each worker on the service's one owner (not started):

    =============  =============================================================
    policy-watch   the config file, every few seconds (`Gatherer.watch_policy`)
    restart-check  restart policies, after a reload (`Restarts.follow_policy`)
    expire         reconcile, for ``release_stopped_after``
    departures     the Engine's destroy events end their containers' leases
    timekeeper     time limits and idle reclaim
    mps            the MPS daemons of shared GPUs, level-triggered (`Mps.keep_level`)
    sampler        GPU use, for the idle mark, the samples and the counters
    metrics        the metrics and dashboard listener (with ``metrics.listen``)
    notify         the notices' outbox, sent to webhooks and mail (with ``notify:``)
    health         the GPU health watcher (added by `allocator.host.watcher.watch`)
    =============  =============================================================
    """
    work = allocator.background
    allocator.gather.watch_policy(work)
    allocator.restarts.follow_policy(work)
    work.every("expire", lambda: _expire_wait(allocator), lambda: _expire(allocator))
    departures = Departures(allocator)
    work.add("departures", departures.run, departures.wake)
    work.every("timekeeper", timelimits.CHECK_MAX, allocator.timekeeper.look, first=0.0)
    allocator.mps.keep_level(work)
    samples = Samples(config.state_dir)

    def every() -> float:
        return sample_every(allocator.gather.policy_in_force.idle_after)

    work.add("sampler", lambda stop: metrics_server.sample_forever(live, every, stop, samples))
    if metrics is not None:
        work.add("metrics", lambda stop: _serve_metrics(metrics, stop))
    if config.notify.on:
        work.add("notify", allocator.notifier.run, allocator.notifier.wake.set)
    return work


def sample_every(idle_after: float) -> float:
    """Seconds between looks at GPU use: a few per ``policy.idle_after``, within bounds."""
    return max(0.5, min(10.0, idle_after / 4))


def _serve_metrics(metrics: ThreadingHTTPServer, stop: threading.Event) -> None:
    """One request at a time into its own thread, looking at ``stop`` between them."""
    metrics.timeout = METRICS_POLL
    while not stop.is_set():
        metrics.handle_request()


def _expire_wait(allocator: Allocator) -> float:
    after = allocator.gather.rules.release_stopped_after
    return EXPIRY_CHECK_MAX if after is None else min(EXPIRY_CHECK_MAX, max(1.0, after / 4))


def _expire(allocator: Allocator) -> float:
    """Reconcile now and then, so stopped containers lose their GPUs with nobody asking."""
    if allocator.gather.rules.release_stopped_after is not None:
        allocator.reconciler.reconcile()
    return _expire_wait(allocator)
