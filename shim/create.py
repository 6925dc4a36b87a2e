"""The shim's interception: vet every device-relevant write, lease and rewrite creates.

Theory of operation
-------------------
The proxy hands over only requests that `routes.needs_check` flags (creates,
starts, updates, execs, plugin and volume installs, unknown writes); all else
is spliced through untouched.  Non-create writes get the plugin's own decision,
so a host running the shim alone is still protected.  A create is decoded the
way dockerd decodes it, stripped of client-supplied gpu-alloc labels, turned
into an `Ask`, leased under the ledger lock, rewritten to explicit UUIDs with a
single-use lease token label and a ``NVIDIA_VISIBLE_DEVICES`` guard, and only
then forwarded, as the canonical body that was checked.

After forwarding: 201 binds the lease to the container id; any other answer
frees it once the Engine confirms no container carries the lease (an error can
come after dockerd created it: a failed AuthZRes, say); no answer at all
(dropped, timed out, shim killed) leaves the lease pending until `reconcile`
finds the container by label or the deadline passes, so the GPUs are never
granted twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from urllib.parse import parse_qs, urlsplit

from allocator.core import cuda, gojson, labels
from allocator.core import verdicts as decide
from allocator.core.inventory import InventoryError
from allocator.core.leases import StateError
from allocator.core.placement import Shortage
from allocator.core.rewrite import rewrite, strip_labels
from allocator.core.routes import Check, RouteError, classify, needs_check
from allocator.host.engine import EngineError
from allocator.ops import status
from allocator.service import Allocator
from shim.framing import Request, Response, UpstreamError

log = logging.getLogger("gpu-alloc.shim")
STATUS_PATH = "/gpu-alloc/v1/status"  # not an Engine route: dockerd has no /gpu-alloc
_FAILURES = (StateError, EngineError, InventoryError)
Forward = Callable[[Request], Awaitable[Response]]


def error(status: int, message: str) -> Response:
    """An answer in the Engine's own error format, which the docker CLI prints."""
    body = json.dumps({"message": message}).encode()
    return Response(
        status, _REASONS.get(status, "Error"), [("Content-Type", "application/json")], body
    )


_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    409: "Conflict",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class CreateInterceptor:
    def __init__(self, allocator: Allocator):
        self.alloc = allocator

    def wants(self, method: str, target: str) -> bool:
        return needs_check(method, target) or (method == "GET" and target == STATUS_PATH)

    async def handle(self, request: Request, forward: Forward) -> Response:
        if request.method == "GET" and request.target == STATUS_PATH:
            return await self._status()
        try:
            route = classify(request.method, request.target)
        except RouteError as e:
            return error(400, f"gpu-alloc: {e}")
        try:
            if route.check is not Check.CREATE:
                facts = await asyncio.to_thread(self.alloc.facts)
                decision = decide.authz_request(request.method, request.target, request.body, facts)
                decision = await asyncio.to_thread(self.alloc.resolve, decision)
                if isinstance(decision, decide.Deny):
                    return error(403, decision.msg)
                return await forward(request)
            return await self._create(request, forward)
        except _FAILURES as e:
            return error(503, f"gpu-alloc cannot allocate right now: {e}")

    async def _create(self, request: Request, forward: Forward) -> Response:
        try:
            decoded = decide.decode_create(request.body)
            profile = labels.mig_profile(decoded.get("Labels"))
            spec = strip_labels(decoded)
        except gojson.BodyError as e:
            return error(400, f"gpu-alloc refused the container create: {e}")
        facts = await asyncio.to_thread(self.alloc.facts)
        ask = decide.shim_ask(spec, facts)
        if isinstance(ask, decide.Deny):
            return error(403, ask.msg)
        if not ask.any:
            return await forward(_with_body(request, rewrite(spec, (), None)))
        ask = replace(ask, profile=profile)
        refused = await asyncio.to_thread(self._cuda_refusal, spec, facts)
        if refused:
            return error(403, refused)
        name = _name(request.target)
        given = spec.get("Labels") or {}
        leased = await asyncio.to_thread(self.alloc.lease, ask, name, given)
        if isinstance(leased, Shortage):
            log.info("refused create %r: %s", name, leased.msg)
            return error(409, leased.msg)
        lease, token = leased
        label = labels.lease_label(lease.id, token)
        body = rewrite(spec, lease.gpus, label, ask.caps)
        log.info("lease %s: GPUs %s for create %r", lease.id, ",".join(lease.gpus), name)
        try:
            response = await forward(_with_body(request, body))
        except UpstreamError as e:
            if not e.maybe_delivered:
                await asyncio.to_thread(self.alloc.release, lease.id)
                return error(502, f"gpu-alloc: the Engine is not answering: {e}")
            log.warning("lease %s pending: create outcome unknown (%s)", lease.id, e)
            return error(
                504,
                f"gpu-alloc: the Engine did not answer the create ({e}); "
                "the container may exist: check 'docker ps -a'",
            )
        await asyncio.to_thread(self._settle, lease.id, label, response)
        return response

    async def _status(self) -> Response:
        """``gpu-alloc status`` for users who may use Docker but not read the state dir."""
        try:
            await asyncio.to_thread(self.alloc.reconcile)
            snap = await asyncio.to_thread(status.snapshot, self.alloc)
        except _FAILURES as e:
            return error(503, f"gpu-alloc status: {e}")
        body = status.render_json(snap).encode()
        return Response(200, "OK", [("Content-Type", "application/json")], body)

    def _cuda_refusal(self, spec: dict, facts: decide.Facts) -> str | None:
        """nvidia-docker v1's check: the image's CUDA against the driver's, before leasing."""
        driver = facts.inventory.cuda_driver_version
        image = str(spec.get("Image") or "")
        if driver is None or not image or self.alloc.engine is None:
            return None
        info = self.alloc.engine.image(image)  # None: not pulled; dockerd answers that
        need = cuda.required((info or {}).get("Config") or {}, spec.get("Env") or ())
        return cuda.refusal(driver, need, image)

    def _settle(self, lease_id: str, label: str, response: Response) -> None:
        if response.status == 201:
            try:
                container = json.loads(response.body)["Id"]
            except (ValueError, KeyError, TypeError):
                return  # created but unreadable: reconcile binds it by label
            self.alloc.settle(decide.Bind(lease_id, container))
        else:
            log.info("lease %s: the Engine answered %s", lease_id, response.status)
            self.alloc.settle_unanswered(lease_id, label)


def _name(target: str) -> str:
    return (parse_qs(urlsplit(target).query).get("name") or [""])[0]


def _with_body(request: Request, spec: dict) -> Request:
    return Request(request.method, request.target, request.headers, gojson.canonical(spec))
