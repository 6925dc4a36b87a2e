"""The plugin's gunicorn worker: an asyncio loop (uvloop where installed), httptools framing.

Why a worker of our own
-----------------------
dockerd calls the plugin twice for every API call on the host, one connection
at a time per keep-alive connection, and almost every call is answered from the
route table alone.  A general-purpose worker (gevent's pywsgi) spends several times
a bare asyncio responder's (tests/bench/floor.py) server time around that answer, and
serves under half its calls a second (BENCHMARKS.md).  This worker is the floor's
shape with gpu-alloc's decisions in it:

* one asyncio protocol per connection; httptools (the parser the shim uses too)
  finds message boundaries;
* an answer that needs no I/O (`Dispatcher.answer` returns bytes) is written from
  the protocol callback itself: no task, no thread, no copy of the envelope;
* so is the allowing of an unnamed create whose facts are cached (the ledger's
  files are read without the lock), which spares the create two thread hops, to a
  pool and back;
* a decision that takes the ledger lock, asks the Engine or refuses (a `Later`)
  runs on a thread (allocator/service/handoff.py: one wake each way; the hand-off
  is the service's `Background.handoff("decide")`, stopped and listed in health
  with its other pools), so while it waits this worker keeps answering every other
  call, including the ones its own Engine inspects make dockerd send back to it;
* answers go out in request order on each connection;
* the activation handshake is one more route of the dispatcher (a constant answer;
  the files it touches are touched on the pool); any other call gets a 404 in the
  plugin protocol's error format (``{"Err": ...}``, which dockerd shows).  No web
  framework: there is no other route to serve.

gunicorn still owns the processes: the arbiter forks the workers, restarts one
that dies, and kills one whose heartbeat stops (`notify` below, every second).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import httptools
from gunicorn.workers import base

from allocator.service.handoff import Handoff
from plugin.app import Dispatcher

_MAX_BODY = 16 << 20  # dockerd sends at most 4 MiB of a body to a plugin
_THREADS = 64  # decisions that wait (for the lock, for the Engine) at the same time
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


def _reply(status: int, body: bytes, content_type: bytes) -> bytes:
    reason = _REASONS.get(status, "OK").encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        reason,
        content_type,
        len(body),
        body,
    )


_MIME = b"application/vnd.docker.plugins.v1+json"  # what dockerd's plugin client sends


def _error(status: int, msg: str) -> bytes:
    """An error as dockerd's plugin client reads one: it shows ``Err``."""
    return _reply(status, json.dumps({"Err": msg}).encode(), _MIME)


_BAD = _error(400, "gpu-alloc plugin: malformed HTTP request")
_FAILED = _error(500, "gpu-alloc plugin: the answer failed; the plugin's log says why")


class _Connection(asyncio.Protocol):
    """One keep-alive connection from dockerd: parse, answer in order."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.size = 0
        self.queue: deque[asyncio.Future[bytes]] = deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._send(_BAD)
            self._close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.body, self.size = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > _MAX_BODY:
            raise httptools.HttpParserError("body too large")
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("latin-1")
        path = self.url.partition(b"?")[0].decode("latin-1")
        raw = b"".join(self.body)
        dispatcher = self.worker.dispatcher
        if method == "POST" and dispatcher.handles(path):
            answer = dispatcher.answer(path, raw)
            if isinstance(answer, bytes):
                self._answer(_reply(200, answer, _MIME))
                return
            self._queue(self.worker.later(partial(_framed, answer)))
        else:
            self._answer(_error(404, _unknown(method, path)))
            return
        if not self.parser.should_keep_alive():
            self.queue[-1].add_done_callback(lambda _: self._close())

    def _answer(self, data: bytes) -> None:
        if self.queue:  # an earlier answer on this connection is still being decided
            done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            done.set_result(data)
            self._queue(done)
        else:
            self._send(data)
            if not self.parser.should_keep_alive():
                self._close()

    def _queue(self, future: asyncio.Future[bytes]) -> None:
        self.queue.append(future)
        future.add_done_callback(self._flush)

    def _flush(self, _: object) -> None:
        while self.queue and self.queue[0].done():
            future = self.queue.popleft()
            if future.cancelled():
                self._close()
                return
            error = future.exception()
            if error is not None:
                self.worker.log.error("plugin answer failed: %r", error)
                self._send(_FAILED)
            else:
                self._send(future.result())

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _framed(later: Callable[[], bytes]) -> bytes:
    """A decision and its HTTP framing, both on the pool: the loop only sends the bytes."""
    return _reply(200, later(), _MIME)


def _unknown(method: str, path: str) -> str:
    return (
        f"gpu-alloc plugin: no {method} {path}; it answers POST /Plugin.Activate,"
        " /AuthZPlugin.AuthZReq and /AuthZPlugin.AuthZRes"
    )


class Worker(base.Worker):
    """gunicorn's worker protocol around the asyncio server above."""

    loop: asyncio.AbstractEventLoop

    def init_process(self) -> None:
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.busy = 0
        self.stopping = asyncio.Event()  # set by a stop signal: the serve loop wakes at once
        super().init_process()

    def load_wsgi(self) -> None:
        """gunicorn loads the application in each worker, after its fork: ours is no WSGI
        callable but the `Dispatcher` (`plugin.serve`)."""
        dispatcher = self.app.wsgi()
        if not isinstance(dispatcher, Dispatcher):
            raise TypeError(f"plugin.worker serves a Dispatcher, not {dispatcher!r}")
        self.dispatcher: Dispatcher = dispatcher
        self.pool: Handoff = dispatcher.alloc.background.handoff("decide", _THREADS)

    def init_signals(self) -> None:
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        self.loop.add_signal_handler(signal.SIGTERM, self._stop)
        self.loop.add_signal_handler(signal.SIGINT, self._stop)
        self.loop.add_signal_handler(signal.SIGQUIT, self._stop)
        self.loop.add_signal_handler(signal.SIGUSR1, self.log.reopen_files)

    def _stop(self) -> None:
        self.alive = False
        self.stopping.set()

    def later(self, work: Callable[[], Any]) -> asyncio.Future[Any]:
        """``work`` on the pool; counted, so a graceful stop can let it finish."""
        self.busy += 1
        future = self.pool.submit(work)
        future.add_done_callback(self._done)
        return future

    def _done(self, _: object) -> None:
        self.busy -= 1

    def run(self) -> None:
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.dispatcher.alloc.background.stop()  # the hand-off's unbegun work too
            self.loop.close()

    async def _serve(self) -> None:
        servers = [
            # types-gunicorn lists plain sockets; gunicorn hands its workers
            # gunicorn.sock wrappers, each with its socket in .sock.
            await self.loop.create_unix_server(lambda: _Connection(self), sock=s.sock)  # type: ignore[attr-defined]
            for s in self.sockets
        ]
        while self.alive and self.ppid == os.getppid():
            self.notify()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 1.0)
        for server in servers:
            server.close()
        deadline = self.loop.time() + self.cfg.graceful_timeout
        while self.busy and self.loop.time() < deadline:
            await asyncio.sleep(0.1)
