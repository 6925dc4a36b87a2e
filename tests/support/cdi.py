"""The test Engines' second way to `--gpus`: CDI, as Engine 29 takes it.

With `nvidia-cdi-hook` on dockerd's PATH, Engine 29 turns an `nvidia` device request
into the CDI devices `nvidia.com/gpu=<id>` and injects what the CDI spec says for them,
instead of adding the toolkit's runtime hook (daemon/devices_nvidia_linux.go).  On a
real host the toolkit writes that spec for the GPUs it finds; here one is written for
the simulated GPUs, into a spec directory of the Engine's own (daemon.json
`cdi-spec-dirs`; 26 and 28 also need `features.cdi`).  Each GPU is named by its index
and by its UUID (what the shim rewrites a request to), `all` names every one, and what a
device injects says which GPU it is: the node /dev/nvidia<index> (a /dev/null, as no
real GPU is there) and the variable GA_CDI_GPU_<index>=<uuid>, which `SEEN` reads back.

The mode of a run is $GA_GPU_MODE (pytest's --gpu-mode sets it): `hook` (the default)
or `cdi`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODES = ("hook", "cdi")
KIND = "nvidia.com/gpu"
ENV = "GA_CDI_GPU_"
SPEC = "gpu-alloc-test-gpus.json"
# The oldest Engine that reads CDI specs (25.0, behind features.cdi until 29).
FIRST = 25
# What a container's GPUs are, as its shell sees them in each mode: the toolkit hook's
# NVIDIA_VISIBLE_DEVICES, or the GPUs the CDI spec injected (comma-joined, by index).
SEEN = {
    "hook": "printenv NVIDIA_VISIBLE_DEVICES",
    "cdi": f"echo $(env | sort | sed -n 's/^{ENV}[0-9]*=//p') | tr ' ' ,",
}


def mode() -> str:
    """The `--gpus` mode of this run: $GA_GPU_MODE, else the runtime hook."""
    said = os.environ.get("GA_GPU_MODE") or "hook"
    if said not in MODES:
        raise ValueError(f"GA_GPU_MODE={said!r}: choose one of {', '.join(MODES)}")
    return said


def seen(said: str | None = None) -> str:
    """The shell command that prints the GPUs a container got, in mode `said` (this run's)."""
    return SEEN[said or mode()]


def spec(uuids: Sequence[str]) -> dict[str, Any]:
    """A CDI spec naming each simulated GPU by index and UUID, and all of them as `all`."""

    def edits(indexed: Sequence[tuple[int, str]]) -> dict[str, Any]:
        return {
            "env": [f"{ENV}{k}={uuid}" for k, uuid in indexed],
            "deviceNodes": [{"path": f"/dev/nvidia{k}", "hostPath": "/dev/null"}
                            for k, _ in indexed],
        }  # fmt: skip

    devices = []
    for k, uuid in enumerate(uuids):
        devices += [{"name": str(k), "containerEdits": edits([(k, uuid)])},
                    {"name": uuid, "containerEdits": edits([(k, uuid)])}]  # fmt: skip
    devices.append({"name": "all", "containerEdits": edits(list(enumerate(uuids)))})
    return {"cdiVersion": "0.6.0", "kind": KIND, "devices": devices}


def prepare(state_dir: Path, bin_dir: Path, version: int, uuids: Sequence[str]) -> dict[str, Any]:
    """Make `state_dir`'s dockerd take `--gpus` through CDI: the hook on its PATH (`bin_dir`),
    the spec in its own spec directory.  Returns what its daemon.json must add."""
    if version < FIRST:
        raise RuntimeError(f"CDI mode needs Engine {FIRST}.0 or later, not {version}")
    hook = bin_dir / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")  # dockerd only looks it up; no spec here runs it
    hook.chmod(0o755)
    spec_dir = state_dir / "cdi"
    spec_dir.mkdir(exist_ok=True)
    (spec_dir / SPEC).write_text(json.dumps(spec(uuids), indent=1) + "\n")
    return {"cdi-spec-dirs": [str(spec_dir)], "features": {"cdi": True}}
