"""The authorization plugin: dockerd asks it about every API call, twice.

Theory of operation
-------------------
``AuthZReq`` runs before the Engine acts.  Reads and writes that cannot touch
a device are answered from the route table alone: no body decoding, no lock,
no file, no Engine call (`decide.authz_request` returns before any of them).
Creates are decoded the way dockerd decodes them; one that would get GPUs is
allowed only when its lease label's token matches a pending lease for exactly
those GPUs, and that token is consumed under the ledger lock (single use).
``AuthZRes`` runs after the Engine acted: for a leased create it binds the
lease to the new container id, or frees it when the create failed.

Any error on the way (corrupt state, lock timeout, Engine not answering)
denies the request with the reason: dockerd shows ``Msg`` to the user.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
import re
import time
from typing import Any, ClassVar

from flask import Flask, Response, request

from allocator.core import verdicts as decide
from allocator.core.inventory import InventoryError
from allocator.core.leases import StateError
from allocator.host import metrics
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError
from allocator.service import Allocator

log = logging.getLogger("gpu-alloc.plugin")
_ALLOW = json.dumps({"Allow": True}).encode()
_ACTIVATE = json.dumps({"Implements": ["authz"]}).encode()
_FAILURES = (StateError, EngineError, InventoryError)


def _json(payload: bytes) -> Response:
    return Response(payload, status=200, mimetype="application/vnd.docker.plugins.v1+json")


def _deny(msg: str) -> Response:
    return _json(json.dumps({"Allow": False, "Msg": msg}).encode())


def _body(req: dict[str, Any]) -> bytes | None:
    raw = req.get("RequestBody")
    if not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return b"\x00unreadable"  # decoding then fails closed with a clear message


def create_app(config: Config, allocator: Allocator | None = None) -> Flask:
    alloc = allocator or Allocator(config, Engine(config.engine.socket, config.engine.timeout))
    app = Flask("gpu-alloc-plugin")

    @app.post("/Plugin.Activate")
    def activate() -> Response:
        return _json(_ACTIVATE)

    @app.post("/AuthZPlugin.AuthZReq")
    def authz_req() -> Response:
        try:
            req = json.loads(request.get_data())
            method, uri = str(req["RequestMethod"]), str(req["RequestUri"])
        except (ValueError, KeyError, TypeError):
            return _deny("gpu-alloc could not read the Engine's authorization request")
        began = time.perf_counter()
        try:
            decision = alloc.resolve(decide.authz_request(method, uri, _body(req), _Facts(alloc)))
        except _FAILURES as e:
            decision = decide.Deny(f"gpu-alloc refused {method} {uri}: {e}")
        metrics.decision(time.perf_counter() - began)
        if isinstance(decision, decide.Deny):
            log.info("denied %s %s: %s", method, uri, decision.msg)
            metrics.request("denied")
            metrics.denial(decision.field)
            alloc.record("denial", reason=decision.msg, name=f"{method} {uri.split('?')[0]}")
            return _deny(decision.msg)
        return _json(_ALLOW)

    @app.post("/AuthZPlugin.AuthZRes")
    def authz_res() -> Response:
        try:
            req = json.loads(request.get_data())
            method, uri = str(req["RequestMethod"]), str(req["RequestUri"])
            status = int(req.get("ResponseStatusCode") or 0)
        except (ValueError, KeyError, TypeError):
            return _deny("gpu-alloc could not read the Engine's authorization response")
        outcome = decide.authz_response(method, uri, _body(req), status, _response_body(req))
        try:
            alloc.settle(outcome)
        except StateError as e:
            # The container exists already; reconcile binds it by label later.
            log.error("could not settle lease after %s %s: %s", method, uri, e)
        return _json(_ALLOW)

    app.wsgi_app = _FastPath(app.wsgi_app)  # type: ignore[method-assign]
    return app


class _FastPath:
    """Answer calls that touch no GPU before Flask sees them.

    dockerd calls the plugin twice for every API call on the host; most are
    reads or writes the route table clears at once.  Those are answered here,
    from the raw body, in a few microseconds instead of a full Flask dispatch.
    Everything else goes on to Flask with the body it was sent.
    """

    _HEADERS: ClassVar[list[tuple[str, str]]] = [
        ("Content-Type", "application/vnd.docker.plugins.v1+json"),
        ("Content-Length", str(len(_ALLOW))),
    ]

    def __init__(self, app: Any):
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO")
        if path in ("/AuthZPlugin.AuthZReq", "/AuthZPlugin.AuthZRes"):
            stream = environ["wsgi.input"]
            body = stream.read(int(environ.get("CONTENT_LENGTH") or 0))
            if _clears_at_once(path, body):
                start_response("200 OK", self._HEADERS)
                return [_ALLOW]
            environ["wsgi.input"] = io.BytesIO(body)
        return self.app(environ, start_response)


# dockerd marshals authz.Request with RequestMethod before any field a client controls,
# and escapes every quote inside strings: the first match is the real method.
_METHOD = re.compile(rb'"RequestMethod":"([A-Z]+)"')


def _clears_at_once(path: str, body: bytes) -> bool:
    if path.endswith("AuthZRes"):
        # Most responses are to reads: settle them without decoding the response body.
        m = _METHOD.search(body, 0, 512)
        if m and m[1] not in (b"POST", b"DELETE"):
            return True
    try:
        req = json.loads(body)
        method, uri = req["RequestMethod"], req["RequestUri"]
    except (ValueError, KeyError, TypeError):
        return False  # Flask answers it, with the reason
    if path.endswith("AuthZReq"):
        return decide.clears_at_once(method, uri)
    if method not in ("POST", "DELETE"):
        return True
    try:
        status = int(req.get("ResponseStatusCode") or 0)
    except (TypeError, ValueError):
        return False
    return decide.authz_response(method, uri, _body(req), status, _response_body(req)) is None


def _response_body(req: dict[str, Any]) -> bytes | None:
    raw = req.get("ResponseBody")
    try:
        return base64.b64decode(raw) if raw else None
    except (binascii.Error, ValueError, TypeError):
        return None


class _Facts:
    """Facts computed on first use: most requests never need the inventory or /info."""

    def __init__(self, alloc: Allocator):
        self._alloc = alloc
        self._facts: decide.Facts | None = None

    def __getattr__(self, name: str) -> Any:
        if self._facts is None:
            self._facts = self._alloc.facts()
        return getattr(self._facts, name)
