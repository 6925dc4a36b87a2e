"""The shim's admin endpoints: the read models, for users who may use Docker but not
read the state dir.

``GET /gpu-alloc/v1/status``, ``queue``, ``gpus``, ``reservations``, ``explain`` and
``report`` are no Engine routes (dockerd has no /gpu-alloc): the shim answers them itself,
from allocator/service/views/, as the JSON the CLI's ``--json`` prints.  Explain answers
for the peer that asks, never for another user; report gives the peer its own rows only.
Every other request goes on to the create interception.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from allocator.core.api.routes import needs_check, spliced_door
from allocator.core.leases.leases import StateError
from allocator.core.machine.inventory import InventoryError
from allocator.host.cpus import TopologyError
from allocator.host.engine import EngineError
from allocator.service.views import explain, report, reservations, status, wire
from allocator.service.views.gpus import LiveView
from allocator.service.wiring import Allocator
from shim.create import CreateInterceptor, Forward, error
from shim.framing import PassOn, Request, Response
from shim.waitline import Waitline

_FAILURES = (StateError, EngineError, InventoryError, TopologyError)


class Admin:
    """The shim's interceptor: its own paths here, the rest to ``creates``."""

    def __init__(
        self, allocator: Allocator, live: LiveView, waitline: Waitline, creates: CreateInterceptor
    ):
        self.alloc = allocator
        self.doors = allocator.doors
        self.live = live
        self.waitline = waitline
        self.creates = creates

    def wants(self, method: str, target: str) -> bool:
        # Called on every request head: the creates' own test inlined, as cheap as before.
        return (
            needs_check(method, target)
            or (method == "GET" and _serves(target))
            or (not self.doors.open_to_all() and spliced_door(method, target))
        )

    def stop(self) -> None:
        self.creates.stop()

    def handle(self, request: Request, forward: Forward) -> Coroutine[Any, Any, Response | PassOn]:
        """The creates' own coroutine for theirs (no extra frame on their path)."""
        if request.method != "GET" or not _serves(request.target):
            return self.creates.handle(request, forward)
        return self._answer(request)

    async def _answer(self, request: Request) -> Response:
        try:
            if request.target == wire.STATUS_PATH:
                return _json(await asyncio.to_thread(self._status))
            if request.target == wire.QUEUE_PATH:
                return _json({"queue": await asyncio.to_thread(self.waitline.snapshot)})
            if request.target == wire.GPUS_PATH:
                return _json(await asyncio.to_thread(self.live.snapshot))
            if request.target == wire.RESERVATIONS_PATH:
                found = await asyncio.to_thread(reservations.listing, self.alloc, time.time())
                return _json({"reservations": found})
            if request.target.partition("?")[0] == wire.REPORT_PATH:
                return await asyncio.to_thread(self._report, request)
            return _json(await asyncio.to_thread(self._explain, request))
        except _FAILURES as e:
            return error(503, f"gpu-alloc {_name(request.target)}: {e}")

    def _status(self) -> dict:
        """``gpu-alloc status``, reconciled first, with the queue this shim holds."""
        self.alloc.reconciler.reconcile()
        snap = status.snapshot(self.alloc, self.live)
        snap["queue"] = self.waitline.snapshot()
        return snap

    def _explain(self, request: Request) -> dict:
        """``gpu-alloc explain`` for the peer itself; "short" is as of now."""
        asked_gpus, pairs = wire.explain_request(request.target)
        self.alloc.reconciler.reconcile()
        who = self.alloc.lookups.owner_of(request.peer)
        return explain.explain(self.alloc, None, asked_gpus, pairs, who)

    def _report(self, request: Request) -> Response:
        """``gpu-alloc report`` with the peer's own rows only, whoever they are."""
        try:
            since, until, by = wire.report_request(request.target)
            who = self.alloc.lookups.owner_of(request.peer).user
            got = report.build(self.alloc.config.state_dir, time.time(), since, until, by, who)
        except ValueError as e:
            return error(400, f"gpu-alloc report: {e}")
        return _json(got)


def _serves(target: str) -> bool:
    return target in wire.PATHS or target.partition("?")[0] in (
        wire.EXPLAIN_PATH,
        wire.REPORT_PATH,
    )


def _name(target: str) -> str:
    """The view's name as the CLI says it: ``status``, ``queue``, ``gpus``, ``explain``."""
    return target.partition("?")[0].rsplit("/", 1)[-1]


def _json(view: object) -> Response:
    body = wire.encode(view).encode()
    return Response(200, "OK", [("Content-Type", "application/json")], body)
