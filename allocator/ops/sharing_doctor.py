"""``gpu-alloc doctor``'s line for shared GPUs (policy.sharing): the MPS control
program is there, the GPUs it names are on this host, and what each mode gives."""

from __future__ import annotations

import shutil

from allocator.core.machine.inventory import InventoryError
from allocator.core.rules import sharing
from allocator.host.config import Config
from allocator.host.devices import source_for
from allocator.host.mps import Daemons

OK, WARN, FAIL = "ok", "warn", "FAIL"


def check(cfg: Config) -> tuple[str, str, str]:
    """(status, what, fix) for `allocator.ops.doctor.Line`."""
    rules = cfg.policy.rules.sharing
    if not rules:
        return OK, "GPU sharing: none (policy.sharing): GPUs are leased whole", ""
    mps = [r for r in rules if r.mode == sharing.MPS]
    if mps and shutil.which(cfg.mps.control) is None:
        return (
            FAIL,
            f"GPU sharing: policy.sharing has MPS GPUs and {cfg.mps.control} is not found: "
            "every MPS share would be refused (503)",
            "install the NVIDIA driver's MPS tools, set mps.control, or use mode: timeslice",
        )
    try:
        have = {g.index for g in source_for(cfg.gpus).inventory().gpus}
    except InventoryError as e:
        return WARN, f"GPU sharing: not checked: {e}", ""
    missing = sorted({i for r in rules for i in r.gpus} - have)
    if missing:
        return (
            FAIL,
            f"GPU sharing: policy.sharing names GPU {', '.join(map(str, missing))}, which "
            "this host does not have",
            f"fix policy.sharing in {cfg.source}",
        )
    running = len(Daemons(cfg.mps.dir, cfg.mps.control).running())
    said = "; ".join(
        f"GPU {','.join(map(str, r.gpus))}: {r.shares} {r.mode} shares"
        + (" (no caps, no isolation)" if r.mode != sharing.MPS else "")
        for r in rules
    )
    return OK, f"GPU sharing: {said}; {running} MPS daemon(s) running", ""
