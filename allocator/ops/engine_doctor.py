"""`gpu-alloc doctor`'s lines on the Engine's own doors: what a build can be given, and
the Engine's known security advisories by its version.  The decisions are the core's
(allocator/core/access/builds.py, allocator/core/access/advisories.py); this reads the Engine's
version, the daemon.json dockerd reads, its flags and when it started.
"""

from __future__ import annotations

import json
from pathlib import Path

from allocator.core.access import advisories as known
from allocator.core.access import builds as build_door
from allocator.core.access.facts import engine_version
from allocator.host import dockerd
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError

OK, WARN, FAIL = "ok", "warn", "FAIL"
Verdict = tuple[str, str, str]  # (status, what, fix), as doctor's Line takes them


def builds(cfg: Config) -> Verdict:
    """What a build step can be given (allocator/core/build_door.py): the daemon.json dockerd
    reads, its flags, its version; a door closed in the file counts once dockerd has
    started after the file was written (it reads the builder settings when it starts)."""
    try:
        version = engine_version(
            str(Engine(cfg.engine.socket, cfg.engine.timeout).version().get("Version") or "")
        )
    except EngineError as e:
        return WARN, f"builds: not checked: {e}", ""
    found = dockerd.config_file(cfg.engine.socket)
    path = found[1] if found else Path(cfg.engine.daemon_json)
    named = found[0] if found else cfg.engine.daemon_json
    try:
        data = json.loads(path.read_text())
        builder = build_door.Builder.from_daemon_json(data if isinstance(data, dict) else {})
    except FileNotFoundError:
        builder = build_door.UNSET
    except (OSError, ValueError) as e:
        return WARN, f"builds: {named} not read ({e})", ""
    engine = dockerd.running(cfg.engine.socket)
    if engine is not None:
        builder = builder.with_flags(engine.flags("--allow-insecure-entitlement"))
    doors = build_door.open_doors(version, builder)
    ways = (
        "gRPC on the Engine's socket (which no plugin sees), POST /grpc"
        if build_door.native_grpc(version)
        else "POST /grpc"
    )
    if doors:
        fix = build_door.FIX.replace("daemon.json", named)
        if builder.security_insecure or builder.insecure_flag:
            fix += (
                '; remove "security-insecure" from builder.entitlements and '
                "security.insecure from --allow-insecure-entitlement"
            )
        return (
            FAIL,
            f"builds: a build step can be given GPUs no lease covers, by {ways}: "
            + "; ".join(doors),
            fix,
        )
    born = dockerd.started(engine.pid) if engine is not None else None
    try:
        written = path.stat().st_mtime
    except OSError:
        written = None
    if (
        builder.device is False
        and born is not None
        and written is not None
        and dockerd.after_start(written, born)
    ):
        return (
            FAIL,
            f"builds: {named} closes the device entitlement, but dockerd (pid "
            f"{engine.pid if engine else '?'}) started before it was written and reads it "
            "only at its start",
            "systemctl restart docker",
        )
    return OK, f"builds: no build step can be given a device (reached by {ways})", ""


def advisories(cfg: Config) -> tuple[str, str, str, tuple[str, ...]]:
    """The Engine's known advisories by its version (allocator/core/access/advisories.py):
    a short line naming each, and what each means on this host as the details."""
    try:
        text = str(Engine(cfg.engine.socket, cfg.engine.timeout).version().get("Version") or "")
    except EngineError as e:
        return WARN, f"Engine advisories: not checked: {e}", "", ()
    version = engine_version(text)
    if version is None:
        return WARN, f"Engine advisories: version '{text}' not understood; none checked", "", ()
    found = known.affecting(version)
    if not found:
        count = len(known.ADVISORIES)
        return OK, f"Engine advisories: Engine {text} is affected by none of {count} known", "", ()
    each = "".join(f"\n       {a.cve}: {a.what}; fixed in {a.fixed_in}" for a in found)
    details = tuple(f"{a.cve} here: {a.bearing}" for a in found)
    fix = "upgrade Docker Engine to " + ", ".join(f"{a.fixed_in} ({a.cve})" for a in found)
    if "+dfsg" in text:
        fix += "; a Debian package may carry a fix the version does not show (its changelog says)"
    severe = any(a.severe for a in found)
    what = f"Engine advisories: Engine {text} is affected by {len(found)}:{each}"
    return (FAIL if severe else WARN, what, fix, details)
