"""The plugin's side of the in-flight rule (allocator/core/leases/inflight.py): announce, then
allow.

A start or restart is judged first (`Admission.resolve`: the inspect it judged says
which container its reference named), then put in flight once no conflicting rename,
removal, prune or named create is; a change is put in flight before its own verdict,
once no start it could redirect is.  Each leaves when its AuthZRes arrives (`end`,
before that is answered: a worker killed after answering would leave the entry behind
until it expires, refusing that container's removal with "retry"), or when its verdict
is a refusal.  A change waits for a restart of a running container only until dockerd
has signalled that container since the restart began (a ``kill`` event): dockerd had
looked the restart's reference up by then, so the rest of its stop timeout holds off no
prune or removal.

A start whose reference could move by something no call announces is refused before
that (`inflight.refusal`).  Between the start's inspect and its entry a change may have
begun and ended unseen; the board's generation tells, and then the reference is
inspected again: it must name the same container, or the start is refused with
"retry".  A start by full id of a --rm container that may exit is refused while a
container is named like that id.  Only then can nothing move it until dockerd has
looked it up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from allocator.core.api.routes import Check, Route, RouteError, classify
from allocator.core.judging import verdicts as decide
from allocator.core.leases import inflight
from allocator.core.leases.inflight import Entry, Start
from allocator.host.config import PolicyConfig
from allocator.host.engine import EngineError
from allocator.host.inflight import Registry, runtime_dir
from allocator.service.wiring import Allocator

T = TypeVar("T")
ASK_EVERY = 0.1  # seconds between asking the Engine whether a restart was looked up


class InFlight:
    def __init__(self, alloc: Allocator, registry: Registry | None = None):
        self.alloc = alloc
        self.resolves = (
            alloc.lookups.has_engine
        )  # an Engine resolves references (fixed for its life)
        self.registry = registry or Registry(
            runtime_dir(alloc.config), alloc.gather.policy_in_force.lock_timeout
        )
        alloc.gather.policy_listeners.append(self._policy_reloaded)

    def _policy_reloaded(self, policy: PolicyConfig) -> None:
        self.registry.lock.timeout = policy.lock_timeout

    @staticmethod
    def guards(route: Route) -> bool:
        return route.check in inflight.GUARDED

    def alone(self, route: Route, uri: str) -> bool:
        """The call is judged by its verdict alone: it is no start, and announces no change
        (an unnamed create, say)."""
        if not self.resolves:
            return True
        return route.check not in inflight.STARTS and inflight.hold_of(route, uri) is None

    def judge(
        self, route: Route, method: str, uri: str, verdict: Callable[[], decide.Decision]
    ) -> decide.Decision:
        """``verdict()`` (the call's resolved decision), with the call put in flight.

        Without an Engine (tests of the ledger alone) nothing resolves a reference."""
        if not self.resolves:
            return verdict()
        key = inflight.key(method, uri)
        if route.check in inflight.STARTS:
            return self._start(route, key, verdict)
        change = inflight.hold_of(route, uri)
        if change is None:
            return verdict()
        why, _ = self.registry.begin(key, change, looked_up=self._looked_up())
        if why is not None:
            return decide.Deny(why)
        decision = self._or_end(key, verdict)
        if isinstance(decision, decide.Deny):
            self.registry.end(key)
        return decision

    def _start(
        self, route: Route, key: str, verdict: Callable[[], decide.Decision]
    ) -> decide.Decision:
        before = self.registry.generation()
        decision = verdict()
        if not isinstance(decision, decide.AllowStart):
            return decision
        verb = "restart" if route.check is Check.RESTART else "start"
        start = Start(verb, route.name, decision.target)
        why = inflight.refusal(start)
        if why is not None:
            return decide.Deny(why)
        why, seen = self.registry.begin(key, start)
        if why is not None:
            return decide.Deny(why)
        why = self._or_end(key, lambda: self._recheck(start, moved=before != seen))
        if why is not None:
            self.registry.end(key)
            return decide.Deny(why)
        return decision

    def _recheck(self, start: Start, moved: bool) -> str | None:
        """What can still be wrong once the start is in flight, nothing can move it now."""
        if moved:
            now = Start(start.verb, start.ref, self.alloc.lookups.target_of(start.ref))
            if now != start:
                return inflight.moved_text(start)
        if inflight.needs_name_check(start):
            named = self.alloc.lookups.ids_named(start.ref)
            if named:
                return inflight.named_like_id_text(start, named[0])
        return None

    def _looked_up(self) -> Callable[[Entry], bool]:
        """Whether dockerd has looked up the reference of a restart in the way: its
        container's kill event since the restart began says so (`inflight.signalled`).
        Asked of the Engine at most every `ASK_EVERY` seconds a restart, while waiting."""
        alloc = self.alloc
        asked: dict[Entry, float] = {}

        def looked_up(entry: Entry) -> bool:
            target = inflight.signalled(entry.hold)
            now = time.monotonic()
            if target is None or now - asked.get(entry, -ASK_EVERY) < ASK_EVERY:
                return False
            asked[entry] = now
            try:
                return alloc.lookups.signalled(target.id, entry.began)
            except EngineError:
                return False  # no word from the Engine: the restart holds the call off

        return looked_up

    def _or_end(self, key: str, step: Callable[[], T]) -> T:
        try:
            return step()
        except BaseException:
            self.registry.end(key)
            raise

    def held(self, method: str, uri: str) -> bool:
        """Whether the call was put in flight at its AuthZReq (no I/O: the route alone)."""
        if not self.resolves:
            return False
        try:
            route = classify(method, uri)
        except RouteError:
            return False
        return route.check in inflight.STARTS or (
            route.check in inflight.GUARDED and inflight.hold_of(route, uri) is not None
        )

    def end(self, method: str, uri: str, wait: bool = True) -> bool:
        """At AuthZRes: the call is over (without ``wait``: False if the lock was busy)."""
        return self.registry.end(inflight.key(method, uri), wait)
