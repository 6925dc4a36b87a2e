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
header a client sent is dropped).  A create that surely asks for no GPU, by the facts
this process has cached, goes on from the event loop with the guard alone; every other
is judged on a thread, where the facts may be read, the lock waited for and a refusal
audited.

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
from urllib.parse import parse_qs, urlsplit

from allocator.core import cuda, defaults, errors, gojson, labels, outcomes, policy, services
from allocator.core import verdicts as decide
from allocator.core.ask import Ask
from allocator.core.cpus import Placed, Resources, conflicts
from allocator.core.createbody import decode_create
from allocator.core.holders import ago
from allocator.core.inventory import InventoryError
from allocator.core.leases import Lease, StateError
from allocator.core.placement import Shortage
from allocator.core.rewrite import rewrite, strip_labels
from allocator.core.routes import Check, Route, by_id, needs_check
from allocator.host import metrics
from allocator.host.cpus import TopologyError
from allocator.host.engine import EngineError
from allocator.host.peers import Peer
from allocator.service import Allocator, LeaseRequest
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

    def wants(self, method: str, target: str) -> bool:
        return needs_check(method, target)

    def stop(self) -> None:
        """The shim is stopping: waiting creates are answered, not left hanging."""
        self.waitline.stop()

    async def handle(self, request: Request, forward: Forward) -> Response:
        route = decide.route_of(request.method, request.target)
        if isinstance(route, decide.Deny):
            return error(400, route.msg)
        try:
            if route.check is Check.SERVICE:
                request = _pinned(request)
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
        note = await asyncio.to_thread(self.alloc.start_failure_note, route.name, message)
        return replace(response, body=errors.body(message + note)) if note else response

    def _plugin_judges(self) -> bool:
        """dockerd runs gpu-alloc's plugin (as the Engine said lately): it judges every
        write this shim would, starts included (and keeps a start's reference from
        moving), so judging here too would only double the inspect."""
        return self.alloc.plugin_judges()

    def _judge(self, route: Route, request: Request) -> decide.Decision:
        """The plugin's verdict, with facts read only where the check needs them."""
        facts = self.alloc.lazy_facts()
        decision = decide.authz_request(route, request.method, request.target, request.body, facts)
        return self.alloc.resolve(decision)

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
            given_labels if isinstance(given_labels, dict) else None, self.alloc.rules_in_force
        )
        if isinstance(wait, policy.Invalid):
            return error(400, wait.msg)
        spec = strip_labels(decoded)
        name = _name(request.target)
        known = self._at_hand(spec) if len(request.body) <= _AT_HAND_BODY else None
        if known and not resources.any and isinstance(known[1], Ask) and not known[1].any:
            return await forward(_with_body(request, rewrite(spec, (), None), None))
        got = await asyncio.to_thread(
            self._lease_for, spec, name, request.peer, want, profile, resources, known, bool(wait)
        )
        if isinstance(got, Response):
            return got
        if got is None:
            return await forward(_with_body(request, rewrite(spec, (), None), None))
        ask, owner, leased, plugin_settles = got
        if (
            isinstance(leased, Shortage | policy.Refusal)
            and leased.waitable
            and wait
            and isinstance(want, policy.Wanted)  # always, once a lease was asked
        ):
            req = LeaseRequest(ask, name, owner, want, resources)
            waited = await self._wait(req, wait, leased, request.gone)
            if isinstance(waited, Response):
                return waited
            leased = waited
            if isinstance(leased, Shortage | policy.Refusal):  # its time ran out
                await asyncio.to_thread(self.alloc.refused, leased, name, owner)
        if not isinstance(leased, tuple):
            log.info("refused create %r of %s: %s", name, owner.user, leased.msg)
            return error(_REFUSAL_STATUS[type(leased)], leased.msg)
        lease, token = leased
        label = labels.lease_label(lease.id)
        placed = Placed(lease.cpus, lease.mems, lease.memory)
        with_defaults = policy.with_defaults(spec, self.alloc.rules)
        body = rewrite(with_defaults, lease.gpus, label, ask.caps, placed)
        body["Labels"][policy.OWNER] = policy.owner_label(owner)
        if added := defaults.added(spec, with_defaults):
            body["Labels"][labels.DEFAULTS] = added
        if lease.pool:
            body["Labels"][policy.POOL] = lease.pool
        # The grant goes to disk and to the audit trail while dockerd creates the
        # container; the client hears of neither before both are done.
        synced = asyncio.ensure_future(asyncio.to_thread(self._finish, lease))
        try:
            response = await forward(
                _with_body(request, body, labels.lease_header(lease.id, token))
            )
        except UpstreamError as e:
            await synced
            if not e.maybe_delivered:
                await asyncio.to_thread(self.alloc.release, lease.id)
                return error(502, f"gpu-alloc: the Engine is not answering: {e}")
            log.warning("lease %s pending: create outcome unknown (%s)", lease.id, e)
            return error(
                504,
                f"gpu-alloc: the Engine did not answer the create ({e}); "
                "the container may exist: check 'docker ps -a'",
            )
        await synced
        if not (plugin_settles and response.status == 201):
            # Behind the plugin, its AuthZRes bound the lease before dockerd answered (and
            # a bind that failed there is reconcile's); other answers are settled here too.
            await asyncio.to_thread(self._settle, lease.id, token, response)
        return replace(response, note=f"lease {lease.id}: GPUs {','.join(lease.gpus)}")

    def _finish(self, lease: Lease) -> None:
        """The grant's record on disk and its audit line (its log line is the create's)."""
        try:
            self.alloc.finish_grant(lease)
        except StateError as e:  # granted all the same: only a power cut could lose it now
            log.error("lease %s: %s", lease.id, e)

    def _at_hand(self, spec: dict) -> tuple[decide.Facts, Ask | decide.Deny] | None:
        """The create's ask by the facts this process has at hand (None: a fact is not,
        or it failed; `_lease_for` then reads them).  One that asks for no GPU is
        forwarded from the event loop, without a thread hop; the rest take this ask to
        the thread, where a refusal is audited and a lease taken."""
        try:
            facts = self.alloc.cached_facts()
            return facts, decide.shim_ask(spec, facts)
        except Exception:  # Unasked, or any failure: decided (and reported) in full
            return None

    def _lease_for(
        self,
        spec: dict,
        name: str,
        peer: Peer | None,
        want: policy.Wanted | policy.Invalid,
        profile: str,
        resources: Resources,
        known: tuple[decide.Facts, Ask | decide.Deny] | None = None,
        waits: bool = False,
    ) -> Response | tuple[Ask, policy.Owner, Leased, bool] | None:
        """Everything from a decoded create to its lease, in one thread hop: the facts
        and the ask (unless ``known`` from the event loop), the policy checks, the image's
        CUDA, the owner and the lease itself.  An error answer, None for a create that
        asks for no GPU, or what was leased and whether dockerd runs gpu-alloc's plugin
        (which then binds a 201 itself)."""
        if known is None:
            facts = self.alloc.facts()
            known = facts, decide.shim_ask(spec, facts)
        facts, ask = known
        if isinstance(ask, decide.Deny):
            self._refused(name, peer, ask.msg, ask.field)
            return error(403, ask.msg)
        ask = replace(ask, profile=profile)
        refused = _resources_refusal(resources, ask.any, spec)
        if refused:
            return error(400, refused)
        if not ask.any:
            return None
        refused = self._cuda_refusal(spec, facts)
        if refused:
            self._refused(name, peer, refused)
            return error(403, refused)
        if isinstance(want, policy.Invalid):
            return error(400, want.msg)
        owner = self.alloc.owner_of(peer)
        given = spec.get("Labels") or {}
        leased = self.alloc.lease(
            ask, name, given, owner, want, resources, durable=False, waits=waits
        )
        return ask, owner, leased, self.alloc.plugin_judges(facts)

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

    def _refused(self, name: str, peer: Peer | None, why: str, field: str = "") -> None:
        """A create refused by policy (a field no lease covers, the image's CUDA)."""
        metrics.request("policy")
        if field:
            metrics.denial(field)
        self.alloc.record("refusal", name=name, owner=self.alloc.owner_of(peer).user, reason=why)

    def _cuda_refusal(self, spec: dict, facts: decide.Facts) -> str | None:
        """nvidia-docker v1's check: the image's CUDA against the driver's, before leasing."""
        driver = facts.inventory.cuda_driver_version if facts.inventory else None
        image = str(spec.get("Image") or "")
        if driver is None or not image or not self.alloc.has_engine:
            return None
        env = spec.get("Env") or ()
        config = self.alloc.image_config(image)  # None: not pulled; dockerd answers that
        if cuda.refusal(driver, cuda.required(config or {}, env), image) is None:
            return None
        config = self.alloc.image_config(image, fresh=True)  # never refused by what was kept
        return cuda.refusal(driver, cuda.required(config or {}, env), image)

    def _settle(self, lease_id: str, token: str, response: Response) -> None:
        if response.status != 201:
            log.info("lease %s: the Engine answered %s", lease_id, response.status)
        self.alloc.settle(outcomes.create_outcome(lease_id, token, response.status, response.body))


_REFUSAL_STATUS = {Shortage: 409, policy.Refusal: 403, policy.Invalid: 400}
# A create judged on the event loop at most: the CLI's and Compose's are a few KiB; a
# bigger one (up to dockerd's 4 MiB) is judged on the thread, where it blocks nobody.
_AT_HAND_BODY = 48 << 10
Leased = tuple[Lease, str] | Shortage | policy.Refusal | policy.Invalid


def _resources_refusal(want: Resources, gpus: bool, spec: dict) -> str | None:
    """Cores and memory come with GPUs only, and never over fields the client set."""
    if want.any and not gpus:
        return (
            "gpu-alloc refused the container create: io.gpu-alloc.request.cpus and "
            ".memory lease cores and memory near the container's GPUs, and it asks for "
            "none; add --gpus, or set --cpuset-cpus/--memory yourself"
        )
    return conflicts(want, spec.get("HostConfig"))


def _as_judged(request: Request, route: Route, decision: decide.Decision) -> Request:
    """A start goes on naming the container that was judged, by its full id: no rename or
    removal in between can make it start another one (allocator/core/inflight.py)."""
    if isinstance(decision, decide.AllowStart) and decision.target is not None:
        return replace(request, target=by_id(request.target, route, decision.target.id))
    return request


def _pinned(request: Request) -> Request:
    """A service as forwarded: its tasks' env pinned to NVIDIA_VISIBLE_DEVICES=void."""
    body = services.pinned_body(request.body)
    return request if body is None else replace(request, body=body)


def _name(target: str) -> str:
    return (parse_qs(urlsplit(target).query).get("name") or [""])[0]


def _with_body(request: Request, spec: dict, lease: str | None) -> Request:
    """The create as forwarded: the body checked, and gpu-alloc's own headers alone."""
    headers = [(k, v) for k, v in request.headers if not k.lower().startswith(labels.HEADER_PREFIX)]
    if lease is not None:
        headers.append((labels.LEASE_HEADER, lease))
    return Request(request.method, request.target, headers, gojson.canonical(spec))
