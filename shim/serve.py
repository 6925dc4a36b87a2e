"""Run the shim: the proxy transport with the create interceptor, from a config."""

from __future__ import annotations

import logging
import signal
import threading
import time

from allocator.host.config import Config
from allocator.service import Allocator
from shim import server
from shim.create import CreateInterceptor

log = logging.getLogger("gpu-alloc.shim")
EXPIRY_CHECK_MAX = 60.0  # seconds between release_stopped_after checks, at most


def serve(config: Config, allocator: Allocator) -> None:
    # SIGHUP re-reads the policy now; a changed file is picked up at the next create anyway.
    signal.signal(signal.SIGHUP, lambda *_: allocator.reload_policy())
    threading.Thread(target=_expire, args=(allocator,), name="expire", daemon=True).start()
    server.run(
        config.shim.socket,
        config.engine.socket,
        CreateInterceptor(allocator),
        mode=config.shim.mode,
        group=config.shim.group,
        forward_timeout=config.shim.create_timeout,
    )


def _expire(allocator: Allocator) -> None:
    """Reconcile now and then, so stopped containers lose their GPUs with nobody asking."""
    while True:
        after = allocator.rules.release_stopped_after
        time.sleep(
            EXPIRY_CHECK_MAX if after is None else min(EXPIRY_CHECK_MAX, max(1.0, after / 4))
        )
        if after is None:
            continue
        try:
            allocator.reconcile()
        except Exception:  # a broken Engine or ledger is reported by the creates themselves
            log.warning("release_stopped_after check failed", exc_info=True)
