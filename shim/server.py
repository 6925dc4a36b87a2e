"""The shim's server: the listening socket, its permissions, and the signal handling."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from allocator.core.api import numbers
from allocator.host import listener
from shim.framing import FORWARD_TIMEOUT, MAX_BODY, Interceptor
from shim.splice import Splice

log = logging.getLogger(__name__)
STOP_GRACE = 0.1  # seconds for the answers to waiting creates to be written


class Proxy:
    """What every connection of one server shares: where the Engine is, the interceptor,
    the limits, and the open connections."""

    __slots__ = ("conns", "forward_timeout", "interceptor", "max_body", "upstream_path")

    def __init__(
        self, upstream_path: str, interceptor: Interceptor, forward_timeout: float, max_body: int
    ) -> None:
        self.upstream_path = upstream_path
        self.interceptor = interceptor
        self.forward_timeout = forward_timeout
        self.max_body = max_body
        self.conns: set[Splice] = set()


GID = numbers.whole("a group id", high=(1 << 32) - 2)


def _gid(group: str) -> int:
    gid = numbers.maybe(group, GID)
    if gid is not None:
        return int(gid)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise OSError(
            f"shim.group: no group named '{group}' on this host; create it, or set "
            "shim.group to an existing group (or null)"
        ) from None


async def serve(
    listen_path: str,
    upstream_path: str,
    interceptor: Interceptor,
    *,
    mode: int = 0o660,
    group: str | None = None,
    ready: Callable[[], None] | None = None,
    forward_timeout: float = FORWARD_TIMEOUT,
    max_body: int = MAX_BODY,
    claim: listener.Claim | None = None,
) -> None:
    """Serve the proxy on `listen_path` until cancelled.

    The socket is created owner-only and then given `mode` and `group`, so it is never
    reachable by others before its permissions are right.  A shim already serving on
    `listen_path` makes this one refuse (`listener.AlreadyRunning`) before it touches
    the socket; ``claim`` is that check made earlier by the caller.
    """
    proxy = Proxy(upstream_path, interceptor, forward_timeout, max_body)
    held = claim or listener.claim(listen_path, "gpu-alloc shim")
    loop = asyncio.get_running_loop()
    old_umask = os.umask(0o177)
    try:
        server = await loop.create_unix_server(lambda: Splice(proxy), listen_path)
    except BaseException:
        held.close()
        raise
    finally:
        os.umask(old_umask)
    inode = os.stat(listen_path).st_ino
    try:
        if group is not None:
            os.chown(listen_path, -1, _gid(group))
        os.chmod(listen_path, mode)
        log.info("shim listening on %s, forwarding to %s", listen_path, upstream_path)
        if ready is not None:
            ready()
        await server.serve_forever()
    finally:
        server.close()
        stop = getattr(interceptor, "stop", None)
        if stop is not None:  # waiting creates get their 503 before the connections close
            stop()
            await asyncio.sleep(STOP_GRACE)
        for conn in list(proxy.conns):
            conn.close(abort=True)
        with contextlib.suppress(OSError):
            if os.stat(listen_path).st_ino == inode:
                os.unlink(listen_path)
        held.close()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run(listen_path: str, upstream_path: str, interceptor: Interceptor, **kwargs: Any) -> None:
    """Run `serve` until SIGTERM or SIGINT (a blocking entry point for the CLI)."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, task.cancel)
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await serve(listen_path, upstream_path, interceptor, **kwargs)
        finally:
            # uvloop leaves its handlers installed when it closes: a second SIGTERM while
            # the background work stops, or a process forked later, would ignore it.
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
        log.info("shim stopped")

    with asyncio.Runner(loop_factory=event_loop) as runner:
        runner.run(main())


def event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed: the shim's per-call cost is mostly the event loop's own,
    and uvloop's is smaller than asyncio's default loop; the shim's code runs the same
    on both.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
