"""The create flow: from a decoded create to its lease, its body, its grant and its end.

One part of the composed service (allocator/service/wiring.py); the shim calls it and keeps
the HTTP (reading the request, forwarding it, the status codes).  A create is judged
by the core (`verdicts.shim_ask`, through `Gatherer.decide`: on the facts at hand when
they suffice), checked against the policy and the image's CUDA, and leased by the
`LeaseBook`; refusals go to the audit trail here.  `granted` turns a lease into the body
dockerd gets and starts making the grant durable (its record on disk, its audit line)
on a thread of its own, while dockerd creates the container: the caller waits for
`Grant.durable` before it tells the client anything.  `settle` and `unsent` end the
transaction by the Engine's answer (`outcomes.create_outcome`), or the lack of one.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from allocator.core.access.facts import Need
from allocator.core.api import labels
from allocator.core.api.rewrite import rewrite
from allocator.core.grant_plan import LeaseRequest
from allocator.core.judging import cuda, defaults, services
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.leases import outcomes
from allocator.core.leases.leases import Lease, StateError
from allocator.core.machine.cpus import Placed, Resources, conflicts
from allocator.core.machine.inventory import InventoryError
from allocator.core.placement import Shortage
from allocator.core.rules import policy, sharing
from allocator.core.rules.sharing import ShareAsk
from allocator.host import metrics
from allocator.host.peers import Peer
from allocator.service.background import Background
from allocator.service.gather import Gatherer
from allocator.service.leasebook import LeaseBook
from allocator.service.lookups import Lookups
from allocator.service.recorder import Recorder

log = logging.getLogger("gpu-alloc")
Judged = tuple[decide.Facts, Ask | decide.Deny]  # a create's ask, and the facts it was made on
Leased = tuple[Lease, str] | Shortage | policy.Refusal | policy.Invalid
GRANT_THREADS = 16  # grants made durable at once (one per create in flight)
ONE_GPU = (
    f"a share ({sharing.SHARE} or {sharing.MEMORY}) is part of one GPU: ask with --gpus 1, "
    "not a count, 'all', named GPUs or a MIG profile"
)
NO_GPU = f"{ONE_GPU}; this create asks for no GPU"


@dataclass(frozen=True)
class Asked:
    """A create that asks for GPUs, and what `LeaseBook.lease` answered it.

    ``plugin_settles``: dockerd runs gpu-alloc's plugin, whose AuthZRes binds a 201.
    """

    req: LeaseRequest
    leased: Leased
    plugin_settles: bool


@dataclass(frozen=True)
class Grant:
    """A lease granted to a create: the body dockerd gets (``body``, with ``header`` as
    the lease header) and ``durable``, done once the grant is on disk and audited."""

    lease: Lease
    token: str
    body: dict[str, Any]
    header: str
    durable: Future[None]


class Creates:
    """The create flow over ``gather`` (facts), ``book`` (the lease), ``lookups`` (owner,
    image) and ``recorder`` (refusals)."""

    def __init__(
        self,
        gather: Gatherer,
        recorder: Recorder,
        book: LeaseBook,
        lookups: Lookups,
        background: Background,
        mps_dir: str = "",
    ):
        self.gather = gather
        self.mps_dir = mps_dir  # where shared GPUs' MPS directories are (allocator/service/mps.py)
        self.recorder = recorder
        self.book = book
        self.lookups = lookups
        # The grants' fsyncs, beside dockerd's create, on a pool of their own: never
        # queued behind the ledger work the shim's calls wait on.
        self._durability = background.pool("grant", GRANT_THREADS)

    def at_hand(self, spec: dict[str, Any]) -> Judged | None:
        """The create's ask by the facts at hand (`Gatherer.at_hand`), for an event loop;
        None when a fact is not at hand or the decision failed (`lease_for` decides it
        with the facts read)."""
        try:
            judged = self.gather.at_hand(partial(_judged, spec), decide.SHIM_ASK_READS)
        except Exception:  # any failure: decided (and reported) in full
            return None
        return None if isinstance(judged, Need) else judged

    def lease_for(
        self,
        spec: dict[str, Any],
        name: str,
        peer: Peer | None,
        want: policy.Wanted | policy.Invalid,
        profile: str,
        resources: Resources,
        known: Judged | None = None,
        waits: bool = False,
        share: ShareAsk | None = None,
    ) -> Asked | decide.Deny | policy.Invalid | None:
        """Everything from a decoded create to its lease: the ask (``known``, or decided
        here), the policy checks, the image's CUDA, the owner and the lease itself.  A
        refusal (`decide.Deny`, audited here; `policy.Invalid`: the request is malformed),
        None for a create that asks for no GPU, or what was leased (`Asked`).  ``waits``:
        the create waits in line if refused for now (`LeaseBook.lease`); ``share``: it
        asks for part of a shared GPU (allocator/core/rules/sharing.py)."""
        facts, ask = known or self.gather.decide(partial(_judged, spec), decide.SHIM_ASK_READS)
        if isinstance(ask, decide.Deny):
            self._refused(name, peer, ask.msg, ask.field)
            return ask
        ask = replace(ask, profile=profile)
        refused = _resources_refusal(resources, ask.any, spec)
        if refused:
            return policy.Invalid(refused)
        if not ask.any:
            if share is not None:
                return policy.Invalid(f"gpu-alloc refused the container create: {NO_GPU}")
            return None
        if share is not None:
            got = self._share(spec, ask, share)
            if not isinstance(got, ShareAsk):
                self._refused(name, peer, got.msg)
                return got
            share = got
        refused = self._cuda_refusal(spec, facts)
        if refused:
            self._refused(name, peer, refused)
            return decide.Deny(refused)
        if isinstance(want, policy.Invalid):
            return want
        owner = self.lookups.owner_of(peer)
        given = spec.get("Labels") or {}
        req = LeaseRequest(ask, name, owner, want, resources, given, share)
        leased = self.book.lease(req, durable=False, waits=waits)
        return Asked(req, leased, self.lookups.plugin_judges(facts))

    def granted(self, req: LeaseRequest, lease: Lease, token: str, spec: dict[str, Any]) -> Grant:
        """The create as dockerd gets it, for ``lease``: explicit GPUs, the lease label,
        the policy's defaults, the owner and the pool; its grant made durable meanwhile."""
        placed = Placed(lease.cpus, lease.mems, lease.memory)
        with_defaults = policy.with_defaults(spec, self.gather.rules)
        body = rewrite(
            with_defaults,
            lease.gpus,
            labels.lease_label(lease.id),
            req.ask.caps,
            placed,
            services.resource_variable(self.gather.config.swarm.kind),
        )
        body["Labels"][policy.OWNER] = policy.owner_label(req.owner)
        if added := defaults.added(spec, with_defaults):
            body["Labels"][labels.DEFAULTS] = added
        if lease.pool:
            body["Labels"][policy.POOL] = lease.pool
        if lease.share_of:
            try:
                body = self._shared(body, lease)
            except InventoryError:  # rare: the lease ends here, never granted uncapped
                self.book.release(lease.id, "its GPU is no longer shared")
                raise
        durable = self._durability.submit(self._finish, lease)
        return Grant(lease, token, body, labels.lease_header(lease.id, token), durable)

    def settle(self, grant: Grant, status: int, body: bytes | None) -> None:
        """The Engine answered the create with ``status``: bind the lease, or free it once
        no container has it (`outcomes.create_outcome`)."""
        if status != 201:
            log.info("lease %s: the Engine answered %s", grant.lease.id, status)
        self.book.settle(outcomes.create_outcome(grant.lease.id, grant.token, status, body))

    def unsent(self, grant: Grant) -> None:
        """The create never reached the Engine: its lease ends."""
        self.book.release(grant.lease.id)

    def _share(
        self, spec: dict[str, Any], ask: Ask, share: ShareAsk
    ) -> ShareAsk | policy.Invalid | decide.Deny:
        """A share asked as one GPU, with nothing of its own for MPS, run as the user
        the create or its image says (the uid rule compares them)."""
        if ask.every or ask.required or ask.count != 1 or ask.profile:
            return policy.Invalid(f"gpu-alloc refused the container create: {ONE_GPU}")
        hc = spec.get("HostConfig") or {}
        why = sharing.client_refusal(spec.get("Env") or (), str(hc.get("IpcMode") or ""))
        if why is not None:
            return decide.Deny(f"gpu-alloc refused the container create: {why}")
        image = self.lookups.image_config(str(spec.get("Image") or "")) or {}
        user = sharing.user_of(str(spec.get("User") or ""), str(image.get("User") or ""))
        return replace(share, user=user)

    def _shared(self, body: dict[str, Any], lease: Lease) -> dict[str, Any]:
        """A share's body: its GPU's MPS pipe, private /dev/shm and caps (none in
        timeslice mode), and the share it holds, as a label."""
        uuid = lease.gpus[0]
        gpu = next((g for g in self.gather.inventory().gpus if g.uuid == uuid), None)
        rule = sharing.rule_for(gpu, self.gather.rules.sharing) if gpu else None
        if gpu is None or rule is None:  # the policy changed since it was placed: no caps
            raise InventoryError(f"{uuid} is no longer shared (policy.sharing); ask again")
        hc = dict(body.get("HostConfig") or {})
        body["Env"] = [*body["Env"], *sharing.client_env(rule, gpu, lease.share_slots)]
        binds = sharing.client_binds(self.mps_dir, uuid, rule.mode)
        hc["Binds"] = [*(hc.get("Binds") or ()), *binds]
        body["HostConfig"] = hc
        body["Labels"][labels.SHARE] = f"{lease.share_slots}/{lease.share_of}"
        return body

    def _finish(self, lease: Lease) -> None:
        """The grant's record on disk and its audit line (its log line is the create's)."""
        try:
            self.book.finish_grant(lease)
        except StateError as e:  # granted all the same: only a power cut could lose it now
            log.error("lease %s: %s", lease.id, e)

    def _refused(self, name: str, peer: Peer | None, why: str, field: str = "") -> None:
        """A create refused by policy (a field no lease covers, the image's CUDA)."""
        metrics.request("policy")
        if field:
            metrics.denial(field)
        owner = self.lookups.owner_of(peer).user
        self.recorder.record("refusal", name=name, owner=owner, reason=why)

    def _cuda_refusal(self, spec: dict[str, Any], facts: decide.Facts) -> str | None:
        """nvidia-docker v1's check: the image's CUDA against the driver's, before leasing."""
        driver = facts.inventory.cuda_driver_version if facts.inventory else None
        image = str(spec.get("Image") or "")
        if driver is None or not image or not self.lookups.has_engine:
            return None
        env = spec.get("Env") or ()
        config = self.lookups.image_config(image)  # None: not pulled; dockerd answers that
        if cuda.refusal(driver, cuda.required(config or {}, env), image) is None:
            return None
        config = self.lookups.image_config(image, fresh=True)  # never refused by what was kept
        return cuda.refusal(driver, cuda.required(config or {}, env), image)


def _judged(spec: dict[str, Any], facts: decide.Facts) -> Judged:
    return facts, decide.shim_ask(spec, facts)


def _resources_refusal(want: Resources, gpus: bool, spec: dict[str, Any]) -> str | None:
    """Cores and memory come with GPUs only, and never over fields the client set."""
    if want.any and not gpus:
        return (
            "gpu-alloc refused the container create: io.gpu-alloc.request.cpus and "
            ".memory lease cores and memory near the container's GPUs, and it asks for "
            "none; add --gpus, or set --cpuset-cpus/--memory yourself"
        )
    return conflicts(want, spec.get("HostConfig"))
