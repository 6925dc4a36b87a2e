#!/usr/bin/env python3
"""Edit Docker's daemon.json for install.sh / uninstall.sh (stdlib only).

dockerd refuses to start on a daemon.json it cannot parse, and every operator
key in it (data-root, runtimes, log options...) matters on a GPU host, so the
file is edited as JSON, never with sed: the operator's keys and any other
authorization plugins are kept, the change is idempotent, a timestamped backup
is written before the file is replaced (atomically, mode kept), and a file
that is not valid JSON -- or is ambiguous, such as a repeated key, which Go
and Python would each resolve in their own way -- is refused unchanged.

`add` also sets ``"builder": {"entitlements": {"device": false}}``: dockerd 29+ lets a
build step be given any CDI device (every GPU) unless it is false, and no authorization
plugin sees a build's steps.  dockerd 20.10 to 28 ignore the key (verified by
tests/engine/test_build_door.py); it is read when dockerd starts, so a restart applies
it.  `remove` leaves it: it is harmless without gpu-alloc too.

Subcommands (exit 0 = done or nothing to do, 1 = --check: a change is needed,
2 = refused, file untouched):
    add FILE [--plugin NAME] [--check]
    remove FILE [--plugin NAME] [--check]
    inspect FILE     print {"default_runtime", "runtimes", "authorization_plugins"}
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEY = "authorization-plugins"
BUILDER, ENTITLEMENTS, DEVICE = "builder", "entitlements", "device"
DEFAULT_PLUGIN = "gpu-alloc"
EXIT_CHANGE_NEEDED = 1
EXIT_REFUSED = 2


class Refused(Exception):
    """The file cannot be edited safely; the message says why and what to fix."""


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise Refused(f"key '{key}' appears twice; remove one of them")
        seen[key] = value
    return seen


def load(path: Path) -> dict[str, Any] | None:
    """The parsed file, or None when it does not exist (an empty file counts as {})."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    if not text.strip():
        return {}
    try:
        data = json.loads(text, object_pairs_hook=_no_repeated_keys)
    except json.JSONDecodeError as e:
        raise Refused(
            f"{path}: not valid JSON ({e}); fix it first, dockerd cannot read it either"
        ) from None
    except Refused as e:
        raise Refused(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise Refused(f"{path}: the top level must be a JSON object")
    return data


def _plugins(data: dict[str, Any], path: Path) -> list[str]:
    plugins = data.get(KEY, [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise Refused(f"{path}: '{KEY}' must be a list of plugin names")
    return plugins


def _object(data: dict[str, Any], key: str, path: Path, where: str) -> dict[str, Any]:
    """``data[key]`` ({} when absent), refused when not an object or when another key is
    one Go would decode into the same field (dockerd matches them case-insensitively)."""
    for other in data:
        if other != key and other.lower() == key:
            raise Refused(f"{path}: {where}'{other}' is spelled unlike '{key}'; rename it")
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise Refused(f"{path}: {where}'{key}' must be a JSON object")
    return value


def _builds_closed(current: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """``current`` with builder.entitlements.device false, or None when it already is."""
    builder = _object(current, BUILDER, path, "")
    entitlements = _object(builder, ENTITLEMENTS, path, f"'{BUILDER}': ")
    _object({k: {} for k in entitlements}, DEVICE, path, f"'{BUILDER}.{ENTITLEMENTS}': ")
    if entitlements.get(DEVICE) is False:
        return None
    return {**current, BUILDER: {**builder, ENTITLEMENTS: {**entitlements, DEVICE: False}}}


def updated(data: dict[str, Any] | None, path: Path, op: str, name: str) -> dict[str, Any] | None:
    """The new content, or None when the file already says what `op` wants."""
    current = {} if data is None else data
    plugins = _plugins(current, path)
    if op == "add":
        new = current if name in plugins else {**current, KEY: [*plugins, name]}
        new = _builds_closed(new, path) or new
        return None if new == current else new
    if name not in plugins:
        return None
    rest = [p for p in plugins if p != name]
    new = {k: v for k, v in current.items() if k != KEY}
    if rest:
        new[KEY] = rest
    return new


def backup(path: Path) -> Path:
    """Copy the file to FILE.bak.<UTC time>, never overwriting an earlier backup."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.bak.{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.bak.{stamp}.{n}")
        n += 1
    shutil.copy2(path, target)
    return target


def write(path: Path, data: dict[str, Any]) -> None:
    """Replace the file atomically, keeping its mode (0644 for a new file)."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def edit(path: Path, op: str, name: str, check: bool) -> int:
    data = load(path)
    new = updated(data, path, op, name)
    old = data or {}
    plugin_change = new is not None and new.get(KEY) != old.get(KEY)
    builds_change = new is not None and new.get(BUILDER) != old.get(BUILDER)
    if not plugin_change:
        print(f"{path}: '{KEY}' already {'lists' if op == 'add' else 'omits'} {name}")
    if op == "add" and not builds_change:
        print(f"{path}: builds already get no devices (builder.entitlements.device false)")
    if new is None:
        return 0
    if check:
        if plugin_change:
            print(f"{path}: would {op} {name} {'to' if op == 'add' else 'from'} '{KEY}'")
        if builds_change:
            print(f"{path}: would set builder.entitlements.device to false")
        return EXIT_CHANGE_NEEDED
    if data is not None:
        print(f"{path}: backup written to {backup(path)}")
    write(path, new)
    if plugin_change:
        done = "added" if op == "add" else "removed"
        print(f"{path}: {done} {name} {'to' if op == 'add' else 'from'} '{KEY}'")
    if builds_change:
        print(
            f"{path}: set builder.entitlements.device to false (Docker 29+ would give a "
            "build step any CDI device, every GPU included); dockerd reads it when it starts"
        )
    return 0


def inspect(path: Path) -> int:
    data = load(path) or {}
    runtimes = data.get("runtimes", {})
    summary = {
        "default_runtime": data.get("default-runtime"),
        "runtimes": sorted(runtimes) if isinstance(runtimes, dict) else [],
        "authorization_plugins": _plugins(data, path),
        "build_devices_closed": _builds_closed(data, path) is None,
    }
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="op", required=True)
    for op in ("add", "remove"):
        p = sub.add_parser(op, help=f"{op} the plugin in '{KEY}'")
        p.add_argument("file", type=Path)
        p.add_argument("--plugin", default=DEFAULT_PLUGIN)
        p.add_argument("--check", action="store_true", help="report, change nothing")
    p = sub.add_parser("inspect", help="print the runtime and authz settings as JSON")
    p.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.op == "inspect":
            return inspect(args.file)
        return edit(args.file, args.op, args.plugin, args.check)
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
