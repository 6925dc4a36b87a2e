"""Is AppArmor loaded on this host: the fact `core.access.powers` needs before a granted
SYS_ADMIN, which only Docker's AppArmor profile keeps from mounting the devices cgroup.

Read as dockerd decides to apply its ``docker-default`` profile (moby's
``apparmor.HostSupports``): the kernel's module is enabled and its securityfs is there.
"""

from __future__ import annotations

import os


def loaded(sysfs: str = "/sys") -> bool:
    try:
        with open(os.path.join(sysfs, "module/apparmor/parameters/enabled")) as f:
            enabled = f.read(1) == "Y"
    except OSError:
        return False
    return enabled and os.path.isdir(os.path.join(sysfs, "kernel/security/apparmor"))
