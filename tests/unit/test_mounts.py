"""What a bind or a volume reaches (allocator/core/access/mounts.py): the filesystems below a
path, a local volume's options."""

from __future__ import annotations

import pytest

from allocator.core.access import mounts
from allocator.core.access.mounts import Mount
from tests.support.table_host import V1_CGROUPS, TableHost


@pytest.mark.parametrize(
    ("path", "read_only", "exposes"),
    [
        ("/dev/shm", False, None),
        ("/dev/shm/sub", False, None),
        ("/sys/fs/cgroup", True, None),
        ("/sys/fs/cgroup", False, "/sys"),
        ("/sys/fs/cgroup/devices", False, "/sys"),
        ("/dev", False, "/dev"),
        ("/dev/pts", False, "/dev"),  # part of devtmpfs in this table
        ("/", True, "/dev"),
        ("/var", False, "/var/lib/docker"),
        ("/srv", False, None),
    ],
)
def test_a_bind_is_judged_by_the_filesystems_it_reaches(path, read_only, exposes):
    assert mounts.exposure(TableHost(), path, read_only) == exposes


def test_a_kernel_filesystem_mounted_below_a_bind_source_is_reached_by_it():
    host = TableHost(table=(*V1_CGROUPS, Mount("/srv/chroot/dev", "devtmpfs"),
                            Mount("/mnt/proc", "proc")))  # fmt: skip
    assert "devtmpfs" in (mounts.exposure(host, "/srv") or "")
    assert "proc" in (mounts.exposure(host, "/mnt/proc/1") or "")
    assert mounts.exposure(host, "/srv/data") is None


def test_dev_as_a_plain_directory_of_the_root_filesystem_stays_protected():
    host = TableHost(table=(Mount("/", "overlay"), Mount("/dev/shm", "tmpfs")))
    assert mounts.exposure(host, "/dev/shm") is None
    assert mounts.exposure(host, "/dev/null") == "/dev"


@pytest.mark.parametrize(
    ("options", "source", "refused"),
    [
        ({}, "", ""),
        ({"size": "1g"}, "", ""),
        ({"type": "tmpfs", "device": "tmpfs", "o": "size=10m,uid=1000"}, "", ""),
        ({"type": "nfs", "device": ":/export", "o": "addr=10.0.0.1,nolock,soft"}, "", ""),
        ({"type": "none", "device": "/srv/x", "o": "bind"}, "/srv/x", ""),
        ({"type": "proc", "device": "/srv/x", "o": "rbind,ro"}, "/srv/x", ""),  # bind wins
        ({"type": "none", "device": "srv/x", "o": "bind"}, "", "relative"),
        ({"type": "proc", "device": "proc"}, "", "proc"),
        ({"type": "sysfs", "device": "sysfs"}, "", "sysfs"),
        ({"type": "devtmpfs", "device": "udev"}, "", "devtmpfs"),
        ({"type": "ext4", "device": "/dev/sda1"}, "", "ext4"),
        ({"type": "overlay", "device": "overlay", "o": "lowerdir=/dev"}, "", "overlay"),
        ({"type": "none", "device": "/srv", "o": "Bind"}, "", "none"),  # Go's table is exact
        ({"type": "tmpfs", "device": "x", "o": "remount"}, "", "remount"),
        ({"type": "tmpfs", "device": "x", "mode": "1777"}, "", "mode"),
    ],
)
def test_local_volume_options_are_judged_by_the_mount_they_make(options, source, refused):
    made = mounts.local_volume(options)
    assert made.source == source
    assert refused in made.refusal if refused else made.refusal == ""
