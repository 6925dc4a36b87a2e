"""Running the interceptor on a request the connection handed over, and its answer's bytes.

Only requests the interceptor wants (creates, starts, other device-relevant writes,
gpu-alloc's own read routes, the ways into an owned container) come here, read whole by
the connection (shim/connection.py); the rest is spliced.  Whatever the interceptor
does, the client gets an answer in the Engine's format: its own, the Engine's to the
request it passed on, or a 500 saying what failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from shim.framing import (
    Forward,
    Interceptor,
    PassOn,
    Request,
    UpstreamError,
    encode_response,
    error_bytes,
)

log = logging.getLogger(__name__)


async def answer(
    interceptor: Interceptor, request: Request, forward: Forward, send: Callable[[bytes], None],
    *, keep: bool, pass_on: Callable[[Request], Awaitable[None]],
) -> None:  # fmt: skip
    """Have `interceptor` answer `request` and `send` the answer's wire bytes (framed to
    close the connection unless `keep`), or `pass_on` the request it hands back; then log
    the exchange."""
    started = time.monotonic()
    note = ""
    head_req = request.method == "HEAD"  # as asked: the interceptor may rewrite it
    try:
        response = await interceptor.handle(request, forward)
        if isinstance(response, PassOn):
            await pass_on(response.request)
            log.info("%s %s -> passed on", request.method, request.target)
            return
        out = encode_response(response, head_only=head_req, close=not keep)
        status, note = response.status, response.note
    except Exception as e:
        if isinstance(e, UpstreamError):
            log.error("%s %s: Engine exchange failed: %s", request.method, request.target, e)
            msg = f"gpu-alloc shim: the Engine did not answer: {e}"
        else:
            log.exception("%s %s: interceptor failed", request.method, request.target)
            msg = f"gpu-alloc shim: internal error: {type(e).__name__}: {e}"
        status = 500
        out = error_bytes(500, msg, close=not keep)
    elapsed = (time.monotonic() - started) * 1000
    send(out)
    # Logged once the answer is on its way: the client does not wait for the line.
    log.info(
        "%s %s -> %d (%.1f ms)%s", request.method, request.target, status, elapsed,
        f", {note}" if note else "",
    )  # fmt: skip
