"""What the adapters ask of the Engine and the ledger, each question named for its answer.

The shim and the plugin hold neither the Engine client nor the ledger: they ask the
service these questions instead.  Each is the one call the adapter made itself before
(no extra Engine call or file read on a hot path); the image configs and the owners of
connections are kept here, once per process, as the shim kept them.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from functools import cached_property
from typing import Any

from allocator.core.api import labels
from allocator.core.judging import defaults, service_limits
from allocator.core.judging.service_marks import ChargeCheck, Signing
from allocator.core.judging.verdicts import Facts
from allocator.core.leases.inflight import Target
from allocator.core.leases.leases import Phase, State, StateError
from allocator.core.rules.policy import UNKNOWN, Owner, Refusal
from allocator.host import service_key
from allocator.host.config import Config
from allocator.host.creators import Creators
from allocator.host.engine import Engine, EngineError
from allocator.host.images import ImageConfigs
from allocator.host.ledger import Ledger
from allocator.host.owners import Owners, groups_of
from allocator.host.peers import Peer
from allocator.service.background import Background
from allocator.service.gather import Gatherer

log = logging.getLogger("gpu-alloc")


class Lookups:
    """The adapters' questions, each answered by the one call it needs."""

    def __init__(
        self,
        config: Config,
        engine: Engine | None,
        ledger: Ledger,
        gather: Gatherer,
        background: Background,
    ):
        self.config = config
        self.background = background
        self.engine = engine
        self.ledger = ledger
        self.gather = gather

    @property
    def has_engine(self) -> bool:
        """An Engine answers (without one, in tests of the ledger alone, nothing resolves
        a container reference)."""
        return self.engine is not None

    def target_of(self, ref: str) -> Target | None:
        """The container ``ref`` names now; None when it names none."""
        assert self.engine is not None
        return Target.of(self.engine.inspect(ref))

    def ids_named(self, name: str) -> list[str]:
        """The ids of the containers named exactly ``name``."""
        assert self.engine is not None
        return [c["Id"] for c in self.engine.containers(name=f"^/{name}$") if c.get("Id")]

    def signalled(self, container: str, since: float) -> bool:
        """Whether dockerd signalled ``container`` (a ``kill`` event) since ``since``."""
        assert self.engine is not None
        return self.engine.signalled(container, since)

    def image_config(self, image: str, fresh: bool = False) -> dict[str, Any] | None:
        """The image's ``Config`` (None: not pulled, or no Engine to ask); ``fresh``: read
        from the Engine now, whatever is kept."""
        return None if self._images is None else self._images.config(image, fresh=fresh)

    @cached_property
    def _images(self) -> ImageConfigs | None:
        if self.engine is None:
            return None
        return ImageConfigs(self.engine, start=self.background.add)

    def owner_of(self, peer: Peer | None) -> Owner:
        """The person behind a connection (`policy.NOBODY` without peer credentials)."""
        return self._owners.of(peer)

    @cached_property
    def _owners(self) -> Owners:
        return Owners(self.engine, self._lease_owner)

    def _lease_owner(self, container: str) -> tuple[int | None, str] | None:
        """(uid, user) of the live lease the ledger binds to ``container``, else of the
        creator the shim recorded for it (`record_creator`): asked once per container a
        connection comes from, never on a call that touches no GPU."""
        for lease in self.ledger.read().leases.values():
            if lease.container == container and lease.phase is Phase.BOUND and lease.owner:
                return lease.owner_uid, lease.owner
        return self.creators.of(container)

    def recorded_owner_of(self, container: str) -> str:
        """Whose gpu-alloc recorded ``container`` (a full id) to be: its lease's, else its
        creator's; empty when neither is known."""
        return (self._lease_owner(container) or (None, ""))[1]

    @cached_property
    def creators(self) -> Creators:
        return Creators(self.config.state_dir, self.gather.policy_in_force.lock_timeout)

    def forget_creator(self, container: str) -> None:
        """``container`` was destroyed: its creator's record goes (`record_creator`)."""
        try:
            self.creators.forget(container)
        except StateError as e:
            log.warning("container %s: its creator's record kept: %s", container[:12], e)

    def record_creator(self, peer: Peer | None, answer: bytes) -> None:
        """The container a create answered 201 with (``answer``, dockerd's body) is the
        asker's: a client inside it later is them, as in a leased container.  One write
        per create that holds no lease; a failure leaves the container's clients
        ``unknown``, never someone else."""
        try:
            cid = str(json.loads(answer).get("Id") or "")
        except (ValueError, AttributeError):
            return
        owner = self.owner_of(peer)
        if not cid or owner.user == UNKNOWN:
            return
        try:
            self.creators.record(cid, owner.uid, owner.user)
        except StateError as e:
            log.warning("container %s: its creator %s not recorded: %s", cid[:12], owner.user, e)

    def service_signing(self) -> Signing:
        """This host's key for the shim's mark on service writes, and what a service made
        on dockerd's own socket may do (`core.judging.service_marks`)."""
        if not self._service_key:
            self._service_key = service_key.load(self.config.state_dir)
        swarm = self.config.swarm
        return Signing(self._service_key, swarm.engine_socket_services, swarm.engine_socket_owner)

    _service_key = b""  # read once it exists

    def service_over_limit(
        self, owner: Owner, ref: str | None, spec: dict[str, Any]
    ) -> Refusal | None:
        """Why ``owner`` may not set ``spec`` on the service ``ref`` names (None: a create),
        by their limit on GPUs in swarm (`core.judging.service_limits`); None when it may.  A spec
        that reserves no GPU asks nothing: no Engine call."""
        kind = self.config.swarm.kind
        if not service_limits.per_task(spec, kind):
            return None
        assert self.engine is not None
        found = self.engine.service(ref) if ref is not None else None
        target = str(found.get("ID") or "") or None if found else None
        # Services without an owner label count for swarm.engine_socket_services' charge.
        unowned = self.config.swarm.engine_socket_owner
        stored = [
            (str(s.get("ID") or ""), s.get("Spec") or {})
            for s in self.engine.services("" if unowned else labels.OWNER)
        ]
        mine = [sp for _, sp in stored if service_limits.owner_of(sp, unowned) == owner.user]
        nodes = self._ready_nodes() if any(map(service_limits.is_global, [*mine, spec])) else 0
        before, after = service_limits.totals(
            stored, owner.user, target, spec, kind, nodes, unowned
        )
        return service_limits.refusal(owner, before, after, self.gather.rules)

    def charged_over_limit(self, check: ChargeCheck) -> Refusal | None:
        """`service_over_limit` for a GPU service made on dockerd's own socket, counted for
        the owner ``swarm.engine_socket_services: {charge: <owner>}`` names (their groups
        as NSS says now, for their groups' limits)."""
        owner = Owner(None, check.owner, groups_of(check.owner))
        refused = self.service_over_limit(owner, check.ref, dict(check.spec))
        if refused is None:
            return None
        why = (
            f"; a GPU service made on dockerd's own socket counts for {check.owner} "
            "(swarm.engine_socket_services: {charge: " + check.owner + "})"
        )
        return replace(refused, msg=refused.msg + why)

    def _ready_nodes(self) -> int:
        """The swarm's nodes a global service's task may run on now: ready and active."""
        assert self.engine is not None
        return sum(
            1
            for n in self.engine.nodes()
            if (n.get("Status") or {}).get("State") == "ready"
            and (n.get("Spec") or {}).get("Availability") == "active"
        )

    def plugin_judges(self, facts: Facts | None = None) -> bool:
        """Whether dockerd runs gpu-alloc's plugin, by ``facts`` or else as the Engine
        said lately (no call): it then judges every write on every socket."""
        view = self.gather.known_engine_view() if facts is None else facts.engine
        return view is not None and self.config.plugin.name in view.authz_plugins

    def ledger_state(self) -> State:
        """The ledger as it is now, read without the lock."""
        return self.ledger.read()

    def ledger_stamp(self) -> tuple[int, int, int] | None:
        """(mtime, size, inode) of the ledger's file: it moves at every write by any
        process; None while it cannot be read."""
        try:
            st = os.stat(self.ledger.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def start_failure_note(self, ref: str, message: str) -> str:
        """What to add to a start's failure ``message`` (`core.judging.defaults.start_note`): one
        inspect, on the failure path only."""
        try:
            info = self.engine.inspect(ref) if self.engine else None
        except EngineError:
            return ""
        return defaults.start_note(message, ((info or {}).get("Config") or {}).get("Labels"))
