"""Admission: settle the verdicts that need the ledger or the Engine into allow or deny.

One part of the composed service (allocator/service/wiring.py).  The pure core
(`allocator.core.judging.verdicts`) returns `NeedsLease`, `StartCheck`, `UpdateCheck`,
`PluginCheck`, `ChargeCheck` or `DoorCheck` when a verdict depends on what the ledger or the Engine
says now; the plugin and the shim both hand that to `Admission.resolve`, which reads it
and answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from allocator.core.access import plugins
from allocator.core.judging.service_marks import ChargeCheck
from allocator.core.judging.verdicts import (
    ALLOW,
    HINT,
    AllowStart,
    Decision,
    Deny,
    DoorCheck,
    NeedsLease,
    StartCheck,
    UpdateCheck,
)
from allocator.core.leases.inflight import Target
from allocator.core.leases.leases import Claim, Lease, StateError, admission
from allocator.core.machine import cpus
from allocator.core.rules.policy import Refusal
from allocator.host.engine import Engine
from allocator.host.ledger import Ledger
from allocator.service.doors import Doors
from allocator.service.restarts import Restarts

log = logging.getLogger("gpu-alloc")


class Admission:
    """``resolve`` a verdict; a start or a restart policy is judged by ``restarts``."""

    def __init__(
        self,
        engine: Engine | None,
        ledger: Ledger,
        restarts: Restarts,
        doors: Doors | None = None,
        charged: Callable[[ChargeCheck], Refusal | None] | None = None,
    ):
        self.engine = engine
        self.ledger = ledger
        self.restarts = restarts
        self.doors = doors  # exec and copies into owned containers (None: open to all)
        self.charged = charged  # a charged service's limit (`Lookups.charged_over_limit`)

    def resolve(self, decision: Decision) -> Decision:
        """Settle the decisions that need the ledger into `Allow` or `Deny`."""
        if isinstance(decision, NeedsLease):
            lease = self.ledger.lease(decision.lease_id)
            why = admission(lease, decision.lease_id, decision.token, decision.gpus)
            if why is not None:
                return Deny(
                    f"gpu-alloc refused the container create: {why}; {HINT}", "Config.Labels"
                )
            log.debug("allowed leased create (lease %s)", decision.lease_id)
            return ALLOW
        if isinstance(decision, StartCheck):
            info = self.engine.inspect(decision.ref) if self.engine else None
            why = self.restarts.start_refusal(decision.ref, info)
            return AllowStart(Target.of(info)) if why is None else Deny(why)
        if isinstance(decision, UpdateCheck):
            why = decision.restart and self.restarts.restart_refusal(decision.ref, decision.restart)
            why = why or (
                self.update_refusal(decision.ref, decision.fields) if decision.fields else None
            )
            return ALLOW if why is None else Deny(why)
        if isinstance(decision, DoorCheck):
            why = self.doors.refusal(decision) if self.doors is not None else None
            return ALLOW if why is None else Deny(why)
        if isinstance(decision, ChargeCheck):  # swarm.engine_socket_services: {charge: ...}
            if self.charged is None:  # nothing here counts a swarm's services
                return Deny("gpu-alloc refused the swarm service: its GPUs cannot be counted")
            refused = self.charged(decision)
            return ALLOW if refused is None else Deny(refused.msg)
        if isinstance(decision, plugins.PluginCheck):  # no Engine: no managed plugin
            why = plugins.refusal(decision, self.engine.plugins() if self.engine else [])
            return ALLOW if why is None else Deny(why)
        return decision

    def update_refusal(self, ref: str, fields: tuple[str, ...]) -> str | None:
        """``docker update`` may not move a lease's cores or memory: others lease the rest."""
        try:
            state = self.ledger.read()
        except StateError as e:  # cores and memory are not GPUs: keep updates working
            log.warning("update of %s allowed unchecked: %s", ref, e)
            return None
        every: tuple[Lease | Claim, ...] = (*state.leases.values(), *state.claims.values())
        if not any(h.cpus or h.memory for h in every):
            return None  # the common case: no CPU or memory lease, no Engine call
        held: Lease | Claim | None
        if self.engine is None:  # no Engine to resolve the name: the ledger's own words
            held = next((h for h in every if ref in (h.container, h.name)), None)
        else:
            info = self.engine.inspect(ref)
            held = (state.lease_of(info["Id"]) or state.claims.get(info["Id"])) if info else None
        owned = cpus.owned_fields(held.cpus, held.memory) if held else ()
        clash = [f for f in fields if f in owned]
        if not clash:
            return None
        how = f"lease {held.id}" if isinstance(held, Lease) else "adopted after a repair"
        return (
            f"gpu-alloc refused the container update: {', '.join(clash)} of {ref} were leased "
            f"with its GPUs ({how}), and other containers lease "
            "the cores and memory around them; recreate the container with other "
            "io.gpu-alloc.request.* labels instead"
        )
