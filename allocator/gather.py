"""The facts a decision is made against, gathered from the host and the Engine.

The service (allocator/service.py) decides nothing itself: it asks this class for
facts (the inventory, what the Engine says it is, the host's filesystem answers, the
policy in force), hands them to the pure core, and applies what the core returns.
Each fact is cached for as long as it stays true: the simulated GPU file until it
changes, NVML and the Engine's view for a few seconds, the policy until its file
changes; an unreadable inventory is itself a fact, so work that touches no GPU goes on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict, Unpack, cast

from allocator.core import cpus, defaults, events
from allocator.core.facts import EngineView, HostFacts
from allocator.core.inventory import Inventory, InventoryError
from allocator.core.leases import Lease
from allocator.core.placement import POLICIES
from allocator.core.policy import Rules, missing_pool_gpus
from allocator.core.queue import Waiter
from allocator.core.reconcile import Report
from allocator.core.verdicts import (
    Facts,
)
from allocator.host import config as configmod
from allocator.host import cpus as host_cpus
from allocator.host import ledger
from allocator.host.audit import AuditLog
from allocator.host.config import Config, ConfigError
from allocator.host.engine import Engine, EngineError
from allocator.host.engineroot import EngineRoot
from allocator.host.filesystem import Host, engine_paths
from allocator.host.health import HealthFile
from allocator.host.inventory import load as load_inventory
from allocator.host.ledger import Ledger

INVENTORY_MAX_AGE = 10.0
POLICY_CHECK_EVERY = 2.0  # seconds between the running services' looks at the config file
log = logging.getLogger("gpu-alloc")
ENGINE_VIEW_MAX_AGE = 30.0
ACTIVATED = "gpu-alloc.activated"  # touched when dockerd activates the plugin: a new dockerd


class AuditFields(TypedDict, total=False):
    """What `Gatherer.record` passes on to `events.record`."""

    gpus: tuple[str, ...] | list[str]
    container: str | None
    name: str
    owner: str | None
    reason: str


class Gatherer:
    """The service's state and its view of the world."""

    def __init__(self, config: Config, engine: Engine | None = None, host: Host | None = None):
        self.config = config
        self.engine = engine
        self.ledger = Ledger(config.state_dir, config.policy.lock_timeout)
        self.audit = AuditLog(config.state_dir)
        self.health = HealthFile(self.ledger)
        self.health.listeners.append(self._health_turned)
        self.policy = POLICIES[config.policy.placement]
        # gpu-alloc's state and its plugin's socket, then (once asked) the Engine's own
        # paths.  The shim's socket is the users' way in and vets every call: not protected.
        # Paths as dockerd sees them; without an Engine (tests, `gpu-alloc health`), as we do.
        root = EngineRoot(config.engine.socket) if engine is not None else None
        host = host or Host(engine=root)
        self.host = host.with_protected(config.state_dir, config.plugin.socket)
        self._inventory: tuple[object, Inventory | InventoryError] | None = None
        self._view: tuple[float, object, EngineView, Host] | None = None
        self._no_gpu: set[str] = set()  # containers inspected and found without GPUs
        self._lock = threading.Lock()  # held for no I/O: an event loop may wait on it
        self._loading = threading.Lock()  # held while NVML or the GPU file is read
        self._reconciling = threading.Condition()
        self._reconcile_running = False
        self._last_reconcile: tuple[float, bool, Report] | None = None
        self._rules = config.policy.rules
        self._policy_lock = threading.RLock()  # re-entrant: SIGHUP runs on the main thread
        self._rules_stamp = self._config_stamp()
        self._topology: cpus.Topology | None = None
        # Called (from any thread) after a lease ends here: the shim's queue wakes up.
        self.listeners: list[Callable[[], None]] = []
        # The creates waiting in line (the shim's Waitline sets it): what they keep, every
        # lease leaves alone (allocator/lineup.py).
        self.waiting: Callable[[], list[Waiter]] = list

    def record(self, kind: str, lease: Lease | None = None, **fields: Unpack[AuditFields]) -> None:
        """One audit line for a decision already applied (never under the ledger lock)."""
        if lease is not None:
            fields = {
                "gpus": lease.gpus,
                "container": lease.container,
                "name": lease.name,
                "owner": lease.owner,
                **fields,
            }
        gpus = fields.get("gpus") or ()
        indices = {}
        if gpus:
            try:
                indices = {g.uuid: g.index for g in self.inventory().gpus}
            except InventoryError:  # the record matters more than the index
                indices = {}
        lease_id = lease.id if lease is not None else None
        self.audit.write(
            events.record(kind, ledger.now(), indices=indices, lease=lease_id, **fields)
        )

    def _health_turned(self, uuid: str, healthy: bool, what: str) -> None:
        self.record("health", gpus=(uuid,), reason=f"GPU {what}")

    def inventory(self, cached: bool = False) -> Inventory:
        """NVML is asked again every few seconds; a simulated file whenever it changes.

        A failure is remembered as long as a success would be, so a host whose NVML
        fails does not ask it again for every call that touches no GPU.  ``cached``:
        `Unasked` rather than load it now.
        """
        stamp = self._inventory_stamp()
        known = self._inventory
        if known is None or known[0] != stamp:
            if cached:
                raise Unasked("the GPU inventory")
            with self._loading:  # one load at a time; `_inventory` is read without waiting
                known = self._inventory
                if known is None or known[0] != stamp:
                    try:
                        loaded: Inventory | InventoryError = load_inventory(self.config.gpus)
                    except InventoryError as e:
                        loaded = e
                    known = self._inventory = (stamp, loaded)
        found = known[1]
        if isinstance(found, InventoryError):
            raise found
        return found

    def _inventory_stamp(self) -> object:
        if self.config.gpus == "nvml":
            return int(time.monotonic() // INVENTORY_MAX_AGE)
        return _file_stamp(self.config.gpus)  # None: load_inventory reports it

    def cpu_topology(self) -> cpus.Topology:
        """Read from sysfs once, on the first create that asks for cores or memory."""
        if self._topology is None:
            self._topology = host_cpus.read(self.config.sysfs)
        return self._topology

    def engine_view(self) -> EngineView:
        """The Engine's runtimes and version; without an Engine, judge it as the oldest."""
        return self._engine_facts()[0]

    def known_engine_view(self) -> EngineView | None:
        """The Engine's view if read lately, without asking it (for an event loop)."""
        known = self._known_view()
        return known[0] if known else None

    def _known_view(self) -> tuple[EngineView, Host] | None:
        """The view as read, while it is young and nothing says dockerd changed since: its
        daemon.json rewritten (what a SIGHUP reloads), its socket made again or the plugin
        activated (a restart).  Three stats, no Engine call."""
        stamp = self._engine_stamp()
        with self._lock:
            v = self._view
            if v and v[1] == stamp and time.monotonic() - v[0] < ENGINE_VIEW_MAX_AGE:
                return v[2], v[3]
        return None

    def _engine_stamp(self) -> object:
        sock = self.config.engine
        return tuple(
            _file_stamp(p) for p in (sock.daemon_json, sock.socket, self._activation_file())
        )

    def _activation_file(self) -> str:
        return os.path.join(os.path.dirname(os.path.abspath(self.config.plugin.socket)), ACTIVATED)

    def engine_activated(self) -> None:
        """dockerd (re)activated the plugin: every process reads the Engine's view again."""
        with self._lock:
            self._view = None
        path = self._activation_file()
        try:
            with open(path, "a"):
                os.utime(path)
        except OSError as e:
            log.warning("%s: cannot mark the activation: %s", path, e.strerror)

    def _engine_facts(self) -> tuple[EngineView, Host]:
        """What the Engine says it is, and the host with the Engine's own paths protected."""
        known = self._known_view()
        if known:
            return known
        stamp = self._engine_stamp()  # before the read: a change during it reads again
        view, host = EngineView(), self.host
        if self.engine is not None:
            info = self.engine.info()
            view = EngineView.from_info(info, self.engine.version())
            pending = _daemon_json(self.config.engine.daemon_json)
            if pending is not None:
                view = view.with_pending(pending)
            sock = self.config.engine
            host = host.with_protected(*engine_paths(info, sock.daemon_json, sock.socket))
        with self._lock:
            self._view = (time.monotonic(), stamp, view, host)
        return view, host

    def facts(self, engine_view: EngineView | None = None) -> Facts:
        """The facts for a decision; an unreadable inventory is one of them, not an error."""
        with_engine = self.engine is not None
        try:
            inventory, missing = self.inventory(), ""
        except InventoryError as e:
            inventory, missing = None, str(e)
        view, host = self._engine_facts()
        return Facts(
            inventory,
            engine_view or view,
            host,
            mounts_of=self._bind_mounts if with_engine else None,
            inventory_error=missing,
            volume_of=self._volume if with_engine else None,
            shim_socket=self.config.shim.socket,
            privileged_mode=self._rules.privileged,
            swarm_kind=self.config.swarm.kind,
        )

    def lazy_facts(self) -> Facts:
        """`facts`, read on first use: most calls are judged without the inventory or /info."""
        return cast(Facts, _LazyFacts(self))

    def cached_facts(self) -> Facts:
        """The facts as this process knows them already, for a decision on an event loop.

        Nothing is asked of the Engine or NVML, and of the filesystem only whether the
        simulated GPU file changed (a stat): a decision that needs a fact not at hand (the
        Engine's view gone stale, a bind's source, a volume, another container's mounts)
        raises `Unasked`, and is made again with `facts` where waiting blocks nobody.
        """
        try:
            inventory, missing = self.inventory(cached=True), ""
        except InventoryError as e:
            inventory, missing = None, str(e)
        known = self._known_view()
        if known is None:
            raise Unasked("the Engine's view")
        view, host = known
        with_engine = self.engine is not None
        return Facts(
            inventory,
            view,
            cast(HostFacts, _UnaskedHost(host.protected)),
            mounts_of=_unasked if with_engine else None,
            inventory_error=missing,
            volume_of=_unasked if with_engine else None,
            shim_socket=self.config.shim.socket,
            privileged_mode=self._rules.privileged,
            swarm_kind=self.config.swarm.kind,
        )

    def _volume(self, name: str) -> tuple[str, dict[str, str]] | None:
        """(driver, options) of the named volume; None when the Engine knows no such one."""
        info = self.engine.volume(name) if self.engine else None
        if info is None:
            return None
        return str(info.get("Driver") or "local"), dict(info.get("Options") or {})

    def _bind_mounts(self, container: str) -> list[tuple[str, str]] | None:
        info = self.engine.inspect(container) if self.engine else None
        if info is None:
            return None
        return [
            (str(m.get("Source") or ""), str(m.get("Destination") or ""))
            for m in info.get("Mounts") or ()
            if m.get("Type") == "bind"
        ]

    @property
    def rules(self) -> Rules:
        """The policy's limits, pools and defaults as the config file says now.

        The file is re-read when it changes (one stat, on the paths that lease GPUs) or on
        `reload_policy` (SIGHUP); a bad new file keeps the policy in force.
        """
        self.refresh_policy()
        return self._rules

    @property
    def rules_in_force(self) -> Rules:
        """The policy as last read, without a look at the file: for a call that may touch
        no GPU.  `watch_policy` keeps it within seconds of the file."""
        return self._rules

    def refresh_policy(self) -> None:
        """Re-read the policy if its file changed (its inode, mtime or size)."""
        stamp = self._config_stamp()
        if stamp != self._rules_stamp:
            self.reload_policy(stamp)

    def watch_policy(self, every: float = POLICY_CHECK_EVERY) -> None:
        """Look at the config file every ``every`` seconds from a thread of its own, so an
        edit is in force (or its error logged) within seconds, with no request asking."""

        def watch() -> None:
            while True:
                time.sleep(every)
                try:
                    self.refresh_policy()
                except Exception:  # a thread that died would stop every later reload
                    log.exception("policy not checked")

        threading.Thread(target=watch, name="policy-watch", daemon=True).start()

    def reload_policy(self, stamp: object = None) -> None:
        stamp = stamp or self._config_stamp()
        with self._policy_lock:
            self._rules_stamp = stamp
            try:
                new = configmod.load(self.config.source).policy.rules
                self._check_pools(new)
            except ConfigError as e:
                log.error("policy not reloaded, the one in force stays: %s", e)
                return
            if new != self._rules:
                log.info("policy reloaded from %s", self.config.source)
                self._rules = new

    def _check_pools(self, rules: Rules) -> None:
        """A pool naming a GPU the host lacks is a `ConfigError`; with no inventory to read
        there is nothing to check against (a GPU create is refused then anyway)."""
        try:
            inventory = self.inventory()
        except InventoryError:
            return
        check_pools(self.config.source, rules, inventory)

    def _config_stamp(self) -> object:
        if self.config.source.startswith("<"):
            return None  # built in code (tests) or the defaults: nothing to re-read
        return _file_stamp(self.config.source)

    def start_failure_note(self, ref: str, message: str) -> str:
        """What to add to a start's failure ``message`` (`core.defaults.start_note`): one
        inspect, on the failure path only."""
        try:
            info = self.engine.inspect(ref) if self.engine else None
        except EngineError:
            return ""
        return defaults.start_note(message, ((info or {}).get("Config") or {}).get("Labels"))

    def unhealthy(self) -> dict[str, str]:
        """UUID -> its event; nothing when the operator turned health off."""
        return {} if self.config.health.disabled else self.health.read().unhealthy()


def check_pools(source: str, rules: Rules, inventory: Inventory) -> None:
    """`ConfigError`, naming the file and the key, for a pool naming a GPU the host lacks."""
    bad = missing_pool_gpus(rules, inventory)
    if bad is not None:
        raise ConfigError(f"{source}: key '{bad[0]}': {bad[1]}")


class _LazyFacts:
    """Stands in for `Facts`; computes them on the first attribute read."""

    def __init__(self, alloc: Gatherer):
        self._alloc = alloc
        self._facts: Facts | None = None

    def __getattr__(self, name: str) -> Any:
        if self._facts is None:
            self._facts = self._alloc.facts()
        return getattr(self._facts, name)


class Unasked(Exception):
    """A fact `Gatherer.cached_facts` does not have: decide again with `Gatherer.facts`."""


def _unasked(*_: object) -> Any:
    raise Unasked("a lookup")


class _UnaskedHost:
    """The host's filesystem, never asked: any question means the decision waits."""

    def __init__(self, protected: tuple[str, ...]):
        self.protected = protected

    def __getattr__(self, name: str) -> Any:
        return _unasked


def _file_stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _daemon_json(path: str) -> EngineView | None:
    """daemon.json as dockerd will read it at its next reload; None when there is none to
    read (dockerd then runs on its flags alone)."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return EngineView.from_daemon_json(data) if isinstance(data, dict) else None
