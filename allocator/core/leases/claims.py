"""Claims: containers that hold GPUs without a lease of gpu-alloc's (adopted), as the
ledger keeps them (`allocator.core.leases.leases.State.claims`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Claim:
    """A container gpu-alloc did not lease but that holds GPUs (adopted)."""

    container: str
    name: str
    gpus: tuple[str, ...] | None  # None: unpinned, holds every GPU
    why: str
    # The cores and memory gpu-alloc had leased it, as its labels say (`labels.PLACED`):
    # a container whose lease a ``repair --reset`` lost keeps them from the next lease.
    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()
    memory: int = 0
    # Whose it was, by the same labels: their limit counts it as before the reset.
    owner: str = "unknown"
    owner_uid: int | None = None
    since: float | None = None  # the container's creation: how long it has held them
    pool: str | None = None  # the pool its lease was placed in, by the pool label


_DEFAULTS = {
    "cpus": (),
    "mems": (),
    "memory": 0,
    "owner": "unknown",
    "owner_uid": None,
    "since": None,
    "pool": None,
}


def claim_json(c: Claim) -> dict[str, Any]:
    """Only what differs from the defaults beside the four first keys, so an older
    gpu-alloc still reads the ledger unless a reset adopted one of gpu-alloc's containers."""
    return {k: v for k, v in vars(c).items() if k not in _DEFAULTS or v != _DEFAULTS[k]}


def claim_from_json(v: dict[str, Any]) -> Claim:
    """A claim as `claim_json` writes one; a malformed one raises (KeyError, TypeError)."""
    gpus = v["gpus"]
    return Claim(
        **{
            **v,
            "gpus": None if gpus is None else tuple(gpus),
            "cpus": tuple(v.get("cpus", ())),
            "mems": tuple(v.get("mems", ())),
        }
    )
