"""The create as one service call: a decoded create and who asks in, what to forward or
the refusal out.

Theory of operation
-------------------
An adapter reads the bytes, forwards what it is told and answers; every decision in
between is made behind `Intake.create`, so a new kind of request changes the service,
never the adapter.  In order: the client's gpu-alloc labels are read (the GPUs it
wants, a MIG profile, cores and memory, how long it may wait, a share) before they are
stripped; the create is labelled as one whose owner may bind the Engine's socket
(`socket_binds`); a create that surely holds no GPU, by the facts at hand, goes on from
the event loop with the guard alone; every other is leased on a thread of the lease
hand-off (`Creates.lease_for`, which audits its refusals).  A create refused for now
that asked to wait waits in the caller's `Line`; a share's GPU gets its MPS daemon
(`Mps.ensure`) or the lease ends and the create is refused; and the lease becomes the
body and headers dockerd gets (`Creates.granted`).

After the Engine's answer the caller hands the `Approved` back: `answered` binds or
frees its lease (`Creates.settle`), or records the creator of a create that holds no
GPU; `lost` settles a create whose answer never came.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from allocator.core.access import socket_binds
from allocator.core.api import gojson, labels
from allocator.core.judging import services
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.judging.rewrite import rewrite, strip_labels
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import Lease
from allocator.core.machine import cpus
from allocator.core.placement import Shortage
from allocator.core.rules import policy, sharing
from allocator.host.config import Config
from allocator.host.peers import Peer
from allocator.service.background import LEDGER_THREADS, Background
from allocator.service.creates import Asked, Creates, Grant
from allocator.service.gather import Gatherer
from allocator.service.leasebook import LeaseBook
from allocator.service.lookups import Lookups
from allocator.service.mps import Mps
from allocator.service.placer import LeaseRequest
from allocator.service.recorder import Recorder

log = logging.getLogger("gpu-alloc")
REFUSED = "gpu-alloc refused the container create"
# A create judged on the event loop at most: the CLI's and Compose's are a few KiB; a
# bigger one (up to dockerd's 4 MiB) is judged on the thread, where it blocks nobody.
AT_HAND_BODY = 48 << 10
_STATUS = {Shortage: 409, policy.Refusal: 403, policy.Invalid: 400, decide.Deny: 403}


class Stopping(Exception):
    """The adapter is stopping: a waiting create is answered 503 instead of hanging."""


class Gone(Exception):
    """The waiting client closed its connection."""


class Line(Protocol):
    """The waiting line a create refused for now waits in (the shim's `Waitline`)."""

    async def wait(
        self, req: LeaseRequest, seconds: float, gone: asyncio.Event | None = None
    ) -> tuple[Lease, str] | None:
        """The lease once granted; None when ``seconds`` ran out (raises `Gone`,
        `Stopping`)."""


@dataclass(frozen=True)
class Refused:
    """A create refused: the HTTP status and the message, in the Engine's words."""

    status: int
    msg: str


@dataclass(frozen=True)
class Approved:
    """A create to forward: ``body``, the canonical bytes, with ``headers``, gpu-alloc's
    own (every other gpu-alloc header the client sent is dropped); ``grant``, the lease
    it holds (None: no GPU); ``plugin_settles``: the plugin's AuthZRes binds a 201."""

    body: bytes
    headers: tuple[tuple[str, str], ...]
    grant: Grant | None = None
    plugin_settles: bool = False


class Intake:
    """The create call over the parts that decide it (module docstring)."""

    def __init__(
        self,
        config: Config,
        gather: Gatherer,
        lookups: Lookups,
        recorder: Recorder,
        book: LeaseBook,
        creates: Creates,
        mps: Mps,
        background: Background,
    ):
        self.gather = gather
        self.lookups = lookups
        self.recorder = recorder
        self.book = book
        self.creates = creates
        self.mps = mps
        self._swarm_variable = services.resource_variable(config.swarm.kind)
        # The lease, the one thread hop a GPU create waits on before dockerd sees it.
        self._leasing = background.handoff("lease", LEDGER_THREADS)

    async def create(
        self,
        decoded: Any,
        method: str,
        target: str,
        peer: Peer | None,
        line: Line,
        size: int = 0,
        gone: asyncio.Event | None = None,
    ) -> Approved | Refused:
        """The create ``decoded`` from its body (``size`` bytes), sent by ``peer`` as
        ``method`` ``target``: what to forward, or why not."""
        given = decoded.get("Labels") if isinstance(decoded, dict) else None
        given = given if isinstance(given, dict) else None
        # Request labels are the client's words to gpu-alloc: read before every
        # io.gpu-alloc.* label the client set is stripped.
        want = policy.wanted(given)
        profile = labels.mig_profile(given)
        resources = cpus.resources(given)
        if isinstance(resources, str):
            return Refused(400, f"{REFUSED}: {resources}")
        wait = policy.wait_of(given, self.gather.rules_in_force)
        if isinstance(wait, policy.Invalid):
            return Refused(400, wait.msg)
        share = sharing.share_ask(given)
        if isinstance(share, str):
            return Refused(400, f"{REFUSED}: {share}")
        spec = strip_labels(decoded)
        binder = await self._socket_binder(peer)
        if binder:
            spec = socket_binds.labelled_as(spec, binder)
        name = (parse_qs(urlsplit(target).query).get("name") or [""])[0]
        known = self.creates.at_hand(spec) if size <= AT_HAND_BODY else None
        plain = not resources.any and share is None
        if known and plain and isinstance(known[1], Ask) and not known[1].any:
            return self._forwarded(method, target, self._unleased(spec))
        lease_for = partial(
            self.creates.lease_for,
            spec, name, peer, want, profile, resources, known, bool(wait), share,
        )  # fmt: skip
        got = await self._leasing.submit(lease_for)
        if got is None:
            return self._forwarded(method, target, self._unleased(spec))
        if not isinstance(got, Asked):
            return Refused(_STATUS[type(got)], got.msg)
        leased = got.leased
        if isinstance(leased, Shortage | policy.Refusal) and leased.waitable and wait:
            waited = await self._wait(got.req, wait, leased, line, gone)
            if isinstance(waited, Refused):
                return waited
            leased = waited
        if not isinstance(leased, tuple):
            log.info("refused create %r of %s: %s", name, got.req.owner.user, leased.msg)
            return Refused(_STATUS[type(leased)], leased.msg)
        if leased[0].share_of:  # a share's GPU has its MPS daemon, or its create cannot run
            failed = await asyncio.to_thread(self.mps.ensure, leased[0])
            if failed is not None:
                await asyncio.to_thread(self.book.release, leased[0].id, failed)
                return Refused(503, failed)
        grant = self.creates.granted(got.req, *leased, spec)
        return replace(
            self._forwarded(method, target, grant.body, grant.header),
            grant=grant,
            plugin_settles=got.plugin_settles,
        )

    async def answered(
        self, approved: Approved, peer: Peer | None, status: int, body: bytes
    ) -> None:
        """The Engine answered ``status``: the grant, durable first (the client hears
        nothing before it is), bound or freed; a create without GPUs that was created
        has its creator recorded (a client inside it is them)."""
        grant = approved.grant
        if grant is None:
            if status == 201:
                await asyncio.to_thread(self.lookups.record_creator, peer, body)
            return
        await asyncio.wrap_future(grant.durable)
        if not (approved.plugin_settles and status == 201):
            # Behind the plugin, its AuthZRes bound the lease before dockerd answered (and
            # a bind that failed there is reconcile's); other answers are settled here.
            await asyncio.to_thread(self.creates.settle, grant, status, body)

    async def lost(self, approved: Approved, delivered: bool) -> None:
        """No answer came: a create that never left frees its lease; one that may have
        reached dockerd keeps it pending, for reconcile to find by label."""
        grant = approved.grant
        if grant is None:
            return
        await asyncio.wrap_future(grant.durable)
        if not delivered:
            await asyncio.to_thread(self.creates.unsent, grant)
        else:
            log.warning("lease %s pending: the create's outcome is unknown", grant.lease.id)

    def _unleased(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The body of a create without GPUs: the guards alone (`rewrite`)."""
        return rewrite(spec, (), None, swarm_variable=self._swarm_variable)

    async def _socket_binder(self, peer: Peer | None) -> str:
        """The asker, when ``policy.engine_socket_binds`` or ``policy.powers`` names them
        (`socket_binds`, `power_grants`): the plugin judges their create as theirs; empty,
        without a lookup, when the policy names nobody."""
        rules = self.gather.rules
        if not rules.grants_owners:
            return ""
        owner = await asyncio.to_thread(self.lookups.owner_of, peer)
        user, groups = owner.user, owner.groups
        trusted = rules.engine_socket_binds.allow(user, groups) or rules.powers.any_for(
            user, groups
        )
        return user if trusted else ""

    def _forwarded(
        self, method: str, target: str, spec: dict[str, Any], lease: str | None = None
    ) -> Approved:
        """The create as forwarded, with its lease header, and marked for the plugin when
        it is labelled as one whose owner may bind the Engine's socket (unmarked, when
        there is no key: the plugin then refuses the label, failing closed)."""
        body = gojson.canonical(spec)
        headers = [(labels.LEASE_HEADER, lease)] if lease is not None else []
        key = self.lookups.service_signing().key if socket_binds.labelled(spec) else b""
        if key:
            headers.append((socket_binds.HEADER, socket_binds.mark(key, method, target, body)))
        return Approved(body, tuple(headers))

    async def _wait(
        self,
        req: LeaseRequest,
        seconds: float,
        refused: Shortage | policy.Refusal,
        line: Line,
        gone: asyncio.Event | None,
    ) -> tuple[Lease, str] | Refused:
        """Wait in line for the lease; the refusal, audited and saying how long, when
        time runs out."""
        log.info(
            "create %r of %s waits up to %ss: %s", req.name, req.owner.user, seconds, refused.msg
        )
        started = time.monotonic()
        try:
            got = await line.wait(req, seconds, gone)
        except Stopping as e:
            return Refused(503, str(e))
        except Gone:
            return Refused(503, "gpu-alloc: the client left the queue")
        if got is not None:
            return got
        # Its whole time ran out (an event loop's timer may fire a hair early: say what it
        # asked for, not 1s for 1.999).
        took = max(seconds, time.monotonic() - started)
        refused = replace(
            refused, msg=f"{refused.msg} (waited {ago(took)} in line, the most it asked for)"
        )
        await asyncio.to_thread(self.recorder.refused, refused, req.name, req.owner, seconds)
        log.info("refused create %r of %s: %s", req.name, req.owner.user, refused.msg)
        return Refused(_STATUS[type(refused)], refused.msg)
