"""``gpu-alloc doctor``'s line for shared GPUs (policy.sharing): the MPS control
program is there, the GPUs it names are on this host, each GPU whose MPS daemon runs is
in compute mode EXCLUSIVE_PROCESS (allocator/host/mps.py says why), and what each mode
gives."""

from __future__ import annotations

import shutil

from allocator.core.machine.inventory import InventoryError
from allocator.core.rules import sharing
from allocator.host.config import Config
from allocator.host.devices import source_for
from allocator.host.mps import ComputeModes, Daemons, modes_for
from allocator.host.nvml import COMPUTE_MODES, EXCLUSIVE_PROCESS

OK, WARN, FAIL = "ok", "warn", "FAIL"


def check(cfg: Config, modes: ComputeModes | None = None) -> tuple[str, str, str]:
    """(status, what, fix) for `allocator.ops.doctor.Line`; ``modes``: the GPUs' compute
    modes, the driver's where the config's GPUs are NVML's."""
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
    running = Daemons(cfg.mps.dir, cfg.mps.control).running()
    loose = _not_exclusive(running, modes or modes_for(cfg.gpus))
    if loose:
        return (
            FAIL,
            f"GPU sharing: the MPS daemon of {loose} runs while the GPU is not in compute "
            "mode EXCLUSIVE_PROCESS: a share that unsets CUDA_MPS_PIPE_DIRECTORY uses the "
            "whole GPU directly, past its caps",
            f"nvidia-smi -i {loose.split()[0]} -c EXCLUSIVE_PROCESS (gpu-alloc sets it when "
            "it starts a daemon; something set it back)",
        )
    said = "; ".join(
        f"GPU {','.join(map(str, r.gpus))}: {r.shares} {r.mode} shares"
        + (" (no caps, no isolation)" if r.mode != sharing.MPS else "")
        for r in rules
    )
    return OK, f"GPU sharing: {said}; {len(running)} MPS daemon(s) running", ""


def _not_exclusive(running: set[str], modes: ComputeModes | None) -> str:
    """The first GPU of ``running`` (with its mode, or why it cannot be read) that is not
    in EXCLUSIVE_PROCESS; empty when each is, or the GPUs are simulated."""
    if modes is None:
        return ""
    for uuid in sorted(running):
        try:
            mode = modes.get(uuid)
        except Exception as e:
            return f"{uuid} (its compute mode cannot be read: {e})"
        if mode != EXCLUSIVE_PROCESS:
            return f"{uuid} (compute mode {COMPUTE_MODES.get(mode, mode)})"
    return ""
