"""``policy.sharing`` as the config file writes it, and the ``mps`` section.

``policy.sharing`` is a list; each entry names its GPUs (``gpus``: indices, or
``pool``: a pool of ``policy.pools``) and how they are shared::

    sharing:
      - pool: notebooks
        shares: 4          # each GPU is four shares
        mode: mps          # the default; or timeslice (no caps, no isolation)
        memory: 20GiB      # per share; default: the GPU's memory / shares
        threads: 25        # percent per share; default: 100 / shares
        placement: pack    # or spread
        users: one         # MPS serves one user at a time; "any" lets them queue

A GPU is named by at most one entry.  Errors are `config_times.KeyProblem`s: the
dotted key, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocator.core.machine.cpus import parse_size
from allocator.core.rules.sharing import ANY_USER, MODES, MPS, Sharing
from allocator.host import config_keys
from allocator.host.config_times import KeyProblem

KEYS = ("gpus", "pool", "shares", "mode", "memory", "threads", "placement", "users")
PLACEMENTS = ("pack", "spread")
USERS = ("one", ANY_USER)


@dataclass(frozen=True)
class MpsConfig:
    """Where gpu-alloc keeps its MPS daemons' pipe, shm and log directories, and the
    control program it runs (``nvidia-cuda-mps-control``, found on PATH)."""

    dir: str = "/run/gpu-alloc/mps"
    control: str = "nvidia-cuda-mps-control"


MPS_KEYS: dict[str, type | tuple[type, ...]] = {"dir": str, "control": str}


def sharing_rules(policy: dict[str, Any]) -> tuple[Sharing, ...]:
    """The `Sharing` entries of ``policy.sharing``, each key checked."""
    raw = policy.get("sharing")
    if raw is None:
        return ()
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise KeyProblem("policy.sharing", "must be a list of entries, each with gpus or pool")
    pools = policy.get("pools") or {}
    rules: list[Sharing] = []
    seen: dict[int, str] = {}
    for i, entry in enumerate(raw):
        key = f"policy.sharing[{i}]"
        rule = _entry(key, entry, pools)
        for index in rule.gpus:
            if index in seen:
                raise KeyProblem(f"{key}.gpus", f"GPU {index} is shared by {seen[index]} already")
            seen[index] = key
        rules.append(rule)
    return tuple(rules)


def _entry(key: str, entry: Any, pools: dict[str, Any]) -> Sharing:
    if not isinstance(entry, dict):
        raise KeyProblem(key, "must be a mapping with gpus or pool, and shares")
    for k in entry:
        if k not in KEYS:
            raise KeyProblem(f"{key}.{k}", config_keys.unknown(f"{key}.{k}", KEYS))
    if ("gpus" in entry) == ("pool" in entry):
        raise KeyProblem(key, "name the GPUs shared: gpus (indices) or pool, one of them")
    pool = entry.get("pool")
    if pool is not None:
        if not isinstance(pool, str) or pool not in pools:
            raise KeyProblem(f"{key}.pool", f"no pool '{pool}' in policy.pools")
        gpus = (pools[pool] or {}).get("gpus") or []
    else:
        gpus = entry["gpus"]
        if not isinstance(gpus, list) or not all(_whole(g) and g >= 0 for g in gpus) or not gpus:
            raise KeyProblem(f"{key}.gpus", "must be a list of GPU indices, such as [0, 1]")
    shares: Any = entry.get("shares")  # YAML, checked next
    if not _whole(shares) or not 2 <= shares <= 48:
        # 48: MPS's client limit per GPU on Volta and later
        raise KeyProblem(f"{key}.shares", "required: how many shares each GPU is, 2 to 48")
    mode = entry.get("mode", MPS)
    if mode not in MODES:
        raise KeyProblem(f"{key}.mode", f"must be one of {', '.join(MODES)}")
    memory = None
    if entry.get("memory") is not None:
        try:
            memory = parse_size(str(entry["memory"]))
        except ValueError as e:
            raise KeyProblem(f"{key}.memory", str(e)) from None
        if memory <= 0:
            raise KeyProblem(f"{key}.memory", "must be more than zero")
    threads = entry.get("threads")
    if threads is not None and (not _whole(threads) or not 1 <= threads <= 100):
        raise KeyProblem(f"{key}.threads", "must be a percentage, 1 to 100")
    if mode != MPS and (memory is not None or threads is not None):
        raise KeyProblem(
            f"{key}.mode", "timeslice shares have no caps: memory and threads are for mps only"
        )
    placement = entry.get("placement", "pack")
    if placement not in PLACEMENTS:
        raise KeyProblem(f"{key}.placement", f"must be one of {', '.join(PLACEMENTS)}")
    users = entry.get("users", "one")
    if users not in USERS:
        raise KeyProblem(f"{key}.users", f"must be one of {', '.join(USERS)}")
    return Sharing(tuple(gpus), shares, mode, memory, threads, pool, placement == "spread", users)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
