"""The notifier: turns audit records into notices (allocator/core/timing/notices.py), keeps them
in the outbox (allocator/host/outbox.py) and sends them from a background worker.

`heard` is the recorder's listener: it runs where the record was written (a grant from
the line, the timekeeper's stop) and only makes the notice and puts it in the outbox,
so a sink that is down or slow never holds up a create or a stop.  `drain`, the shim's
``notify`` worker, sends what is due: each sink of each notice once, a failed one
again after its backoff (5 s, doubling, at most an hour; a sink that failed is not
tried again in the same round, its other notices wait as long); a notice leaves the outbox
when every sink took it, so a shim restart, or a sink down for a day, loses none.
Each round also makes the notices of the reservations about to begin or begun, and the
timekeeper's look those of the time limits run to 80 % and 90 % (`time_warning`) and of
the containers idle most of ``policy.reclaim_idle_after`` (`idle_warning`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from allocator.core.leases.events import rfc3339
from allocator.core.leases.leases import Lease
from allocator.core.machine.inventory import InventoryError
from allocator.core.timing import notices
from allocator.core.timing.notices import Notice
from allocator.host import ledger, metrics, sinks
from allocator.host.config_notify import NotifyConfig
from allocator.host.ledger import Ledger
from allocator.host.outbox import Outbox
from allocator.service.gather import Gatherer
from allocator.service.reserving import Reservations

log = logging.getLogger("gpu-alloc.notify")
MAIL = "mail"
IDLE_WAIT, BUSY_WAIT = 30.0, 1.0  # seconds between rounds: nothing due, or just woken


class Notifier:
    """``gather``: the GPUs' indices, to name them; ``reservations``: those to tell of."""

    def __init__(
        self,
        config: NotifyConfig,
        state_dir: str,
        book: Ledger,
        gather: Gatherer,
        reservations: Reservations,
    ) -> None:
        self.config = config
        self.outbox = Outbox(state_dir)
        self.ledger = book
        self.gather = gather
        self.reservations = reservations
        self.wake = threading.Event()  # set when a notice is put: the worker sends it now

    def heard(self, record: dict[str, object]) -> None:
        """An audit record written: its notices into the outbox.  Never raises: a notice
        that cannot be kept is logged, and the decision stands."""
        if not self.config.on:
            return
        try:
            holders = self._holders() if record.get("event") == "health" else None
            made = notices.from_record(record, self.config.choices, holders)
            if sum(self.outbox.put(n, self.sinks_of(n)) for n in made):
                self.wake.set()
        except Exception:
            log.exception("notice of %s not kept", record.get("event"))

    def time_warning(self, lease: Lease, share: float) -> None:
        """The timekeeper's look found ``lease`` past ``share`` of its time limit."""
        if self.config.on:
            self._keep(lambda: notices.time_warning(lease, share, self.config.choices))

    def idle_warning(self, lease: Lease, since: float, after: float) -> None:
        """The timekeeper's look found ``lease``'s GPUs unused since ``since``, most of
        ``after``."""
        if self.config.on:
            self._keep(lambda: notices.idle_warning(lease, since, after, self.config.choices))

    def sinks_of(self, notice: Notice) -> list[str]:
        """The sinks a notice goes to: every webhook, and mail when it has an address."""
        names = [f"webhook-{i}" for i in range(len(self.config.webhooks))]
        return names + ([MAIL] if self.config.smtp is not None and notice.to else [])

    def drain(self, now: float) -> float:
        """The reservations' notices due at ``now`` into the outbox, then send every
        sink's part due; seconds until the next round."""
        self.wake.clear()
        self._reservations(now)
        failed: dict[str, int] = {}
        down: dict[str, str] = {}  # sink -> its error this round: not tried again in it
        waits = [IDLE_WAIT]
        for entry in self.outbox.entries():
            for sink in entry.due(now):
                error = down.get(sink) or self.send(sink, entry.notice)
                if error is not None and sink not in down:
                    down[sink] = error
                    failed[sink] = failed.get(sink, 0) + 1
                    log.warning("notice %s to %s not sent: %s", entry.notice.id, sink, error)
                self.outbox.settle(entry.notice.id, sink, error, now)
        for entry in self.outbox.entries():
            waits += [s.next_at - now for s in entry.sinks.values() if not s.sent]
        self.outbox.prune(now)
        metrics.outbox(len(self.outbox.entries()), failed)
        return max(BUSY_WAIT, min(waits))

    def run(self, stop: threading.Event) -> None:
        """The ``notify`` worker: a round, then wait for its answer or a new notice."""
        while not stop.is_set():
            wait = self.drain(ledger.now())
            self.wake.wait(wait)

    def send(self, sink: str, notice: Notice) -> str | None:
        """One try of one sink; None: sent, else why not."""
        try:
            if sink == MAIL:
                assert self.config.smtp is not None
                sinks.mail(self.config.smtp, notice)
            else:
                sinks.post(self.config.webhooks[int(sink.removeprefix("webhook-"))], notice)
        except (sinks.SinkError, IndexError, ValueError) as e:
            return str(e)
        return None

    def trial(self, user: str) -> list[tuple[str, str | None]]:
        """``gpu-alloc notify test``: a test notice through each sink now, not kept;
        (sink, None or why it failed) for each."""
        notice = notices.trial(user, rfc3339(ledger.now()), self.config.choices)
        return [(sink, self.send(sink, notice)) for sink in self.sinks_of(notice)]

    def _keep(self, make: Callable[[], list[Notice]]) -> None:
        """A warning the timekeeper's looks make again and again into the outbox, once
        (the outbox keeps one per id: pending, or sent in the last 30 days).  Never
        raises: the look goes on."""
        try:
            if sum(self.outbox.put(n, self.sinks_of(n)) for n in make()):
                self.wake.set()
        except Exception:
            log.exception("a warning notice not kept")

    def _reservations(self, now: float) -> None:
        """Each reservation about to begin or begun: its notices (made again each round,
        kept once by their ids)."""
        due = notices.reservations_due(self.reservations.current(now), now)
        if not due:
            return
        try:
            indices = {g.uuid: g.index for g in self.gather.inventory().gpus}
        except InventoryError:
            indices = {}  # the notice names how many GPUs instead
        holders = self._holders()
        for r, begun in due:
            for n in notices.reservation(r, begun, self.config.choices, indices, holders):
                self.outbox.put(n, self.sinks_of(n))

    def _holders(self) -> dict[str, set[str]]:
        """GPU UUID -> the owners of the leases on it."""
        on: dict[str, set[str]] = {}
        for le in self.ledger.read().leases.values():
            for uuid in le.gpus:
                on.setdefault(uuid, set()).add(le.owner or "unknown")
        return on
