"""The service: its parts, composed.  Each part owns one job and gets the parts it needs.

Theory of operation
-------------------
`Allocator` builds the parts and holds them; it decides nothing itself.  The adapters
(shim/, plugin/) and the CLI call the part that owns what they ask:

- ``gather`` (`Gatherer`, allocator/service/gather.py): the facts, each cached while it stays
  true: the GPU inventory (from the host's `DeviceSource`, allocator/host/devices/),
  the Engine's view, the policy in force, the GPUs' health.
- ``recorder`` (`Recorder`): the audit trail, and who hears that a lease ended.
- ``reservations`` (`Reservations`): GPUs reserved for a user or group in a window,
  and what they keep from everyone else's placement.
- ``placer`` (`Placer`): the grant plan's shell (core/grant_plan.py): reads, records.
- ``line`` (`Lineup`): the waiting line's grants and what it keeps from others.
- ``fair_share`` (`FairShare`): each owner's decayed GPU usage from its own record,
  which orders the line's equal priorities when policy.fair_share is set.
- ``reconciler`` (`Reconciler`): makes the ledger agree with what the Engine proves.
- ``restarts`` (`Restarts`): which starts may happen, asked or by a restart policy.
- ``book`` (`LeaseBook`): every change to a lease (grant, bind, release, settle).
- ``admission`` (`Admission`): settles a core verdict that needs the ledger or the
  Engine into allow or deny.
- ``lookups`` (`Lookups`): the adapters' questions of the Engine and the ledger.
- ``creates`` (`Creates`): the shim's create flow, from a decoded create to its lease,
  its rewritten body, its durable grant and its settlement.
- ``intake`` (`Intake`): the create as one call, from the decoded create and who asks
  to what the adapter forwards or the refusal (labels, waiting, MPS, the grant).
- ``timekeeper`` (`Timekeeper`): stops GPU containers past their time limit or idle
  too long (the shim runs it).
- ``mps`` (`Mps`): the MPS control daemon of each shared GPU with shares out (the shim
  runs it).
- ``notifier`` (`Notifier`): the notices the audit records make, kept in an outbox and
  sent to the configured webhooks and mail (the shim runs its worker).
- ``background`` (`Background`, allocator/service/background.py): every thread and pool the
  parts run, started, stopped and watched in one place (the shim starts it).

Every decision itself is made in allocator/core/; the parts read the facts, call it, and
apply what it returns.  No part calls back up into the one that called it.
"""

from __future__ import annotations

from allocator.host.audit import AuditLog
from allocator.host.config import Config, PolicyConfig
from allocator.host.engine import Engine
from allocator.host.filesystem import Host
from allocator.host.health import HealthFile
from allocator.host.held import HeldRecord
from allocator.host.ledger import Ledger
from allocator.service.admission import Admission
from allocator.service.background import Background
from allocator.service.creates import Creates
from allocator.service.doors import Doors
from allocator.service.fair_share import FairShare
from allocator.service.gather import Gatherer
from allocator.service.intake import Intake
from allocator.service.leasebook import LeaseBook
from allocator.service.lineup import Lineup
from allocator.service.lookups import Lookups
from allocator.service.mps import Mps
from allocator.service.notifier import Notifier
from allocator.service.placer import Placer
from allocator.service.reconciler import Reconciler
from allocator.service.recorder import Recorder
from allocator.service.reserving import Reservations
from allocator.service.restarts import Restarts
from allocator.service.timekeeper import Timekeeper


class Allocator:
    """The composition root: the host's stores and the parts built on them.

    ``engine`` None: no Engine to ask (tests of the ledger alone, `gpu-alloc health`);
    ``host``: the filesystem as access reads it (tests give tables).
    """

    def __init__(self, config: Config, engine: Engine | None = None, host: Host | None = None):
        self.config = config
        self.engine = engine
        self.background = Background()
        self.ledger = Ledger(config.state_dir, config.policy.lock_timeout)
        self.audit = AuditLog(config.state_dir)
        self.health = HealthFile(self.ledger)
        self.gather = Gatherer(config, engine, self.health, host)
        self.held = HeldRecord(config.state_dir)
        self.recorder = Recorder(self.audit, self.gather, self.held)
        self.health.listeners.append(self.recorder.health_turned)
        self.reservations = Reservations(config, self.ledger, self.gather, self.recorder)
        self.notifier = Notifier(
            config.notify, config.state_dir, self.ledger, self.gather, self.reservations
        )
        self.recorder.heard.append(self.notifier.heard)
        self.placer = Placer(config, self.gather, self.reservations)
        self.fair_share = FairShare(self.audit, self.held, self.background)
        self.line = Lineup(self.ledger, self.gather, self.placer, self.recorder, self.fair_share)
        self.reconciler = Reconciler(
            engine, self.ledger, self.gather, self.recorder, self.reservations
        )
        self.restarts = Restarts(
            engine, self.ledger, self.gather, self.recorder, self.reconciler, self.reservations
        )
        self.book = LeaseBook(
            engine,
            self.ledger,
            self.recorder,
            self.placer,
            self.line,
            self.reconciler,
            self.restarts,
        )
        self.lookups = Lookups(config, engine, self.ledger, self.gather, self.background)
        charged = self.lookups.charged_over_limit
        self.doors = Doors(engine, self.gather, self.lookups)
        self.admission = Admission(engine, self.ledger, self.restarts, self.doors, charged)
        self.creates = Creates(
            self.gather, self.recorder, self.book, self.lookups, self.background, config.mps.dir
        )
        self.timekeeper = Timekeeper(
            config, engine, self.ledger, self.gather, self.recorder, self.background, self.notifier
        )
        self.mps = Mps(config, self.ledger, self.gather)
        self.intake = Intake(
            config,
            self.gather,
            self.lookups,
            self.recorder,
            self.book,
            self.creates,
            self.mps,
            self.background,
        )
        self.gather.policy_listeners.append(self._policy_reloaded)

    def _policy_reloaded(self, policy: PolicyConfig) -> None:
        """``policy.lock_timeout`` reloads: the stores' locks wait that long from now on
        (every other policy key is read where it is used, from `Gatherer.policy`)."""
        self.ledger.lock.timeout = policy.lock_timeout
        self.lookups.creators.lock.timeout = policy.lock_timeout


def connect(config: Config) -> Allocator:
    """The service for this host: its config, and the Engine its config names."""
    return Allocator(config, Engine(config.engine.socket, config.engine.timeout))
