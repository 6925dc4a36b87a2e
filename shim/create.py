"""The shim's interception: vet every device-relevant write, lease and rewrite creates.

Theory of operation
-------------------
The proxy hands over only requests that `routes.needs_check` flags (creates,
starts, updates, execs, plugin and volume installs, unknown writes); all else
is spliced through untouched.  Non-create writes get the plugin's own decision,
so a host running the shim alone is still protected.  A create is decoded the
way dockerd decodes it, stripped of client-supplied gpu-alloc labels, turned
into an `Ask`, leased under the ledger lock, rewritten to explicit UUIDs with a
lease label and a ``NVIDIA_VISIBLE_DEVICES`` guard, and only then forwarded, as
the canonical body that was checked, with the lease's token in the
``X-Gpu-Alloc-Lease`` header for the plugin (never on the container; any such
header a client sent is dropped).  The create's transaction (its ask, checks, lease,
body, the grant made durable and the answer settled) is the library's
(`allocator.service.creates.Creates`); this module keeps the HTTP: the request read, the
status codes, the forwarding and the waiting line.  A create that surely asks for no
GPU, by the facts at hand, goes on from the event loop with the guard alone; every
other is judged on a thread, where the facts may be read, the lock waited for and a
refusal audited.

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

from allocator.core.api import errors, gojson, labels
from allocator.core.api.createbody import decode_create
from allocator.core.api.gojson import Body
from allocator.core.api.rewrite import rewrite, strip_labels
from allocator.core.api.routes import Check, Route, by_id, needs_check
from allocator.core.judging import service_limits, service_marks, services, socket_binds
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import Lease, StateError
from allocator.core.machine.inventory import InventoryError
from allocator.core.placement import Shortage
from allocator.core.rules import policy, sharing
from allocator.host.cpus import TopologyError
from allocator.host.engine import EngineError
from allocator.service.background import LEDGER_THREADS
from allocator.service.creates import Asked
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from shim.framing import Request, Response, UpstreamError
from shim.waitline import Gone, Stopping, Waitline

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
        self._swarm_variable = services.resource_variable(allocator.config.swarm.kind)
        # The lease, the one thread hop a GPU create waits on before dockerd sees it.
        self._leasing = allocator.background.handoff("lease", LEDGER_THREADS)

    def wants(self, method: str, target: str) -> bool:
        return needs_check(method, target)

    def _unleased(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The body of a create without GPUs: the guards alone (`rewrite`)."""
        return rewrite(spec, (), None, swarm_variable=self._swarm_variable)

    def stop(self) -> None:
        """The shim is stopping: waiting creates are answered, not left hanging."""
        self.waitline.stop()

    async def handle(self, request: Request, forward: Forward) -> Response:
        route = decide.route_of(request.method, request.target)
        if isinstance(route, decide.Deny):
            return error(400, route.msg)
        try:
            if route.check is Check.SERVICE:
                owned = await asyncio.to_thread(self._service, route, request)
                if isinstance(owned, Response):
                    return owned
                request = owned
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

    def _judge(self, route: Route, request: Request) -> decide.Decision:
        """The plugin's verdict, with facts read only where the check needs them."""
        signing = self.alloc.lookups.service_signing() if route.check in decide.SIGNED else None
        headers = dict(request.headers)
        asked = partial(
            decide.authz_request, route, request.method, request.target, Body(request.body),
            headers=headers, signing=signing,
        )  # fmt: skip
        decision = self.alloc.gather.decide(asked, decide.reads_facts(route))
        return self.alloc.admission.resolve(decision)

    async def _create(self, request: Request, forward: Forward) -> Response:
        try:
            decoded = decode_create(request.body)
        except gojson.BodyError as e:
            return error(400, f"gpu-alloc refused the container create: {e}")
        # Request labels are the client's words to gpu-alloc: read here, before every
        # io.gpu-alloc.* label the client set is stripped.
        given_labels = decoded.get("Labels") if isinstance(decoded, dict) else None
        want = policy.wanted(given_labels)
        profile = labels.mig_profile(given_labels)
        resources = labels.resources(given_labels)
        if isinstance(resources, str):
            return error(400, f"gpu-alloc refused the container create: {resources}")
        wait = policy.wait_of(
            given_labels if isinstance(given_labels, dict) else None,
            self.alloc.gather.rules_in_force,
        )
        if isinstance(wait, policy.Invalid):
            return error(400, wait.msg)
        share = sharing.share_ask(given_labels if isinstance(given_labels, dict) else None)
        if isinstance(share, str):
            return error(400, f"gpu-alloc refused the container create: {share}")
        spec = strip_labels(decoded)
        binder = await self._socket_binder(request)
        if binder:
            spec = socket_binds.labelled_as(spec, binder)
        name = _name(request.target)
        creates = self.alloc.creates
        known = creates.at_hand(spec) if len(request.body) <= _AT_HAND_BODY else None
        plain = not resources.any and share is None
        if known and plain and isinstance(known[1], Ask) and not known[1].any:
            return await self._plain(request, spec, forward)
        lease_for = partial(
            creates.lease_for,
            spec,
            name,
            request.peer,
            want,
            profile,
            resources,
            known,
            bool(wait),
            share,
        )
        got = await self._leasing.submit(lease_for)
        if got is None:
            return await self._plain(request, spec, forward)
        if not isinstance(got, Asked):
            return error(_REFUSAL_STATUS[type(got)], got.msg)
        req, leased = got.req, got.leased
        if isinstance(leased, Shortage | policy.Refusal) and leased.waitable and wait:
            waited = await self._wait(req, wait, leased, request.gone)
            if isinstance(waited, Response):
                return waited
            leased = waited
            if isinstance(leased, Shortage | policy.Refusal):  # its time ran out
                refused = self.alloc.recorder.refused
                await asyncio.to_thread(refused, leased, name, req.owner, wait)
        if not isinstance(leased, tuple):
            log.info("refused create %r of %s: %s", name, req.owner.user, leased.msg)
            return error(_REFUSAL_STATUS[type(leased)], leased.msg)
        if leased[0].share_of:  # a share's GPU has its MPS daemon, or its create cannot run
            failed = await asyncio.to_thread(self.alloc.mps.ensure, leased[0])
            if failed is not None:
                await asyncio.to_thread(self.alloc.book.release, leased[0].id, failed)
                return error(503, failed)
        grant = creates.granted(req, *leased, spec)
        # The grant goes to disk and to the audit trail while dockerd creates the
        # container; the client hears of neither before both are done.
        durable = asyncio.wrap_future(grant.durable)
        try:
            response = await forward(self._with_body(request, grant.body, grant.header))
        except UpstreamError as e:
            await durable
            if not e.maybe_delivered:
                await asyncio.to_thread(creates.unsent, grant)
                return error(502, f"gpu-alloc: the Engine is not answering: {e}")
            log.warning("lease %s pending: create outcome unknown (%s)", grant.lease.id, e)
            return error(
                504,
                f"gpu-alloc: the Engine did not answer the create ({e}); "
                "the container may exist: check 'docker ps -a'",
            )
        await durable
        if not (got.plugin_settles and response.status == 201):
            # Behind the plugin, its AuthZRes bound the lease before dockerd answered (and
            # a bind that failed there is reconcile's); other answers are settled here too.
            await asyncio.to_thread(creates.settle, grant, response.status, response.body)
        lease = grant.lease
        return replace(response, note=f"lease {lease.id}: GPUs {','.join(lease.gpus)}")

    async def _plain(self, request: Request, spec: dict, forward: Forward) -> Response:
        """A create that holds no GPU: forwarded with the void guard, and its creator
        recorded before the client hears of it (a client inside it is them)."""
        response = await forward(self._with_body(request, self._unleased(spec), None))
        if response.status == 201:
            record = self.alloc.lookups.record_creator
            await asyncio.to_thread(record, request.peer, response.body)
        return response

    async def _socket_binder(self, request: Request) -> str:
        """The asker, when ``policy.engine_socket_binds`` or ``policy.powers`` names them
        (`socket_binds`, `power_grants`): the plugin judges their create as theirs; empty,
        without a lookup, when the policy names nobody."""
        rules = self.alloc.gather.rules
        if not rules.grants_owners:
            return ""
        owner = await asyncio.to_thread(self.alloc.lookups.owner_of, request.peer)
        user, groups = owner.user, owner.groups
        trusted = rules.engine_socket_binds.allow(user, groups) or rules.powers.any_for(
            user, groups
        )
        return user if trusted else ""

    def _with_body(self, request: Request, spec: dict, lease: str | None) -> Request:
        """`_with_body`, marked for the plugin when the create is labelled as one whose
        owner may bind the Engine's socket."""
        forwarded = _with_body(request, spec, lease)
        if not socket_binds.labelled(spec):
            return forwarded
        key = self.alloc.lookups.service_signing().key
        if not key:  # unmarked: the plugin refuses the label (fail closed)
            return forwarded
        mark = socket_binds.mark(key, request.method, request.target, forwarded.body or b"")
        return replace(forwarded, headers=[*forwarded.headers, (socket_binds.HEADER, mark)])

    async def _wait(
        self,
        req: LeaseRequest,
        seconds: float,
        refused: Shortage | policy.Refusal,
        gone: asyncio.Event | None,
    ) -> tuple[Lease, str] | Shortage | policy.Refusal | Response:
        """Wait in line for the lease; the refusal, saying how long, when time runs out."""
        log.info(
            "create %r of %s waits up to %ss: %s", req.name, req.owner.user, seconds, refused.msg
        )
        started = time.monotonic()
        try:
            got = await self.waitline.wait(req, seconds, gone)
        except Stopping as e:
            return error(503, str(e))
        except Gone:
            return error(503, "gpu-alloc: the client left the queue")
        if got is not None:
            return got
        # Its whole time ran out (an event loop's timer may fire a hair early: say what it
        # asked for, not 1s for 1.999).
        took = max(seconds, time.monotonic() - started)
        waited = f" (waited {ago(took)} in line, the most it asked for)"
        return replace(refused, msg=refused.msg + waited)


_REFUSAL_STATUS = {Shortage: 409, policy.Refusal: 403, policy.Invalid: 400, decide.Deny: 403}
# A create judged on the event loop at most: the CLI's and Compose's are a few KiB; a
# bigger one (up to dockerd's 4 MiB) is judged on the thread, where it blocks nobody.
_AT_HAND_BODY = 48 << 10


def _as_judged(request: Request, route: Route, decision: decide.Decision) -> Request:
    """A start goes on naming the container that was judged, by its full id: no rename or
    removal in between can make it start another one (allocator/core/leases/inflight.py)."""
    if isinstance(decision, decide.AllowStart) and decision.target is not None:
        return replace(request, target=by_id(request.target, route, decision.target.id))
    return request


def _name(target: str) -> str:
    return (parse_qs(urlsplit(target).query).get("name") or [""])[0]


def _with_body(request: Request, spec: dict, lease: str | None) -> Request:
    """The create as forwarded: the body checked, and gpu-alloc's own headers alone."""
    headers = [(k, v) for k, v in request.headers if not k.lower().startswith(labels.HEADER_PREFIX)]
    if lease is not None:
        headers.append((labels.LEASE_HEADER, lease))
    return Request(request.method, request.target, headers, gojson.canonical(spec))
