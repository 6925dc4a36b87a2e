"""The shim's interception: vet every device-relevant write, lease and rewrite creates.

Theory of operation
-------------------
The proxy hands over only requests that `routes.needs_check` flags (creates,
starts, updates, execs, plugin and volume installs, unknown writes); all else
is spliced through untouched.  Non-create writes get the plugin's own decision,
so a host running the shim alone is still protected.  A create is decoded the
way dockerd decodes it and handed to the service (`allocator.service.intake.Intake`),
which decides everything else: the client's gpu-alloc labels read and stripped, the
ask, the lease (waiting in this shim's `Waitline` when the create asked to), a share's
MPS daemon, the body rewritten to explicit UUIDs with a lease label and a
``NVIDIA_VISIBLE_DEVICES`` guard, and the headers (the lease's token in
``X-Gpu-Alloc-Lease`` for the plugin, never on the container; any gpu-alloc header a
client sent is dropped).  This module keeps the HTTP: the request read, the status
codes, the forwarding, and the Engine's answer handed back to the service.

A start or restart goes on by the full id of the container judged, so no rename
or removal in between can make dockerd start another one.  Behind gpu-alloc's
plugin (dockerd names it among its authorization plugins) the shim forwards such
writes as they are: the plugin judges them by the same verdict on every socket.

After forwarding, `outcomes.create_outcome` (the rule the plugin's AuthZRes
follows too): 201 binds the lease to the container id; any other answer frees
it once the Engine confirms no container carries the lease (an error can come
after dockerd created it: a failed AuthZRes, say); no answer at all
(dropped, timed out, shim killed) leaves the lease pending until `reconcile`
finds the container by label or the deadline passes, so the GPUs are never
granted twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial

from allocator.core.api import errors, gojson, labels
from allocator.core.api.createbody import decode_create
from allocator.core.api.gojson import Body
from allocator.core.api.routes import SPLICED_DOORS, Check, Route, by_id, needs_check, spliced_door
from allocator.core.judging import service_limits, service_marks, services
from allocator.core.judging import verdicts as decide
from allocator.core.leases.leases import StateError
from allocator.core.machine.inventory import InventoryError
from allocator.host.cpus import TopologyError
from allocator.host.engine import EngineError
from allocator.service.intake import Refused
from allocator.service.wiring import Allocator
from shim.framing import PassOn, Request, Response, UpstreamError
from shim.waitline import Waitline

log = logging.getLogger("gpu-alloc.shim")
_FAILURES = (StateError, EngineError, InventoryError, TopologyError)
Forward = Callable[[Request], Awaitable[Response]]


def error(status: int, message: str) -> Response:
    """An answer in the Engine's own error format, which the docker CLI prints."""
    headers = [("Content-Type", errors.CONTENT_TYPE)]
    return Response(status, errors.reason(status), headers, errors.body(message))


class CreateInterceptor:
    def __init__(self, allocator: Allocator, waitline: Waitline | None = None):
        self.alloc = allocator
        self.waitline = waitline or Waitline(allocator)

    def wants(self, method: str, target: str) -> bool:
        if needs_check(method, target):
            return True
        # an attach, an exec's start, a rename: spliced unread while no container can be owned
        return not self.alloc.doors.open_to_all() and spliced_door(method, target)

    def stop(self) -> None:
        """The shim is stopping: waiting creates are answered, not left hanging."""
        self.waitline.stop()

    async def handle(self, request: Request, forward: Forward) -> Response | PassOn:
        route = decide.route_of(request.method, request.target)
        if isinstance(route, decide.Deny):
            return error(400, route.msg)
        try:
            if route.check in SPLICED_DOORS:
                return await self._door(route, request)
            if route.check is Check.SERVICE:
                owned = await asyncio.to_thread(self._service, route, request)
                if isinstance(owned, Response):
                    return owned
                request = owned
            if route.check in decide.DOORS and not self.alloc.doors.open_to_all():
                request = await asyncio.to_thread(self._asker_marked, route, request)
            if route.check is not Check.CREATE:
                if self._plugin_judges():
                    # by the same verdict, on every socket
                    return await self._started(route, await forward(request))
                decision = await asyncio.to_thread(self._judge, route, request)
                if isinstance(decision, decide.Deny):
                    return error(403, decision.msg)
                judged = _as_judged(request, route, decision)
                return await self._started(route, await forward(judged))
            return await self._create(request, forward)
        except _FAILURES as e:
            return error(503, f"gpu-alloc cannot allocate right now: {e}")

    async def _started(self, route: Route, response: Response) -> Response:
        """A start that failed on a limit gpu-alloc added says gpu-alloc added it."""
        if route.check not in (Check.START, Check.RESTART) or response.status < 400:
            return response
        message = errors.message_of(response.body)
        if message is None:
            return response
        note = await asyncio.to_thread(self.alloc.lookups.start_failure_note, route.name, message)
        return replace(response, body=errors.body(message + note)) if note else response

    def _plugin_judges(self) -> bool:
        """dockerd runs gpu-alloc's plugin (as the Engine said lately): it judges every
        write this shim would, starts included (and keeps a start's reference from
        moving), so judging here too would only double the inspect."""
        return self.alloc.lookups.plugin_judges()

    def _service(self, route: Route, request: Request) -> Request | Response:
        """A service as forwarded: its tasks pinned to NVIDIA_VISIBLE_DEVICES=void and
        DOCKER_RESOURCE_<KIND>=void (`services.pin`), labelled
        as the asker's, and within their limit on GPUs in swarm.  A body that cannot be
        read goes on as it is, to be refused by the judge."""
        try:
            spec = services.decode(request.body or b"")
        except gojson.BodyError:
            return request
        owner = self.alloc.lookups.owner_of(request.peer)
        pinned = services.pin(service_marks.stripped(spec), self.alloc.config.swarm.kind)
        spec = service_limits.owned(pinned, owner)
        ref = route.name if route.path.endswith("/update") else None
        refused = self.alloc.lookups.service_over_limit(owner, ref, spec)
        if refused is not None:
            log.info("refused service %r of %s: %s", spec.get("Name"), owner.user, refused.msg)
            return error(403, refused.msg)
        body = gojson.canonical(spec)
        key = self.alloc.lookups.service_signing().key
        headers = [
            (k, v) for k, v in request.headers if not k.lower().startswith(labels.HEADER_PREFIX)
        ]
        if key:
            headers.append((service_marks.HEADER, service_marks.mark(key, body)))
        return replace(request, headers=headers, body=body)

    async def _door(self, route: Route, request: Request) -> Response | PassOn:
        """An attach, an exec's start or a rename, read whole because a container can be
        owned: marked with who asks, judged (unless the plugin judges every socket's), and
        passed on to stream, a hijack and all."""
        marked = await asyncio.to_thread(self._asker_marked, route, request)
        if not self._plugin_judges():
            decision = await asyncio.to_thread(self._judge, route, marked)
            if isinstance(decision, decide.Deny):
                return error(403, decision.msg)
        return PassOn(marked)

    def _asker_marked(self, route: Route, request: Request) -> Request:
        """A way into a container as forwarded where a container can be owned: by the
        full id of the container its reference names now, any gpu-alloc header the
        client sent dropped, and marked with who asks (`allocator.service.doors.Doors`)."""
        doors = self.alloc.doors
        own = [(k, v) for k, v in request.headers if not k.lower().startswith(labels.HEADER_PREFIX)]
        target = doors.pinned(route, request.target)
        mark = doors.mark(request.method, target, request.peer)
        return replace(request, target=target, headers=[*own, mark] if mark else own)

    def _judge(self, route: Route, request: Request) -> decide.Decision:
        """The plugin's verdict on ``request`` as it goes on (its reference pinned to a
        full id where the shim pinned it), with facts read only where the check needs them."""
        again = decide.route_of(request.method, request.target)
        route = route if isinstance(again, decide.Deny) else again
        signing = self.alloc.lookups.service_signing() if route.check in decide.SIGNED else None
        headers = dict(reversed(request.headers))  # a name sent twice: the first, as Go reads
        asked = partial(
            decide.authz_request, route, request.method, request.target, Body(request.body),
            headers=headers, signing=signing,
        )  # fmt: skip
        decision = self.alloc.gather.decide(asked, decide.reads_facts(route))
        return self.alloc.admission.resolve(decision)

    async def _create(self, request: Request, forward: Forward) -> Response:
        """Bytes in, the service's answer (`Intake.create`) forwarded or refused."""
        try:
            decoded = decode_create(request.body)
        except gojson.BodyError as e:
            return error(400, f"gpu-alloc refused the container create: {e}")
        intake = self.alloc.intake
        got = await intake.create(
            decoded, request.method, request.target, request.peer, self.waitline,
            len(request.body or b""), request.gone,
        )  # fmt: skip
        if isinstance(got, Refused):
            return error(got.status, got.msg)
        own = [(k, v) for k, v in request.headers if not k.lower().startswith(labels.HEADER_PREFIX)]
        forwarded = Request(request.method, request.target, [*own, *got.headers], got.body)
        try:
            response = await forward(forwarded)
        except UpstreamError as e:
            if got.grant is None:
                raise
            await intake.lost(got, e.maybe_delivered)
            if not e.maybe_delivered:
                return error(502, f"gpu-alloc: the Engine is not answering: {e}")
            return error(
                504,
                f"gpu-alloc: the Engine did not answer the create ({e}); "
                "the container may exist: check 'docker ps -a'",
            )
        await intake.answered(got, request.peer, response.status, response.body)
        if got.grant is None:
            return response
        lease = got.grant.lease
        return replace(response, note=f"lease {lease.id}: GPUs {','.join(lease.gpus)}")


def _as_judged(request: Request, route: Route, decision: decide.Decision) -> Request:
    """A start goes on naming the container that was judged, by its full id: no rename or
    removal in between can make it start another one (allocator/core/leases/inflight.py)."""
    if isinstance(decision, decide.AllowStart) and decision.target is not None:
        return replace(request, target=by_id(request.target, route, decision.target.id))
    return request
