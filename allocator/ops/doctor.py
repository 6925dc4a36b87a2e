"""``gpu-alloc doctor``: check a host end to end, one line per check, each with its fix.

The checks run in order and each stands alone: a host with the plugin down
still gets told whether its state file and contexts are right.  A check is a
function from the config to a `Line`; the table `CHECKS` is the whole doctor.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from allocator.core.access.facts import EngineView
from allocator.core.leases import clock
from allocator.core.leases.events import rfc3339
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import StateError
from allocator.core.machine.inventory import InventoryError, MigPolicy
from allocator.core.rules.policy import missing_pool_gpus
from allocator.host import clock as hostclock
from allocator.host import dockerd, unixhttp
from allocator.host.config import Config
from allocator.host.devices import source_for
from allocator.host.engine import Engine, EngineError
from allocator.host.health import HealthFile
from allocator.host.ledger import Ledger
from allocator.ops import (
    authz_doctor,
    engine_doctor,
    notify,
    powers_doctor,
    sharing_doctor,
    swarm_doctor,
)

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Line:
    """One check's verdict: ``what`` starts with its row's name in docs/install.md's table;
    ``details``, shown only with ``--verbose``, say what a short line leaves out."""

    status: str
    what: str
    fix: str = ""
    details: tuple[str, ...] = ()

    def render(self, verbose: bool = False) -> str:
        text = f"[{self.status:>4}] {self.what}"
        if verbose:
            text += "".join(f"\n       {d}" for d in self.details)
        return text + (f"\n       fix: {self.fix}" if self.fix else "")


def check_inventory(cfg: Config) -> Line:
    source = source_for(cfg.gpus)
    try:
        inv = source.inventory()
    except InventoryError as e:
        return Line(FAIL, f"GPU inventory: {e}", source.advice())
    busy = [str(g.index) for g in inv.gpus if g.busy]
    what = f"GPU inventory: {len(inv.gpus)} GPU(s) via {source.describe()}"
    if not inv.gpus:
        return Line(FAIL, what, "no GPU found: check nvidia-smi")
    return Line(OK, what + (f"; busy with host processes: {', '.join(busy)}" if busy else ""))


def check_pools(cfg: Config) -> Line:
    """Pools against the GPUs the host has: a running shim and plugin refuse such a
    policy at a reload and keep the one they had, so only their logs would tell."""
    try:
        inv = source_for(cfg.gpus).inventory()
    except InventoryError as e:
        return Line(WARN, f"policy pools: not checked: {e}")
    bad = missing_pool_gpus(cfg.policy.rules, inv)
    if bad is not None:
        return Line(
            FAIL,
            f"policy pools: {bad[0]}: {bad[1]}; a running shim and plugin keep the policy "
            "they had before this edit",
            f"fix {bad[0]} in {cfg.source}",
        )
    return Line(OK, f"policy pools: {len(cfg.policy.rules.pools)} pool(s), on GPUs the host has")


def check_toolkit(cfg: Config) -> Line:
    """The hook on dockerd's own PATH: dockerd registers its nvidia driver only if it
    finds the hook there when it starts, whatever gpu-alloc's own PATH says."""
    names = ("nvidia-container-runtime-hook", "nvidia-ctk")
    engine = dockerd.running(cfg.engine.socket)
    if engine is None or engine.path is None:
        hook = next(filter(None, map(shutil.which, names)), None)
        seen = "on gpu-alloc's PATH (dockerd's own could not be read)"
    else:
        hook = next(filter(None, map(engine.which, names)), None)
        seen = f"on dockerd's PATH (pid {engine.pid})"
    if hook:
        return Line(OK, f"NVIDIA Container Toolkit: {hook}, {seen}")
    return Line(
        FAIL,
        f"NVIDIA Container Toolkit: nvidia-container-runtime-hook not {seen}",
        "install nvidia-container-toolkit, then nvidia-ctk runtime configure "
        "--runtime=docker and restart docker",
    )


def check_engine(cfg: Config) -> Line:
    try:
        info = Engine(cfg.engine.socket, cfg.engine.timeout).info()
    except EngineError as e:
        return Line(FAIL, f"Engine: {e}", f"start docker, or fix engine.socket in {cfg.source}")
    default = info.get("DefaultRuntime") or "runc"
    runtimes = sorted(info.get("Runtimes") or {})
    if EngineView.from_info(info).default_is_nvidia and not cfg.swarm.configured:
        return Line(
            FAIL,
            f"Engine: default runtime is '{default}': images' own "
            "NVIDIA_VISIBLE_DEVICES would grant GPUs",
            f'remove "default-runtime" from {cfg.engine.daemon_json}, restart docker',
        )
    authz = (info.get("Plugins") or {}).get("Authorization") or []
    line = (
        f"Engine {info.get('ServerVersion', '?')}: default runtime {default}; "
        f"runtimes {', '.join(runtimes)}; authorization plugins {authz or 'none'}"
    )
    if cfg.plugin.name not in authz:
        engine = dockerd.running(cfg.engine.socket)
        ours = authz_doctor.ours_as(cfg, authz, engine)
        if ours is not None:
            return Line(FAIL, line, authz_doctor.rename(cfg, *ours))
        if engine is not None and engine.flags("--authorization-plugin"):
            fix = (
                f"add --authorization-plugin={cfg.plugin.name} beside the other "
                "--authorization-plugin flags on dockerd's command line (systemctl cat "
                "docker) and restart docker; not in daemon.json: dockerd refuses to start "
                "when a flag and the file both set it"
            )
        else:
            fix = (
                f'add "authorization-plugins": ["{cfg.plugin.name}"] to '
                f"{cfg.engine.daemon_json} (deploy/install.sh does) and restart docker"
            )
        return Line(FAIL, line, fix)
    return Line(OK, line)


def check_builds(cfg: Config) -> Line:
    return Line(*engine_doctor.builds(cfg))


def check_advisories(cfg: Config) -> Line:
    status, what, fix, details = engine_doctor.advisories(cfg)
    return Line(status, what, fix, details)


def check_daemon_json(cfg: Config) -> Line:
    return Line(*authz_doctor.daemon_json(cfg))


def check_managed_plugins(cfg: Config) -> Line:
    return Line(*authz_doctor.managed_plugins(cfg))


def check_config_file(cfg: Config) -> Line:
    """Does gpu-alloc watch the daemon.json dockerd reads (see allocator/host/dockerd.py)?"""
    found = dockerd.config_file(cfg.engine.socket)
    if found is None:
        return Line(
            WARN,
            "dockerd's config file: cannot tell which daemon.json dockerd reads",
            "start docker (gpu-alloc reads its command line in /proc)"
            if os.geteuid() == 0
            else "run gpu-alloc doctor as root (sudo), with dockerd running",
        )
    named, here = found
    try:
        same = os.path.samefile(here, cfg.engine.daemon_json)
    except OSError:  # either is missing: the same path is the same file
        same = os.path.normpath(named) == os.path.normpath(cfg.engine.daemon_json)
    if same:
        return Line(OK, f"dockerd's config file: {named}, the engine.daemon_json gpu-alloc watches")
    return Line(
        WARN,
        f"dockerd's config file: dockerd reads {named} (its --config-file), gpu-alloc watches "
        f"{cfg.engine.daemon_json}: an edit to {named} (a default runtime of nvidia) "
        "counts only when gpu-alloc next asks the Engine, up to 30 s later",
        f"set engine.daemon_json: {named} in {cfg.source}",
    )


def check_plugin(cfg: Config) -> Line:
    try:
        status, body = unixhttp.request(cfg.plugin.socket, "POST", "/Plugin.Activate", b"{}")
        implements = json.loads(body).get("Implements")
    except (OSError, ValueError, http.client.HTTPException) as e:
        return Line(
            FAIL,
            f"plugin at {cfg.plugin.socket}: not answering ({e})",
            "systemctl restart gpu-alloc-plugin; journalctl -u gpu-alloc-plugin",
        )
    if status != 200 or implements != ["authz"]:
        return Line(
            FAIL,
            f"plugin at {cfg.plugin.socket}: answered {status} {implements}",
            "another program owns this socket; check plugin.socket",
        )
    return Line(OK, f"plugin at {cfg.plugin.socket}: answers Plugin.Activate (authz)")


def check_shim(cfg: Config) -> Line:
    path = cfg.shim.socket
    try:
        status, _ = unixhttp.request(path, "GET", "/_ping")
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except (OSError, http.client.HTTPException) as e:
        return Line(
            FAIL,
            f"shim at {path}: not answering ({e})",
            "systemctl restart gpu-alloc-shim; journalctl -u gpu-alloc-shim",
        )
    if status != 200:
        return Line(
            FAIL,
            f"shim at {path}: /_ping answered {status}",
            "check that the Engine behind it is up (engine.socket)",
        )
    if mode & 0o007:
        return Line(
            WARN,
            f"shim at {path}: answers; mode {mode:o} lets everyone use Docker",
            "set shim.mode to 0660",
        )
    return Line(OK, f"shim at {path}: answers /_ping; mode {mode:o}")


def check_state(cfg: Config) -> Line:
    ledger = Ledger(cfg.state_dir, cfg.policy.lock_timeout)
    try:
        state = ledger.read()
    except StateError as e:
        return Line(FAIL, f"state: {e}", "gpu-alloc repair --reset")
    what = f"state {ledger.path}: {len(state.leases)} lease(s), {len(state.claims)} claim(s)"
    try:
        mode = stat.S_IMODE(os.stat(cfg.state_dir).st_mode)
    except FileNotFoundError:
        return Line(OK, f"state {cfg.state_dir}: not created yet (made on first lease)")
    if mode & 0o077:
        return Line(WARN, f"{what}; directory mode {mode:o}", f"chmod 700 {cfg.state_dir}")
    return Line(OK, what)


def check_clock(cfg: Config) -> Line:
    """The wall clock against the boot's, as the shim last compared them
    (allocator/host/clock.py): limits never go by the wall clock, reservations do."""
    now = hostclock.read()
    if now.mark is None:
        return Line(
            WARN,
            f"clock: this boot's id ({hostclock.BOOT_ID}) is unreadable, so time limits, "
            "pending leases and release_stopped_after go by the wall clock, which a clock "
            "change moves",
            "mount /proc as the kernel provides it",
        )
    moved = hostclock.jumped(Path(cfg.state_dir))
    if moved is None or moved.boot_id != now.boot_id:
        return Line(OK, "clock: the wall clock has kept to the boot's since the shim started")
    behind = now.wall - clock.schedule(now, moved)
    return Line(
        WARN,
        f"clock: the wall clock moved by {clock.described(moved)} at {rfc3339(moved.at)}; "
        "time limits go by the boot's clock as ever, and reservations are held to the "
        f"clock from before the move ({ago(round(behind))} behind the wall clock) until the shim "
        "restarts",
        "if the new time is right, systemctl restart gpu-alloc-shim; else set the clock back",
    )


def check_context(cfg: Config) -> Line:
    """A docker context pointing at the shim, in the invoking user's docker config."""
    homes = []
    if os.environ.get("DOCKER_CONFIG"):
        homes.append(os.environ["DOCKER_CONFIG"])
    user = os.environ.get("SUDO_USER")
    if user:
        homes.append(os.path.expanduser(f"~{user}/.docker"))
    homes.append(os.path.expanduser("~/.docker"))
    want = f"unix://{cfg.shim.socket}"
    for home in homes:
        for meta in glob.glob(os.path.join(home, "contexts/meta/*/meta.json")):
            try:
                data = json.loads(Path(meta).read_text())
            except (OSError, ValueError):
                continue
            host = ((data.get("Endpoints") or {}).get("docker") or {}).get("Host")
            if host == want:
                return Line(OK, f"context: '{data.get('Name')}' points at the shim")
    return Line(
        WARN,
        f"context: none points at {want} (checked {', '.join(homes)})",
        f"as each user: docker context create gpu-alloc --docker host={want}",
    )


def check_health(cfg: Config) -> Line:
    """Unhealthy GPUs, and GPUs in MIG mode that ``policy.mig: none`` never leases."""
    try:
        inv = source_for(cfg.gpus).inventory()
        sick = HealthFile(Ledger(cfg.state_dir)).read().unhealthy()
    except (InventoryError, StateError) as e:
        return Line(WARN, f"GPU health: not checked: {e}")
    if cfg.health.disabled:
        return Line(WARN, "GPU health: not watched (health.disabled)", f"edit {cfg.source}")
    named = [f"GPU {g.index} ({sick[g.uuid]})" for g in inv.gpus if g.uuid in sick]
    if named:
        first = next(g.index for g in inv.gpus if g.uuid in sick)
        return Line(
            WARN,
            f"GPU health: not granted until cleared: {'; '.join(named)}",
            f"fix the GPU (nvidia-smi -q, a reset, a reboot), then: gpu-alloc health clear {first}",
        )
    split = [str(g.index) for g in inv.gpus if g.mig_mode]
    if split and cfg.policy.mig is MigPolicy.NONE:
        return Line(
            WARN,
            f"GPU health: healthy; GPUs {', '.join(split)} are in MIG mode and never leased "
            "under policy.mig: none",
            f"set policy.mig to single or mixed in {cfg.source}",
        )
    return Line(OK, f"GPU health: every GPU healthy; {len(inv.migs)} MIG slice(s)")


def check_swarm(cfg: Config) -> Line:
    return Line(*swarm_doctor.check(cfg))


def check_sharing(cfg: Config) -> Line:
    return Line(*sharing_doctor.check(cfg))


def check_notify(cfg: Config) -> Line:
    return Line(*notify.check(cfg))


def check_powers(cfg: Config) -> Line:
    return Line(*powers_doctor.check(cfg))


CHECKS: tuple[Callable[[Config], Line], ...] = (
    check_inventory,
    check_pools,
    check_toolkit,
    check_engine,
    check_builds,
    check_advisories,
    check_daemon_json,
    check_managed_plugins,
    check_config_file,
    check_plugin,
    check_shim,
    check_state,
    check_health,
    check_swarm,
    check_sharing,
    check_powers,
    check_notify,
    check_clock,
    check_context,
)


def run(cfg: Config) -> tuple[list[Line], bool]:
    """Every check's line, and whether none FAILed."""
    lines = [check(cfg) for check in CHECKS]
    return lines, all(line.status != FAIL for line in lines)
