"""Run the shim: the proxy transport with the create interceptor, from a config."""

from __future__ import annotations

import threading

from allocator.host import listener
from allocator.host.config import Config
from allocator.ops.gpus import LiveView
from allocator.service import Allocator
from shim import metrics_server, server
from shim.create import CreateInterceptor


def serve(config: Config, allocator: Allocator, claim: listener.Claim | None = None) -> None:
    live = LiveView(allocator)
    stop = threading.Event()
    every = max(0.5, min(10.0, config.policy.idle_after / 4))
    threading.Thread(
        target=metrics_server.sample_forever, args=(live, every, stop), daemon=True
    ).start()
    metrics = metrics_server.serve(config.metrics.listen, live) if config.metrics.listen else None
    try:
        server.run(
            config.shim.socket,
            config.engine.socket,
            CreateInterceptor(allocator, live),
            mode=config.shim.mode,
            group=config.shim.group,
            forward_timeout=config.shim.create_timeout,
            claim=claim,
        )
    finally:
        stop.set()
        if metrics is not None:
            metrics.shutdown()
