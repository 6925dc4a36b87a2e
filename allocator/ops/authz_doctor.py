"""`gpu-alloc doctor`'s lines on dockerd's authorization chain: where the plugin is named
(daemon.json or dockerd's command line, never both), a managed plugin under its name,
and gpu-alloc's plugin reached under another name than ``plugin.name``.

Each piece of advice is one dockerd will take: a plugin named twice, or named where
dockerd cannot find it, stops dockerd starting (tests/engine/test_doctor.py follows each
on a real dockerd).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from allocator.core.access import plugins
from allocator.core.access.facts import EngineView
from allocator.host import dockerd
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError

OK, WARN, FAIL = "ok", "warn", "FAIL"
Verdict = tuple[str, str, str] | tuple[str, str]  # (status, what, fix), as doctor's Line takes them


def daemon_json(cfg: Config) -> Verdict:
    """The plugin named where dockerd takes it from: daemon.json, or its command line,
    never both (dockerd then refuses to start)."""
    path = cfg.engine.daemon_json
    engine = dockerd.running(cfg.engine.socket)
    flagged = engine.flags("--authorization-plugin") if engine is not None else []
    by_flag = (
        f"{path}: leaves authorization plugins to dockerd's command line, which names "
        f"{cfg.plugin.name} (--authorization-plugin)"
    )
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        if cfg.plugin.name in flagged:
            return (OK, by_flag)
        return (
            WARN,
            f"{path}: missing (the plugin may be named on dockerd's command line)",
            "run deploy/install.sh",
        )
    except (OSError, ValueError) as e:
        return (FAIL, f"{path}: unreadable ({e})", "fix the JSON; dockerd will not start")
    if flagged and "authorization-plugins" in data:
        return (
            FAIL,
            f'{path}: "authorization-plugins" is set, and dockerd\'s command line has '
            f"--authorization-plugin ({', '.join(flagged)}): dockerd refuses to start with "
            "both at its next restart",
            f'remove "authorization-plugins" from {path}, or the flags from dockerd\'s unit',
        )
    if cfg.plugin.name in flagged:
        return (OK, by_flag)
    named = list(data.get("authorization-plugins") or []) if isinstance(data, dict) else []
    ours = ours_as(cfg, [*flagged, *named], engine)
    if ours is not None:  # dockerd reaches the plugin already, under another name
        return (
            WARN,
            f"{path}: dockerd consults gpu-alloc's plugin as '{ours[0]}', not "
            f"{cfg.plugin.name} (plugin.name)",
            rename(cfg, *ours),
        )
    if flagged:
        # Never a second place to name plugins: dockerd refuses to start with both.
        return (
            WARN,
            f"{path}: dockerd's command line names the authorization plugins "
            f"({', '.join(flagged)}), without {cfg.plugin.name}",
            f"add --authorization-plugin={cfg.plugin.name} to dockerd's command line "
            "(systemctl cat docker), not to daemon.json",
        )
    if cfg.plugin.name not in named:
        # The Engine check above says whether dockerd uses the plugin; a plugin named
        # nowhere dockerd reads at its next start is lost then.
        return (
            WARN,
            f'{path}: "authorization-plugins" does not name {cfg.plugin.name}',
            "run deploy/install.sh (it merges the entry and keeps a backup)",
        )
    return (OK, f"{path}: names the {cfg.plugin.name} authorization plugin")


# Where dockerd finds plugins that are no managed plugins (moby pkg/plugins/discovery.go).
SOCKET_DIRS = ("/run/docker/plugins",)
SPEC_DIRS = ("/etc/docker/plugins", "/usr/lib/docker/plugins")


def managed_plugins(cfg: Config) -> Verdict:
    """A managed plugin under a configured authorization plugin's name: dockerd consults
    it, not a socket or spec file of that name, from its next reload (moby
    plugin/store.go ``Get``), and a disabled one fails every call."""
    engine = Engine(cfg.engine.socket, cfg.engine.timeout)
    try:
        info, listed = engine.info(), engine.plugins()
    except EngineError as e:
        return (WARN, f"managed plugins: not checked: {e}")
    view = EngineView.from_info(info)
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(Path(cfg.engine.daemon_json).read_text())
        if isinstance(data, dict):  # the names dockerd takes at its next reload count too
            view = view.with_pending(EngineView.from_daemon_json(data))
    root = info.get("DockerRootDir") or "/var/lib/docker"
    for name in view.authz_chain:
        for p in plugins.resolves(name, listed):
            what = f"managed plugin {p.get('Name')} (id {str(p.get('Id'))[:12]})"
            fix = (
                f"systemctl stop docker && rm -rf {root}/plugins/{p.get('Id')} && "
                "systemctl start docker (gpu-alloc refuses removing it through the API)"
            )
            legacy = _legacy_plugin(name)
            if legacy:
                return (
                    FAIL,
                    f"{what} takes the authorization plugin name '{name}' from {legacy}: "
                    "dockerd consults it instead from its next reload or restart",
                    fix,
                )
            if not p.get("Enabled") or not plugins.is_authz(p):
                return (
                    FAIL,
                    f"{what} is the authorization plugin '{name}' but is disabled or no "
                    "authz plugin: dockerd fails every call from its next reload",
                    f"docker plugin enable {p.get('Name')}, or {fix}",
                )
    names = ", ".join(view.authz_chain) or "none configured"
    return (
        OK,
        f"managed plugins: {len(listed)}, none under an authorization plugin's name ({names})",
    )


def _legacy_plugin(name: str, root: Path = Path("/")) -> str:
    """The socket or spec file dockerd would find ``name`` by, were no managed plugin so
    named (as dockerd names it; ``root``: dockerd's root, through /proc); empty when none."""
    found = [os.path.join(d, f"{name}.sock") for d in SOCKET_DIRS]
    found += [os.path.join(d, name, f"{name}.sock") for d in SOCKET_DIRS]
    found += [os.path.join(d, f"{name}{ext}") for d in SPEC_DIRS for ext in (".spec", ".json")]
    return next((f for f in found if (root / f.lstrip("/")).exists()), "")


def ours_as(
    cfg: Config, names: Iterable[str], engine: dockerd.Running | None
) -> tuple[str, str] | None:
    """(name, file): a name dockerd consults that reaches gpu-alloc's own plugin socket
    (by a socket or spec file of that name, in dockerd's root) though plugin.name is
    another.  Then the one advice dockerd will take is to set plugin.name: naming
    plugin.name to dockerd would make it look for a plugin it cannot find, and refuse
    to start."""
    root = engine.root if engine is not None else Path("/")
    for name in dict.fromkeys(names):
        found = _legacy_plugin(name, root) if name != cfg.plugin.name else ""
        address = _address(found, root) if found else None
        if address is not None and _same_file(root / address.lstrip("/"), cfg.plugin.socket):
            return name, found
    return None


def _address(found: str, root: Path) -> str | None:
    """The socket path a plugin socket, ``.spec`` (a URL) or ``.json`` spec (``Addr``)
    names, as dockerd reads it; None when not a unix socket."""
    path = root / found.lstrip("/")
    if path.suffix == ".sock":
        return found
    try:
        text = path.read_text()
        url = json.loads(text).get("Addr", "") if path.suffix == ".json" else text.strip()
    except (OSError, ValueError, AttributeError):
        return None
    return url.removeprefix("unix://") if str(url).startswith("unix://") else None


def _same_file(a: Path, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def rename(cfg: Config, name: str, found: str) -> str:
    return (
        f"set plugin.name: {name} in {cfg.source} (dockerd reaches gpu-alloc's plugin as "
        f"'{name}', by {found}), then systemctl restart gpu-alloc-plugin gpu-alloc-shim; "
        f"naming {cfg.plugin.name} to dockerd instead would stop it starting"
    )
