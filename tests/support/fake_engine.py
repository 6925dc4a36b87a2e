"""An Engine in memory: the calls gpu-alloc makes of `allocator.host.engine.Engine`,
answered from dicts.  The one fake Engine of the pure tests.

Containers are kept as the inspect document dockerd would return; the listing is
derived from it, with the filters the service uses (``label=KEY[=VALUE]``, ``id``
prefixes).  ``down`` makes every call fail as an unreachable Engine does.  The image
event stream is fed by the test one event at a time (``event``); ``stream_down``
refuses the stream alone, as when dockerd closes it while still answering calls.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from allocator.core.api import labels
from allocator.host import config as configmod
from allocator.host.engine import EngineError
from allocator.service.wiring import Allocator
from tests.support.engine import write_sim_gpus

_ids = itertools.count(1)


class FakeEngine:
    def __init__(self, info: dict[str, Any] | None = None) -> None:
        self._info = info or {"DefaultRuntime": "runc", "Runtimes": {"runc": {}}}
        self.by_id: dict[str, dict[str, Any]] = {}
        self.images: dict[str, dict[str, Any]] = {}
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.kills: list[tuple[str, str]] = []  # (container, signal)
        self.calls: list[str] = []
        self.inspected: list[str] = []  # every reference `inspect` was asked, in order
        self.execs: dict[str, str] = {}  # an exec's id -> its container's
        self.down = False
        # The image event stream: what was asked of it, and the events the test feeds.
        self.stream_down = False
        self.opened: list[tuple[dict, int | None]] = []
        self.opened_at: list[float] = []
        self.feed: queue.Queue[dict | None] = queue.Queue()
        self.starts: dict[str, list[float]] = {}  # container -> its start events' times
        self.during_image: Callable[[], None] = lambda: None
        # A swarm manager's services, as GET /services lists them, and its nodes.
        self.services_by_id: dict[str, dict[str, Any]] = {}
        self.swarm_nodes: list[dict[str, Any]] = []

    # ---------------------------------------------------------- building the world

    def add(
        self,
        name: str,
        *,
        cid: str = "",
        gpus: tuple[str, ...] = (),
        lease: str = "",
        labels_: dict[str, str] | None = None,
        running: bool = True,
        env: tuple[str, ...] = (),
        pid: int = 0,
    ) -> str:
        """A container (a fresh id unless ``cid``); ``gpus`` become a device request by
        UUID, ``lease`` its label, ``pid`` its main process."""
        cid = cid or f"{next(_ids):064x}"
        given = dict(labels_ or {})
        if lease:
            given[labels.LEASE] = lease
        requests = (
            [{"Driver": "nvidia", "DeviceIDs": list(gpus), "Capabilities": [["gpu"]]}]
            if gpus
            else []
        )
        state: dict[str, Any] = {"Running": running, "Status": "running" if running else "exited"}
        if pid:
            state["Pid"] = pid
        self.by_id[cid] = {
            "Id": cid,
            "Name": f"/{name}",
            "Config": {"Labels": given, "Env": list(env)},
            "HostConfig": {"DeviceRequests": requests},
            "Mounts": [],
            "State": state,
        }
        return cid

    def remove(self, cid: str) -> None:
        del self.by_id[cid]

    def add_service(self, spec: dict[str, Any], sid: str = "") -> str:
        """A swarm service of ``spec`` (a fresh id unless ``sid``)."""
        sid = sid or f"{next(_ids):025x}"
        self.services_by_id[sid] = {"ID": sid, "Spec": spec}
        return sid

    def add_node(self, state: str = "ready", availability: str = "active") -> None:
        self.swarm_nodes.append(
            {"Status": {"State": state}, "Spec": {"Availability": availability}}
        )

    def event(self, event: dict | None = None) -> None:
        """An image event (None: the stream ends), handled before this returns."""
        self.feed.put(event)
        self.feed.join()

    # ------------------------------------------------------------- Engine methods

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.down:
            raise EngineError(f"Engine at fake.sock: {what} failed: connection refused")

    def info(self) -> dict[str, Any]:
        self._call("info")
        return self._info

    def version(self) -> dict[str, Any]:
        self._call("version")
        return {"Version": "20.10.24", "ApiVersion": "1.41"}

    def volume(self, name: str) -> dict[str, Any] | None:
        self._call("volume")
        return None

    def containers(
        self, label: str | None = None, ids: list[str] | None = None
    ) -> list[dict[str, Any]]:
        self._call("containers")
        listed = []
        for cid, c in self.by_id.items():
            own = c["Config"]["Labels"]
            if label:
                key, eq, value = label.partition("=")
                if key not in own or (eq and own[key] != value):
                    continue
            if ids and not any(cid.startswith(i) for i in ids):
                continue
            state = c["State"]["Status"]
            status = "Up 5 minutes" if state == "running" else "Exited (0) 5 minutes ago"
            listed.append(
                {"Id": cid, "Names": [c["Name"]], "Labels": own, "State": state, "Status": status}
            )
        return listed

    def inspect(self, container: str) -> dict[str, Any] | None:
        self._call("inspect")
        self.inspected.append(container)
        if container in self.by_id:
            return self.by_id[container]
        named = [c for c in self.by_id.values() if c["Name"] == f"/{container}"]
        prefixed = [c for cid, c in self.by_id.items() if cid.startswith(container)]
        found = named or (prefixed if len(prefixed) == 1 else [])
        return found[0] if found else None

    def inspect_exec(self, exec_id: str) -> dict[str, Any] | None:
        """By the full id alone, as dockerd finds an exec."""
        self._call("inspect_exec")
        cid = self.execs.get(exec_id)
        return None if cid is None else {"ID": exec_id, "ContainerID": cid, "Running": False}

    def service(self, ref: str) -> dict[str, Any] | None:
        """By full id, then name, then unique id prefix, as dockerd resolves a service."""
        self._call("service")
        if ref in self.services_by_id:
            return self.services_by_id[ref]
        named = [s for s in self.services_by_id.values() if s["Spec"].get("Name") == ref]
        prefixed = [s for sid, s in self.services_by_id.items() if sid.startswith(ref)]
        found = named or (prefixed if len(prefixed) == 1 else [])
        return found[0] if found else None

    def services(self, label: str = "") -> list[dict[str, Any]]:
        self._call("services")
        key, eq, value = label.partition("=")
        return [
            s
            for s in self.services_by_id.values()
            if not label
            or (key in (own := s["Spec"].get("Labels") or {}) and (not eq or own[key] == value))
        ]

    def nodes(self) -> list[dict[str, Any]]:
        self._call("nodes")
        return self.swarm_nodes

    def update(self, container: str, config: dict[str, Any]) -> None:
        self._call("update")
        self.updates.append((container, config))

    def kill(self, container: str, signal: str) -> None:
        self._call("kill")
        self.kills.append((container, signal))

    def image(self, name: str) -> dict[str, Any] | None:
        self._call("image")
        self.during_image()
        return self.images.get(name)

    def first_start(self, container: str, since: float) -> float | None:
        self._call("events")
        return min((t for t in self.starts.get(container, ()) if t >= since), default=None)

    def events(self, filters: dict, since: int | None = None) -> Iterator[dict]:
        """The stream the test feeds: each event counts as handled once the next is asked."""
        self._call("events")
        if self.stream_down:
            raise OSError("connection refused")
        self.opened.append((filters, since))
        self.opened_at.append(time.monotonic())
        return self._stream()

    def _stream(self) -> Iterator[dict]:
        while True:
            event = self.feed.get()
            if event is None:
                self.feed.task_done()
                return
            yield event
            self.feed.task_done()


def allocator_on(tmp_path: Path, gpus: int = 2) -> Allocator:
    """A service over ``gpus`` simulated GPUs, its state under ``tmp_path``, whose Engine
    is a `FakeEngine` (the config's socket leads nowhere)."""
    cfg = {"state_dir": str(tmp_path / "state"),
           "gpus": str(write_sim_gpus(tmp_path / "gpus.yaml", gpus)),
           "engine": {"socket": str(tmp_path / "none.sock")}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), FakeEngine())  # type: ignore[arg-type]
