"""The facts a decision is made against, gathered from the host and the Engine.

One part of the composed service (allocator/service/wiring.py): the other parts ask it for
facts (the inventory, what the Engine says it is, the host's filesystem answers, the
policy in force, the GPUs' health), hand them to the pure core, and apply what the core
returns.  It records nothing and holds no ledger.  Each fact is cached for as long as
it stays true: the simulated GPU file until it changes, NVML and the Engine's view for a
few seconds, the policy until its file changes; an unreadable inventory is itself a
fact, so work that touches no GPU goes on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from allocator.core.access.facts import EngineView, HostFacts, Need, NotAsked
from allocator.core.api import refs
from allocator.core.judging.decisions import EVERY_FACT, Fact, Unread
from allocator.core.judging.verdicts import Facts, unread
from allocator.core.machine import cpus
from allocator.core.machine.inventory import Inventory, InventoryError
from allocator.core.rules.policy import Rules, missing_pool_gpus
from allocator.host import config as configmod
from allocator.host import config_reload, dockerd
from allocator.host import cpus as host_cpus
from allocator.host.config import Config, ConfigError, PolicyConfig
from allocator.host.devices import DeviceSource, source_for
from allocator.host.engine import Engine
from allocator.host.engineroot import EngineRoot
from allocator.host.filesystem import Host, api_sockets, engine_paths
from allocator.host.health import HealthFile

if TYPE_CHECKING:
    from allocator.service.background import Background

POLICY_CHECK_EVERY = 2.0  # seconds between the running services' looks at the config file
log = logging.getLogger("gpu-alloc")
ENGINE_VIEW_MAX_AGE = 30.0
T = TypeVar("T")
ACTIVATED = "gpu-alloc.activated"  # touched when dockerd activates the plugin: a new dockerd


class Gatherer:
    """The facts a decision is made against, each cached for as long as it stays true.

    ``engine`` None: no Engine to ask (tests of the ledger alone, `gpu-alloc health`).
    ``health``: the GPUs' health file, read by `unhealthy`.
    """

    def __init__(
        self,
        config: Config,
        engine: Engine | None,
        health: HealthFile,
        host: Host | None = None,
    ):
        self.config = config
        self.engine = engine
        self.health = health
        self.devices: DeviceSource = source_for(config.gpus)  # the GPUs' source, chosen once
        # gpu-alloc's state and its plugin's socket, then (once asked) the Engine's own
        # paths.  The shim's socket is the users' way in and vets every call: not protected.
        # Paths as dockerd sees them; without an Engine (tests, `gpu-alloc health`), as we do.
        root = EngineRoot(config.engine.socket) if engine is not None else None
        host = host or Host(engine=root)
        self.host = replace(
            host.with_protected(config.state_dir, config.plugin.socket, config.mps.dir),
            mps_dir=config.mps.dir,
        )
        self._inventory: tuple[object, Inventory | InventoryError] | None = None
        self._view: tuple[float, object, EngineView, Host] | None = None
        self._lock = threading.Lock()  # held for no I/O: an event loop may wait on it
        self._loading = threading.Lock()  # held while NVML or the GPU file is read
        self._policy = config.policy
        # Told the new policy after each reload that changed it (the locks' timeouts).
        self.policy_listeners: list[Callable[[PolicyConfig], None]] = []
        self._policy_lock = threading.RLock()  # re-entrant: SIGHUP runs on the main thread
        self._rules_stamp = self._config_stamp()
        self._topology: cpus.Topology | None = None

    def inventory(self) -> Inventory:
        """NVML is asked again every few seconds; a simulated file whenever it changes.

        A failure is remembered as long as a success would be, so a host whose NVML
        fails does not ask it again for every call that touches no GPU.
        """
        stamp = self._inventory_stamp()
        known = self._inventory
        if known is None or known[0] != stamp:
            with self._loading:  # one load at a time; `_inventory` is read without waiting
                known = self._inventory
                if known is None or known[0] != stamp:
                    try:
                        loaded: Inventory | InventoryError = self.devices.inventory()
                    except InventoryError as e:
                        loaded = e
                    known = self._inventory = (stamp, loaded)
        found = known[1]
        if isinstance(found, InventoryError):
            raise found
        return found

    def _inventory_stamp(self) -> object:
        return self.devices.stamp()

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
            daemon = dockerd.running(self.config.engine.socket)
            if daemon is not None:
                allowed = daemon.flags("--allow-insecure-entitlement")
                view = replace(view, builder=view.builder.with_flags(allowed))
            pending = _daemon_json(self.config.engine.daemon_json)
            if pending is not None:
                view = view.with_pending(pending)
            sock = self.config.engine
            host = host.with_protected(*engine_paths(info, sock.daemon_json, sock.socket))
            host = host.with_engine_sockets(*api_sockets(sock.daemon_json, sock.socket))
        host = host.with_resolved()  # links followed again at each read of the view
        with self._lock:
            self._view = (time.monotonic(), stamp, view, host)
        return view, host

    def facts(self) -> Facts:
        """Every fact, read now; an unreadable inventory is one of them, not an error.
        Decisions get theirs through `decide`."""
        try:
            found: Inventory | InventoryError = self.inventory()
        except InventoryError as e:
            found = e
        return self._facts(found, *self._engine_facts())

    def _facts(self, found: Inventory | InventoryError, view: EngineView, host: HostFacts) -> Facts:
        """The one place `Facts` are made: from the inventory (or why it is missing), the
        Engine's view and the host, read now or (`NotAsked`) not asked; the Engine's
        lookups are the host's then, or none without an Engine."""
        inventory = None if isinstance(found, InventoryError) else found
        lookups = self.engine is not None
        unasked = host if isinstance(host, NotAsked) else None
        rules = self._policy.rules
        if rules.grants_owners and unasked is None:
            # who may bind the Engine's socket, and who holds which power, as the policy
            # was last reloaded
            host = replace(  # type: ignore[type-var]
                host, binders=rules.engine_socket_binds, power_grants=rules.powers
            )
        return Facts(
            inventory,
            view,
            host,
            container_of=(unasked.container_of if unasked else self.could_name)
            if lookups
            else None,
            inventory_error="" if inventory is not None else str(found),
            volume_of=(unasked.volume_of if unasked else self._volume) if lookups else None,
            shim_socket=self.config.shim.socket,
            privileged_mode=self._policy.rules.privileged,
            swarm_kind=self.config.swarm.kind,
        )

    def decide(
        self, verdict: Callable[[Facts], T], reads: frozenset[Fact] = EVERY_FACT, now: bool = False
    ) -> T:
        """The one way a decision gets its facts: ``verdict`` on the facts it ``reads``
        (its declaration: `verdicts.reads_facts`), those at hand when they suffice
        (`at_hand`), else read now and asked once more.  None read when it reads none.
        ``now``: read now, never at hand (a verdict that itself asks the Engine, such as
        reconcile's; one whose facts were not at hand a moment ago).

        A verdict that reads a fact outside ``reads`` (`Unread`) is made again on every
        fact, never on a default; under `STRICT_ENV` (the tests) that is an error."""
        if not reads:
            try:
                return verdict(unread())
            except Unread as e:
                _drifted(e)
            reads = EVERY_FACT
        got = Need("facts read now") if now else self.at_hand(verdict, reads)
        return _given(verdict, self.facts(), reads) if isinstance(got, Need) else got

    def at_hand(
        self, verdict: Callable[[Facts], T], reads: frozenset[Fact] = EVERY_FACT
    ) -> T | Need:
        """``verdict`` on the facts this process holds already, for a decision where
        nothing may wait (an event loop); `Need`, naming the fact, when it asked for one
        not at hand: the Engine's view gone stale, the inventory changed since it was
        read, or the host's filesystem and the Engine's lookups (`NotAsked`).

        Nothing is asked of the Engine or NVML, and of the filesystem only whether the
        simulated GPU file or the Engine's files changed (stats).
        """
        known = self._known_view()
        if known is None:
            return Need("the Engine's view")
        held = self._inventory
        if held is None or held[0] != self._inventory_stamp():
            return Need("the GPU inventory")
        view, host = known
        facts = self._facts(held[1], view, NotAsked(host.protected))
        got = _given(verdict, facts, reads)
        return Need(facts.needs) if facts.needs else got

    def _volume(self, name: str) -> tuple[str, dict[str, str]] | None:
        """(driver, options) of the named volume; None when the Engine knows no such one."""
        info = self.engine.volume(name) if self.engine else None
        if info is None:
            return None
        return str(info.get("Driver") or "local"), dict(info.get("Options") or {})

    def could_name(self, ref: str) -> list[dict[str, Any]]:
        """Each container dockerd could take ``ref`` for by the time it acts, as the
        Engine inspects it (`access_ctx.ContainerOf`): the one ``ref`` names now, and
        where ``ref`` reads as an id prefix (`refs`), every container whose id begins
        with it, which a rename of the one it names would leave it naming.  Empty: it
        names none now."""
        if self.engine is None:
            return []
        ref = ref.removeprefix("/")  # dockerd's own spelling of a name
        named = self.engine.inspect(ref)
        found = [named] if named is not None else []
        if not refs.may_be_prefix(ref):
            return found
        seen = {str(named["Id"])} if named is not None else set()
        for listed in self.engine.containers(ids=[ref]):  # a filter by pattern, not prefix
            cid = str(listed.get("Id") or "")
            if refs.may_name(ref, cid) and cid not in seen:
                info = self.engine.inspect(cid)
                if info is not None:
                    found.append(info)
        return found

    @property
    def policy(self) -> PolicyConfig:
        """Every key under ``policy:`` as the config file says now.

        The file is re-read when it changes (one stat, on the paths that lease GPUs) or on
        `reload_policy` (SIGHUP); a bad new file keeps the policy in force.
        """
        self.refresh_policy()
        return self._policy

    @property
    def policy_in_force(self) -> PolicyConfig:
        """The policy as last read, without a look at the file: for a call that may touch
        no GPU.  `watch_policy` keeps it within seconds of the file."""
        return self._policy

    @property
    def rules(self) -> Rules:
        """The policy's limits, pools and defaults as the config file says now."""
        return self.policy.rules

    @property
    def rules_in_force(self) -> Rules:
        """The policy's rules as last read, without a look at the file."""
        return self._policy.rules

    def refresh_policy(self) -> None:
        """Re-read the policy if its file changed (its inode, mtime or size)."""
        stamp = self._config_stamp()
        if stamp != self._rules_stamp:
            self.reload_policy(stamp)

    def watch_policy(self, background: Background, every: float = POLICY_CHECK_EVERY) -> None:
        """Look at the config file every ``every`` seconds from a worker of ``background``,
        so an edit is in force (or its error logged) within seconds, with no request asking."""
        background.every("policy-watch", every, self.refresh_policy)

    def reload_policy(self, stamp: object = None) -> None:
        stamp = stamp or self._config_stamp()
        with self._policy_lock:
            self._rules_stamp = stamp
            try:
                if not os.path.getsize(self.config.source):
                    # Caught between an in-place write's truncation and its write: an empty
                    # file read as a config would lift every limit until the next look.
                    raise ConfigError(f"{self.config.source} is empty")
                read = configmod.load(self.config.source)
                new = read.policy
                self._check_pools(new.rules)
            except OSError as e:
                log.error("policy not reloaded, the one in force stays: %s", e)
                return
            except ConfigError as e:
                log.error("policy not reloaded, the one in force stays: %s", e)
                return
            later = config_reload.restart_changes(self.config, read)
            if later:
                log.warning("%s changed in %s: needs a restart", ", ".join(later), read.source)
            if new != self._policy:
                changed = config_reload.policy_changes(self._policy, new)
                log.info("policy reloaded from %s: %s", self.config.source, ", ".join(changed))
                self._policy = new
                for tell in self.policy_listeners:
                    tell(new)

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

    def unhealthy(self) -> dict[str, str]:
        """UUID -> its event; nothing when the operator turned health off."""
        return {} if self.config.health.disabled else self.health.read().unhealthy()


def check_pools(source: str, rules: Rules, inventory: Inventory) -> None:
    """`ConfigError`, naming the file and the key, for a pool naming a GPU the host lacks."""
    bad = missing_pool_gpus(rules, inventory)
    if bad is not None:
        raise ConfigError(f"{source}: key '{bad[0]}': {bad[1]}")


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


STRICT_ENV = "GPU_ALLOC_STRICT_FACTS"  # "1": a verdict's read of a fact not gathered fails


def _given(verdict: Callable[[Facts], T], facts: Facts, reads: frozenset[Fact]) -> T:
    """``verdict`` on ``facts`` with only ``reads`` readable; made again on all of them
    when it reads another (`Unread`: its declaration is wrong)."""
    try:
        return verdict(facts if reads >= facts.gathered else facts.only(reads))
    except Unread as e:
        _drifted(e)
    return verdict(facts)


def _drifted(e: Unread) -> None:
    """A verdict read a fact it does not declare: the tests fail on it; a running service
    logs it, and judges on every fact."""
    if os.environ.get(STRICT_ENV) == "1":
        raise e
    log.error("gpu-alloc bug: %s; judged again on every fact", e)
