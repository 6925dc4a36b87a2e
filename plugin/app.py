"""The authorization plugin: dockerd asks it about every API call, twice.

Theory of operation
-------------------
``AuthZReq`` runs before the Engine acts.  Reads and writes that cannot touch
a device are answered from the route table alone: no body decoding, no lock,
no file, no Engine call (`decide.authz_request` returns before any of them).
Creates are decoded the way dockerd decodes them; one that would get GPUs is
allowed only when the token in its lease header (``X-Gpu-Alloc-Lease``, which
the shim adds and dockerd passes on) matches a pending lease for exactly those
GPUs, read from the ledger without the lock.  An unnamed create is allowed right
there on the worker's event loop when the Engine's view and the inventory are
cached and it asks nothing of the host (a bind's source, a volume); any other
create waits on the pool.
``AuthZRes`` runs after the Engine acted: for a leased create it settles the
lease by `outcomes.create_outcome`, the rule the shim follows too, with no
second decoding of the body.

dockerd looks a start's reference up again after AuthZReq, so a start and every
call that could change what it names (rename, removal, prune, named create) are
kept in flight between their AuthZReq and AuthZRes, and never overlap
(plugin/inflight.py, allocator/core/leases/inflight.py).

`Dispatcher.answer` is the one function every plugin call goes through, the
activation handshake included: the envelope is parsed once and the route
classified once per call.  plugin/worker.py frames its answers in HTTP.

Any error on the way (corrupt state, lock timeout, Engine not answering)
denies the request with the reason: dockerd shows ``Msg`` to the user.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from allocator.core.access.facts import Need
from allocator.core.api.gojson import Body
from allocator.core.api.routes import SPLICED_DOORS, Check, Route
from allocator.core.judging import verdicts as decide
from allocator.core.leases import outcomes
from allocator.core.leases.leases import StateError
from allocator.core.machine.inventory import InventoryError
from allocator.host import metrics
from allocator.host.config import Config
from allocator.host.engine import EngineError
from allocator.service.wiring import Allocator, connect
from plugin.inflight import InFlight

log = logging.getLogger("gpu-alloc.plugin")
_ALLOW = json.dumps({"Allow": True}).encode()
_ACTIVATE = json.dumps({"Implements": ["authz"]}).encode()
_FAILURES = (StateError, EngineError, InventoryError)


def _deny(msg: str) -> bytes:
    return json.dumps({"Allow": False, "Msg": msg}).encode()


def _body(req: dict[str, Any]) -> bytes | None:
    raw = req.get("RequestBody")
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return b"\x00unreadable"  # decoding then fails closed with a clear message


def _headers(req: dict[str, Any]) -> dict[str, Any]:
    headers = req.get("RequestHeaders")
    return headers if isinstance(headers, dict) else {}


def _response_body(req: dict[str, Any]) -> bytes | None:
    raw = req.get("ResponseBody")
    try:
        return base64.b64decode(raw) if raw else None
    except (binascii.Error, ValueError, TypeError):
        return None


# dockerd marshals authz.Request with RequestMethod before any field a client controls,
# and escapes every quote inside strings: the first match is the real method.
_METHOD = re.compile(rb'"RequestMethod":"([A-Z]+)"')


Later = Callable[[], bytes]
Asked = Callable[[decide.Facts], decide.Decision]
# A create body decoded on the event loop at most (base64): the CLI's and Compose's are
# a few KiB; a bigger one (dockerd passes a plugin up to 4 MiB) is decoded on the pool.
_QUICK_BODY = 64 << 10


class Dispatcher:
    """``answer(path, raw envelope)``: the one place a plugin call is answered (the
    activation handshake, and every authz call's decision).

    The envelope is parsed once and the route classified once per call.  Calls that
    touch no GPU are answered at once, from the route table: no lock, no file, no
    Engine call.  So is the allowing of an unnamed create (it puts nothing in flight)
    when the facts at hand suffice (`_quick`).  The rest come back as a `Later`, the
    I/O-bound part of the decision (ledger lock, Engine inspects, the audit trail), for
    the server to run where waiting blocks nobody (`plugin.worker`: a thread pool).
    """

    def __init__(self, alloc: Allocator):
        self.alloc = alloc
        self.inflight = InFlight(alloc)
        self._routes: dict[str, Callable[[bytes], bytes | Later]] = {
            "/Plugin.Activate": self.activate,
            "/AuthZPlugin.AuthZReq": self.authz_req,
            "/AuthZPlugin.AuthZRes": self.authz_res,
        }

    def handles(self, path: str) -> bool:
        return path in self._routes

    def answer(self, path: str, raw: bytes) -> bytes | Later:
        return self._routes[path](raw)

    def dispatch(self, path: str, raw: bytes) -> bytes:
        """The whole answer, waiting for it here (a caller's own thread)."""
        answer = self.answer(path, raw)
        return answer if isinstance(answer, bytes) else answer()

    def activate(self, raw: bytes) -> Later:
        """dockerd's handshake: the answer is a constant, the work it starts writes files
        (on the pool)."""
        return self._activated

    def _activated(self) -> bytes:
        # dockerd activates its plugins once per life: whatever was in flight belonged to
        # a dockerd that is gone (a restart mid-call), and no AuthZRes will end it.  The
        # new one may run other runtimes: every worker and the shim read /info again.
        self.alloc.gather.engine_activated()
        try:
            self.inflight.registry.clear()
        except StateError as e:
            log.warning("in-flight registry not cleared at activation: %s", e)
        return _ACTIVATE

    def authz_req(self, raw: bytes) -> bytes | Later:
        try:
            req = json.loads(raw)
            method, uri = str(req["RequestMethod"]), str(req["RequestUri"])
        except (ValueError, KeyError, TypeError):
            return _deny("gpu-alloc could not read the Engine's authorization request")
        route = decide.route_of(method, uri)
        if isinstance(route, decide.Deny):
            return _deny(route.msg)
        if decide.cleared(route) and not self.inflight.guards(route):
            return _ALLOW
        if (
            route.check in SPLICED_DOORS
            and not self.inflight.guards(route)
            and self.alloc.doors.open_to_all()
        ):
            return _ALLOW  # an attach, an exec's start: no container can be owned
        call = _Call(route, method, uri, req)
        if (
            route.check is Check.CREATE
            and len(req.get("RequestBody") or "") <= _QUICK_BODY
            and self.inflight.alone(route, uri)
        ):
            return self._quick(call)
        return partial(self._decide, call)

    def _asked(self, call: _Call) -> Asked:
        """The core's verdict on the call, for `Gatherer.decide` to give its facts."""
        route = call.route
        signing = self.alloc.lookups.service_signing() if route.check in decide.SIGNED else None
        return partial(
            decide.authz_request, route, call.method, call.uri, call.body,
            headers=_headers(call.req), signing=signing,
        )  # fmt: skip

    def _verdict(self, call: _Call) -> decide.Decision:
        reads = decide.reads_facts(call.route)
        asked = self.alloc.gather.decide(self._asked(call), reads, now=call.read_now)
        return self.alloc.admission.resolve(asked)

    def _quick(self, call: _Call) -> bytes | Later:
        """An unnamed create, decided here when the facts at hand suffice
        (`Gatherer.at_hand`: the Engine's view and the inventory as cached) and allowed
        by the ledger's files (read without the lock: no wait, no write).  A create that
        needs a fact not at hand, or whose decision fails, goes to `_decide`; one refused
        goes there with its decision, for the audit trail."""
        began = time.perf_counter()
        try:
            asked = self.alloc.gather.at_hand(self._asked(call), decide.reads_facts(call.route))
            call.read_now = isinstance(asked, Need)  # the pool's look would not find them
            decision = None if isinstance(asked, Need) else self.alloc.admission.resolve(asked)
        except Exception:  # any failure: decided in full, and logged
            decision = None
        if not isinstance(decision, decide.Allow):
            return partial(self._decide, call, decision)
        metrics.decision(time.perf_counter() - began)
        return _ALLOW

    def _decide(self, call: _Call, decided: decide.Decision | None = None) -> bytes:
        """The call decided where waiting blocks nobody; ``decided``: already, at hand."""
        began = time.perf_counter()
        route, method, uri = call.route, call.method, call.uri
        verdict: Callable[[], decide.Decision] = partial(self._verdict, call)
        if decided is not None:
            verdict = partial(_given, decided)
        try:
            decision = self.inflight.judge(route, method, uri, verdict)
        except _FAILURES as e:
            decision = decide.Deny(f"gpu-alloc refused {method} {uri}: {e}")
        metrics.decision(time.perf_counter() - began)
        if isinstance(decision, decide.Deny):
            log.info("denied %s %s: %s", method, uri, decision.msg)
            metrics.request("denied")
            metrics.denial(decision.field)
            self.alloc.recorder.record(
                "denial", reason=decision.msg, name=f"{method} {uri.split('?')[0]}"
            )
            return _deny(decision.msg)
        return _ALLOW

    def authz_res(self, raw: bytes) -> bytes | Later:
        # Most responses are to reads: settle them without parsing the envelope at all.
        m = _METHOD.search(raw, 0, 512)
        if m and m[1] not in (b"POST", b"DELETE"):
            return _ALLOW
        try:
            req = json.loads(raw)
            method, uri = str(req["RequestMethod"]), str(req["RequestUri"])
            status = int(req.get("ResponseStatusCode") or 0)
        except (ValueError, KeyError, TypeError):
            return _deny("gpu-alloc could not read the Engine's authorization response")
        if method not in ("POST", "DELETE"):
            return _ALLOW
        outcome = outcomes.authz_response(method, uri, status, _response_body(req), _headers(req))
        held = self.inflight.held(method, uri)
        if outcome is None and (not held or self._end_now(method, uri)):
            return _ALLOW
        return partial(self._settle, outcome, method, uri, held)

    def _end_now(self, method: str, uri: str) -> bool:
        """A call in flight leaves the board here when its lock is free at once (a small
        write to a tmpfs file); else, or on any failure, on the pool."""
        try:
            return self.inflight.end(method, uri, wait=False)
        except Exception:
            return False

    def _settle(self, outcome: outcomes.Outcome | None, method: str, uri: str, held: bool) -> bytes:
        """The response's work, all done before it is answered: a worker killed after
        answering would leave it undone, and dockerd does not ask again."""
        if held:
            try:
                self.inflight.end(method, uri)
            except Exception:  # the entry expires by itself
                log.exception("could not end %s %s in flight", method, uri)
        if outcome is not None:
            try:
                self.alloc.book.settle(outcome)
            except StateError as e:
                # The container exists already; reconcile binds it by label later.
                log.error("could not settle %s %s: %s", method, uri, e)
        return _ALLOW


class _Call:
    """One authz call: its envelope parsed and its route classified once, and its body
    decoded (base64, then as dockerd reads it: `gojson.Body`) once, on first use, however
    often its verdict is made (at hand, then on the pool at hand and on facts read)."""

    __slots__ = ("_body", "method", "read_now", "req", "route", "uri")

    def __init__(self, route: Route, method: str, uri: str, req: dict[str, Any]):
        self.route, self.method, self.uri, self.req = route, method, uri, req
        self._body: Body | None = None
        self.read_now = False  # the facts at hand did not suffice: read them now

    @property
    def body(self) -> Body:
        if self._body is None:
            self._body = Body(_body(self.req))
        return self._body


def _given(decision: decide.Decision) -> decide.Decision:
    return decision


def create_dispatcher(config: Config, allocator: Allocator | None = None) -> Dispatcher:
    """The plugin's calls, answered by the allocator ``config`` names (or ``allocator``)."""
    return Dispatcher(allocator or connect(config))
