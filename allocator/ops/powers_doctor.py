"""``gpu-alloc doctor``'s line for powers over the host (``policy.powers``,
``policy.privileged``): who holds which power beyond the allow-list, and a grant this host
refuses anyway (``SYS_ADMIN`` without AppArmor, allocator/host/apparmor.py)."""

from __future__ import annotations

from collections.abc import Callable

from allocator.core.access import privileged
from allocator.host import apparmor
from allocator.host.config import Config

OK, WARN = "ok", "warn"


def check(
    cfg: Config, apparmor_loaded: Callable[[], bool] = apparmor.loaded
) -> tuple[str, str, str]:
    """(status, what, fix) for `allocator.ops.doctor.Line`."""
    rules = cfg.policy.rules
    grants = {power: holders for power, holders in rules.powers.by_power.items() if holders}
    said = [
        f"{power} to {', '.join([*holders.users, *(f'@{g}' for g in holders.groups)])}"
        for power, holders in sorted(grants.items())
    ]
    if rules.privileged == privileged.LEASE_ALL:
        said.append("privileged to everyone (policy.privileged: lease-all)")
    if not said:
        return OK, "powers: the allow-list alone (policy.powers grants none)", ""
    what = "powers: " + "; ".join(said)
    if "SYS_ADMIN" in grants and not apparmor_loaded():
        return (
            WARN,
            f"{what}; AppArmor is not loaded here, so SYS_ADMIN is refused to its holders "
            "anyway (without a profile it mounts the devices cgroup)",
            "load AppArmor and a profile for FUSE mounts (docs/policy.md), or take "
            "SYS_ADMIN out of policy.powers",
        )
    return OK, what, ""
