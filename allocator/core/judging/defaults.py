"""What ``policy.gpu_defaults`` added to a GPU create, and what to say when it breaks a start.

The shim adds the operator's defaults (a shared-memory size, ulimits) to what a GPU
create left unset.  The container carries a label naming what was added, so when
its start fails on one of them (runc's "error setting rlimit", say) the user learns
that gpu-alloc, not their command, set it, and how to set it themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from allocator.core.api import labels

# runc's words when a ulimit cannot be applied, and dockerd's for a bad ShmSize or ulimit.
_LIMIT_FAILURE = re.compile(r"rlimit|ulimit|shm ?size|shm_size", re.IGNORECASE)


def added(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The label value naming what `policy.with_defaults` added (``""``: nothing):
    ``shm_size=2147483648,ulimit memlock=-1:-1``."""
    was, now = before.get("HostConfig") or {}, after.get("HostConfig") or {}
    parts = []
    if now.get("ShmSize") != was.get("ShmSize"):
        parts.append(f"shm_size={now.get('ShmSize')}")
    given = {str((u or {}).get("Name")) for u in was.get("Ulimits") or ()}
    for u in now.get("Ulimits") or ():
        if str(u.get("Name")) not in given:
            parts.append(f"ulimit {u.get('Name')}={u.get('Soft')}:{u.get('Hard')}")
    return ",".join(parts)


def start_note(message: str, given: Mapping[str, Any] | None) -> str:
    """What to add to a failed start's message, for a container whose labels are
    ``given``: only when it failed on a limit and gpu-alloc had added some."""
    value = str((given or {}).get(labels.DEFAULTS) or "")
    if not value or not labels.lease_of(given or {}) or not _LIMIT_FAILURE.search(message):
        return ""
    return (
        f" (gpu-alloc added {value.replace(',', ', ')} to this GPU container from the "
        "operator's policy.gpu_defaults; set your own with --shm-size or --ulimit to "
        "override, or ask your operator)"
    )
