"""What `gpu-alloc swarm configure` writes: daemon.json's and the toolkit's swarm settings.

Pure: text or data in, text or data out.  dockerd reads ``node-generic-resources`` at start
only; the swarm executor sets no runtime, so a task reaches the NVIDIA runtime only as the
default runtime; and the runtime reads the GPUs swarm gave a task from the variable its
``swarm-resource`` names (a top-level key of the toolkit's config.toml, commented out in
the file the toolkit ships).  Entries of other kinds, and every other key, are kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

RESOURCES = "node-generic-resources"
RUNTIME = "nvidia"
RUNTIME_PATH = "nvidia-container-runtime"
_SWARM_LINE = re.compile(r"^\s*#?\s*swarm-resource\s*=.*$")
_SECTION = re.compile(r"^\s*\[")


def daemon_json(current: Mapping[str, Any], kind: str, gpus: Sequence[str]) -> dict[str, Any]:
    """daemon.json with exactly ``gpus`` as this node's generic resources of ``kind``, and
    nvidia as the default runtime (declared with the toolkit's runtime when missing)."""
    out = dict(current)
    prefix = kind + "="
    kept = [str(r) for r in out.get(RESOURCES) or () if not str(r).startswith(prefix)]
    resources = kept + [prefix + g for g in gpus]
    if resources:
        out[RESOURCES] = resources
    else:
        out.pop(RESOURCES, None)
    runtimes = dict(out.get("runtimes") or {})
    if gpus:
        runtimes.setdefault(RUNTIME, {"path": RUNTIME_PATH})
        out["runtimes"] = runtimes
        out["default-runtime"] = RUNTIME
    return out


def render_json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def toolkit_toml(text: str, variable: str) -> str:
    """config.toml with the top-level ``swarm-resource = "<variable>"``: the line (or its
    commented-out example) before the first section is replaced, else one is added first."""
    lines = text.splitlines()
    wanted = f'swarm-resource = "{variable}"'
    for i, line in enumerate(lines):
        if _SECTION.match(line):
            break
        if _SWARM_LINE.match(line):
            lines[i] = wanted
            return "\n".join(lines) + "\n"
    return "\n".join([wanted, *lines]) + "\n"
