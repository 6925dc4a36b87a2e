"""MPS for shared GPUs: a control daemon runs on each shared GPU while it has shares out.

One part of the composed service (allocator/service/wiring.py), run by the shim.  The shim
supervises the daemons rather than a systemd template unit: it is the one that grants
shares, so it starts a GPU's daemon (`ensure`) before the create that needs it reaches
dockerd, and a failure is that create's 503 rather than a unit failing later, unseen.
A share ends wherever its container goes (the plugin, reconcile, the CLI), so the
daemons are kept level-triggered (`sync`, every `PERIOD` from the shim's background work):
under the ledger lock, a GPU with no share lease left has its daemon told to quit, so
no grant can slip in between the look and the stop; a live share whose daemon is not
running (after a reboot emptied the run directory) has it started again.  A ledger no
adopting reconcile has seen stops none: `gpu-alloc repair --reset` starts one afresh, and
until it adopts them the shares of running containers are in no lease.
"""

from __future__ import annotations

import logging
import threading

from allocator.core.leases.leases import Lease
from allocator.core.rules import sharing
from allocator.host.config import Config
from allocator.host.ledger import Ledger
from allocator.host.mps import Daemons, MpsError, modes_for
from allocator.service.gather import Gatherer

log = logging.getLogger("gpu-alloc")
PERIOD = 2.0  # seconds between looks for daemons whose last share ended


class Mps:
    def __init__(self, config: Config, ledger: Ledger, gather: Gatherer):
        self.config = config
        self.ledger = ledger
        self.gather = gather
        self.daemons = Daemons(config.mps.dir, config.mps.control, modes_for(config.gpus))
        self._lock = threading.Lock()  # one start or stop at a time

    def ensure(self, lease: Lease) -> str | None:
        """The daemon of a share lease's GPU runs; why not, when it cannot be started."""
        if not lease.share_of:
            return None
        uuid = lease.gpus[0]
        gpu = next((g for g in self.gather.inventory().gpus if g.uuid == uuid), None)
        rule = sharing.rule_for(gpu, self.gather.rules.sharing) if gpu else None
        if gpu is None or rule is None or rule.mode != sharing.MPS:
            return None
        with self._lock:
            if uuid in self.daemons.running():
                return None
            try:
                self.daemons.start(uuid, sharing.daemon_commands(rule, gpu))
            except MpsError as e:
                return f"gpu-alloc could not start the MPS daemon of {gpu.label()}: {e}"
        return None

    def sync(self) -> None:
        """Stop the daemons whose GPU has no share out any more, and start those a live
        share lacks (the run directory is gone after a reboot; its stopped containers
        keep their shares and may start again)."""
        with self._lock:
            running = self.daemons.running()
            if not running and not self.gather.rules.sharing:
                return  # a host that shares no GPU: not even the ledger is read
            shared = [le for le in self.ledger.read().leases.values() if le.share_of]
            if not running and not shared:
                return
            with self.ledger.locked():
                state = self.ledger.read()
                out = {u for le in state.leases.values() if le.share_of for u in le.gpus}
                if state.adopted_at is None:
                    out = running  # not yet adopted: its shares may run unrecorded
                for uuid in sorted(running - out):
                    self.daemons.stop(uuid)
        for lease in shared:
            if lease.gpus[0] not in running:
                why = self.ensure(lease)
                if why is not None:
                    log.warning("lease %s: %s", lease.id, why)
