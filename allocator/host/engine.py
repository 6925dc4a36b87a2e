"""A thin Engine client for the few calls gpu-alloc makes itself.

Every call has a deadline: the plugin and the shim sit in front of dockerd,
and a call that hangs would hang Docker.  The HTTP is gpu-alloc's own (`unixhttp`),
not the docker SDK's: one Engine client for the product, with nothing to import or
connect before the first call, so a process can start before dockerd does (the
plugin must, since dockerd waits for it).  Paths carry no API version: each Engine
answers them in its newest.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

from allocator.host import unixhttp
from allocator.host.unixhttp import KeepAlive

T = TypeVar("T")


class EngineError(Exception):
    """The Engine could not be asked; callers fail closed."""


class Engine:
    def __init__(self, socket: str, timeout: float = 10.0):
        self.socket = socket
        self.timeout = timeout
        self._gets = KeepAlive(socket, timeout)  # the inspects on every start and create

    def info(self) -> dict[str, Any]:
        return self._get("GET /info", "/info") or {}

    def version(self) -> dict[str, Any]:
        """GET /version: what the Engine says it is (the toolkit's behaviour depends on it)."""
        return self._get("GET /version", "/version") or {}

    def volume(self, name: str) -> dict[str, Any] | None:
        """GET /volumes/NAME: the driver and options a named volume will be mounted with."""
        return self._get(f"inspect volume {name}", f"/volumes/{quote(name, safe='')}")

    def containers(
        self, label: str | None = None, ids: list[str] | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        """Containers, stopped ones included (a stopped container keeps its GPUs).

        ``name``: a regular expression dockerd matches against each container's names."""
        filters: dict[str, list[str]] = {}
        if label:
            filters["label"] = [label]
        if ids:
            filters["id"] = ids
        if name:
            filters["name"] = [name]
        query = {"all": "1"} | ({"filters": json.dumps(filters)} if filters else {})
        return self._list("GET /containers/json", "/containers/json?" + urlencode(query))

    def inspect(self, container: str) -> dict[str, Any] | None:
        return self._get(f"inspect {container}", f"/containers/{quote(container, safe='')}/json")

    def inspect_exec(self, exec_id: str) -> dict[str, Any] | None:
        """GET /exec/ID/json: its ``ContainerID`` among the rest; None for no such exec."""
        return self._get(f"inspect exec {exec_id}", f"/exec/{quote(exec_id, safe='')}/json")

    def update(self, container: str, config: dict[str, Any]) -> None:
        """POST /containers/ID/update with ``config``'s restart policy (the one setting
        gpu-alloc changes); a container gone is no error."""
        body = {"RestartPolicy": config["RestartPolicy"]} if "RestartPolicy" in config else {}
        target = f"/containers/{quote(container, safe='')}/update"
        self._post(f"update {container}", target, body, self.timeout)

    def stop(self, container: str, grace: int | None = None) -> None:
        """POST /containers/ID/stop, as ``docker stop``: the container's stop signal, then
        SIGKILL after ``grace`` seconds (its ``StopTimeout``; None: the Engine's 10 s).
        Waits for the stop, so the deadline is the grace's longer; a container already
        stopped (304) or gone is no error."""
        target = f"/containers/{quote(container, safe='')}/stop"
        if grace is not None:
            target += f"?t={grace}"
        self._post(
            f"stop {container}", target, None, self.timeout + (10 if grace is None else grace)
        )

    def kill(self, container: str, signal: str) -> None:
        """POST /containers/ID/kill?signal=..., as ``docker kill --signal``: the signal to
        its main process, without waiting; an error (409) when it is not running."""
        target = f"/containers/{quote(container, safe='')}/kill?signal={quote(signal, safe='')}"
        self._post(f"kill {container}", target, None, self.timeout)

    def image(self, name: str) -> dict[str, Any] | None:
        return self._get(f"inspect image {name}", f"/images/{quote(name, safe='/:@')}/json")

    def plugins(self) -> list[dict[str, Any]]:
        """GET /plugins: the managed plugins, enabled or not, each with its config."""
        return self._list("GET /plugins", "/plugins")

    def service(self, ref: str) -> dict[str, Any] | None:
        """GET /services/REF: the swarm service ``ref`` names (id, name or id prefix, as
        dockerd resolves it); None when it names none."""
        return self._get(f"inspect service {ref}", f"/services/{quote(ref, safe='')}")

    def services(self, label: str = "") -> list[dict[str, Any]]:
        """GET /services, with a label filter (``key`` or ``key=value``) when given: a
        manager's only."""
        if not label:
            return self._list("GET /services", "/services")
        filters = quote(json.dumps({"label": [label]}), safe="")
        return self._list("GET /services", f"/services?filters={filters}")

    def nodes(self) -> list[dict[str, Any]]:
        """GET /nodes: the swarm's nodes, as a manager knows them."""
        return self._list("GET /nodes", "/nodes")

    def _list(self, what: str, target: str) -> list[dict[str, Any]]:
        try:
            status, body = self._gets.get(target)
            data = json.loads(body) if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise EngineError(f"Engine at {self.socket}: {what}: {_plain(e)}") from None
        if not isinstance(data, list):
            raise EngineError(f"Engine at {self.socket}: {what} answered {status}")
        return [d for d in data if isinstance(d, dict)]

    def _get(self, what: str, target: str) -> dict[str, Any] | None:
        """A GET on the kept-alive connection: its document, None for 404, `EngineError`
        for any other failure."""
        try:
            status, body = self._gets.get(target)
        except (OSError, http.client.HTTPException) as e:
            raise EngineError(f"Engine at {self.socket}: {what} failed: {_plain(e)}") from None
        if status == 404:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if status != 200 or not isinstance(data, dict):
            raise self._refusal(what, status, body)
        return data

    def _post(self, what: str, target: str, body: dict[str, Any] | None, timeout: float) -> None:
        """A POST on a connection of its own (a POST is not retried, and a stop may wait
        longer than a GET may): 2xx and 304 are done, 404 (gone) too; any other answer is
        an `EngineError` with the Engine's words."""
        data = None if body is None else json.dumps(body).encode()
        try:
            status, answer = unixhttp.request(
                self.socket, "POST", target, data, timeout, {"Content-Type": "application/json"}
            )
        except (OSError, http.client.HTTPException) as e:
            raise EngineError(f"Engine at {self.socket}: {what} failed: {_plain(e)}") from None
        if not (status in (304, 404) or 200 <= status < 300):
            raise self._refusal(what, status, answer)

    def _refusal(self, what: str, status: int, body: bytes) -> EngineError:
        """The Engine's answer in its words: its JSON ``message``, else the body's text."""
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        why = data.get("message") if isinstance(data, dict) else body[:200].decode(errors="replace")
        return EngineError(f"Engine at {self.socket}: {what} failed: {status} {why}")

    def destroyed(self) -> Stream[str]:
        """The full ids of containers as the Engine destroys them (``destroy`` events)."""
        return Stream(
            self._events({"type": ["container"], "event": ["destroy"]}, None, None), actor
        )

    def signalled(self, container: str, since: float) -> bool:
        """Whether dockerd sent ``container`` a signal (a ``kill`` event) since ``since``
        (Unix seconds), among the events it still holds; asked up to now, so it returns
        at once."""
        filters = {"type": ["container"], "container": [container], "event": ["kill"]}
        with contextlib.closing(self.events(filters, since, until=time.time())) as stream:
            return any(True for _ in stream)

    def first_start(self, container: str, since: float) -> float | None:
        """When dockerd first started ``container`` since ``since`` (Unix seconds), by its
        ``start`` events among those it still holds (its last 256); None when none is."""
        filters = {"type": ["container"], "container": [container], "event": ["start"]}
        with contextlib.closing(self.events(filters, since, until=time.time())) as stream:
            for event in stream:
                stamp = event.get("timeNano") or int(event.get("time") or 0) * 10**9
                if stamp:
                    return int(stamp) / 1e9
        return None

    def events(
        self,
        filters: dict[str, list[str]],
        since: float | None = None,
        until: float | None = None,
    ) -> Stream[dict]:
        """GET /events for ``filters``, on a connection of its own.

        The stream has no deadline (it waits for events by design), so it never shares
        the connection whose calls must not hang; it ends when the Engine goes away.  The
        request is made and answered 200 before this returns (a refusal, by an
        authorization plugin say, is an `EngineError`): a stream in hand is one the Engine
        took.  ``since`` (Unix seconds) replays the events the Engine still holds from then;
        with ``until``, the stream ends there.
        """
        return Stream(self._events(filters, since, until), lambda event: event)

    def _events(
        self, filters: dict[str, list[str]], since: float | None, until: float | None
    ) -> unixhttp.Lines:
        query = {"filters": json.dumps(filters)}
        for name, at in (("since", since), ("until", until)):
            if at is not None:
                query[name] = f"{at:.6f}" if isinstance(at, float) else str(at)
        try:
            got = unixhttp.lines(self.socket, "/events?" + urlencode(query), self.timeout)
        except OSError as e:
            raise EngineError(f"Engine at {self.socket}: GET /events failed: {_plain(e)}") from None
        return got


class Stream(Generic[T]):
    """An event stream's items (``item`` of each event), as they come; `abort` ends it
    from any thread, so a worker following it stops when told."""

    def __init__(self, lines: unixhttp.Lines, item: Callable[[dict[str, Any]], T]) -> None:
        self._lines, self._item = lines, item

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return self._item(json.loads(next(self._lines)))

    def abort(self) -> None:
        self._lines.abort()

    def close(self) -> None:
        self._lines.close()


def actor(event: dict[str, Any]) -> str:
    """Whom an event is about: ``Actor.ID``.  Engine 29 (API 1.52 on) no longer writes the
    old top-level ``id`` (nor ``status``, ``from``) beside it; older Engines write both."""
    who = event.get("Actor")
    found = who.get("ID") if isinstance(who, dict) else None
    return str(found or event.get("id") or "")


_GO_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def go_time(text: object) -> float | None:
    """A Go RFC 3339 time (nanoseconds, ``Z``) as epoch seconds; None for Go's zero time."""
    if not isinstance(text, str):
        return None
    m = _GO_TIME.match(text)
    if m is None or text.startswith("0001-"):
        return None
    frac = f".{m.group(2)[:6]}" if m.group(2) else ""
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + zone).timestamp()


# The causes people meet, in words.
_CAUSES = (
    ("FileNotFoundError", "no socket there: is dockerd running?"),
    ("ConnectionRefusedError", "nothing listens there: is dockerd running?"),
    ("PermissionError", "permission denied: run it as root, or as a member of the docker group"),
)


def _plain(e: BaseException) -> str:
    text = repr(e)
    return next((words for name, words in _CAUSES if name in text), str(e))
