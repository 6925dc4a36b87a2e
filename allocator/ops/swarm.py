"""`gpu-alloc swarm configure`: give this node's ``swarm.gpus`` to Docker Swarm.

Writes daemon.json (`swarm_files.daemon_json`) and the toolkit's config.toml
(`swarm_files.toolkit_toml`), each atomically and only when it changes, or with
``--dry-run`` prints the diff; either way it says what dockerd needs next, since
dockerd reads its generic resources only when it starts.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

from allocator.core.rules import swarm_files
from allocator.host import store
from allocator.host.config import Config

EXIT_FAIL = 1


def configure(cfg: Config, dry_run: bool) -> int:
    daemon = Path(cfg.engine.daemon_json)
    toolkit = Path(cfg.swarm.toolkit_config)
    try:
        old_daemon = _read(daemon)
        current = json.loads(old_daemon) if old_daemon.strip() else {}
        if not isinstance(current, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        print(f"gpu-alloc: {daemon}: cannot read: {e}", file=sys.stderr)
        return EXIT_FAIL
    try:
        old_toolkit = _read(toolkit)
    except OSError as e:
        print(f"gpu-alloc: {toolkit}: cannot read: {e}", file=sys.stderr)
        return EXIT_FAIL
    new_daemon = swarm_files.render_json(
        swarm_files.daemon_json(current, cfg.swarm.kind, cfg.swarm.gpus)
    )
    if json.loads(new_daemon) == current:
        new_daemon = old_daemon  # same settings: leave the file's own layout alone
    new_toolkit = old_toolkit
    if cfg.swarm.gpus:
        new_toolkit = swarm_files.toolkit_toml(old_toolkit, cfg.swarm.variable)
    files = ((daemon, old_daemon, new_daemon), (toolkit, old_toolkit, new_toolkit))
    changes = [(path, old, new) for path, old, new in files if old != new]
    if not changes:
        print(f"swarm: {len(cfg.swarm.gpus)} GPU(s) as '{cfg.swarm.kind}': already configured")
        return 0
    for path, old, new in changes:
        if dry_run:
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(keepends=True), new.splitlines(keepends=True),
                    str(path), f"{path} (after)",
                )
            )  # fmt: skip
        else:
            _write(path, new)
            print(f"wrote {path}")
    verb = "would need" if dry_run else "needs"
    print(
        f"dockerd {verb} a restart (systemctl restart docker): it reads node-generic-resources "
        "and the default runtime only when it starts, and a restart without live-restore "
        "stops this node's containers"
    )
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, keeping its mode (0644 for a new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    store.replace(path, text.encode(), mode=mode)
