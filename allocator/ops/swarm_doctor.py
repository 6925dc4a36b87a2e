"""`gpu-alloc doctor`'s swarm line: is this node's swarm pool what the config says, and
should the node be drained?

dockerd reads its generic resources only at start, and swarm keeps scheduling tasks onto
a GPU gpu-alloc found unhealthy (swarm knows nothing of GPU health): such a node should
be drained from a manager, and the line says exactly how.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from allocator.core.leases.leases import StateError
from allocator.core.rules import swarm_files
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError
from allocator.host.health import HealthFile
from allocator.host.ledger import Ledger

OK, WARN, FAIL = "ok", "warn", "FAIL"
Verdict = tuple[str, str, str]  # (status, what, fix), as doctor's Line takes them


def check(cfg: Config) -> Verdict:
    if not cfg.swarm.configured:
        return OK, "swarm: no GPUs given to swarm (swarm.gpus)", ""
    fix = "sudo gpu-alloc swarm configure, then restart docker"
    stale = _stale_files(cfg)
    if stale:
        return FAIL, f"swarm: {stale}", fix
    info = _info(cfg)
    named = [
        (r or {}).get("NamedResourceSpec") or {} for r in (info or {}).get("GenericResources") or ()
    ]
    declared = sorted(str(n.get("Value")) for n in named if n.get("Kind") == cfg.swarm.kind)
    if info is not None and declared != sorted(cfg.swarm.gpus):
        return (
            FAIL,
            "swarm: dockerd runs with other GPUs than daemon.json gives it",
            ("restart docker (it reads node-generic-resources only when it starts)"),
        )
    try:
        sick = HealthFile(Ledger(cfg.state_dir)).read().unhealthy()
    except StateError as e:
        return WARN, f"swarm: GPU health not checked: {e}", ""
    bad = [u for u in cfg.swarm.gpus if u in sick]
    if bad:
        node = ((info or {}).get("Swarm") or {}).get("NodeID") or (info or {}).get("Name") or "NODE"
        return (
            WARN,
            (
                f"swarm: {', '.join(f'{u} ({sick[u]})' for u in bad)} given to swarm is unhealthy, "
                "and swarm goes on placing tasks on it"
            ),
            (
                f"on a manager: docker node update --availability drain {node}; fix the GPU, "
                f"gpu-alloc health clear {bad[0]}, then --availability active"
            ),
        )
    return OK, f"swarm: {len(cfg.swarm.gpus)} GPU(s) given to swarm as '{cfg.swarm.kind}'", ""


def _stale_files(cfg: Config) -> str:
    """What daemon.json or the toolkit's config lacks of the swarm settings; '' if nothing."""
    try:
        text = Path(cfg.engine.daemon_json).read_text()
        current: dict[str, Any] = json.loads(text) if text.strip() else {}
        toolkit = Path(cfg.swarm.toolkit_config).read_text()
    except FileNotFoundError as e:
        return f"{e.filename} is missing"
    except (OSError, ValueError) as e:
        return f"cannot read the swarm settings: {e}"
    if swarm_files.daemon_json(current, cfg.swarm.kind, cfg.swarm.gpus) != current:
        return f"{cfg.engine.daemon_json} does not give swarm exactly swarm.gpus"
    if swarm_files.toolkit_toml(toolkit, cfg.swarm.variable) != toolkit.rstrip("\n") + "\n":
        return f'{cfg.swarm.toolkit_config} does not set swarm-resource = "{cfg.swarm.variable}"'
    return ""


def _info(cfg: Config) -> dict[str, Any] | None:
    try:
        return Engine(cfg.engine.socket, cfg.engine.timeout).info()
    except EngineError:
        return None  # doctor's Engine line says so
