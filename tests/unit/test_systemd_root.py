"""The install tier's roots: which suite each Engine boots, and 29's built with its own
dockerd.  debootstrap is a script here that lays a root with a busybox shell (no network)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support import engine_root, systemd_root
from tests.unit.test_engine_root import shared_binaries


def test_each_engine_boots_its_own_cached_root() -> None:
    assert systemd_root.root_of(engine_root.lookup("20.10")) == systemd_root.CACHE / "bookworm"
    assert systemd_root.root_of(engine_root.lookup("29")) == systemd_root.CACHE / "sid-29"
    why = systemd_root.missing_requirements(engine_root.lookup("26"))
    assert why == "the install tier boots Engines 20.10, 29, not 26"


def test_29_without_its_binaries_is_absent_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(systemd_root, "CACHE", tmp_path / "systemd")
    monkeypatch.setattr(engine_root, "SHARED", tmp_path / "nowhere")
    with pytest.raises(engine_root.BinariesAbsent, match=r"dockerd-29\.7\.2-dev\.xz"):
        systemd_root.ensure_root(engine_root.lookup("29"))
    assert not (tmp_path / "systemd" / "sid-29").exists()


def test_29s_root_is_sid_with_its_cli_and_the_shared_dockerd(tmp_path, monkeypatch) -> None:
    busybox = shutil.which("busybox")
    if busybox is None or os.geteuid() != 0:
        pytest.skip("needs busybox-static and root (chroot)")
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    # debootstrap --variant=minbase --include=PACKAGES SUITE ROOT MIRROR
    (bin_dir / "debootstrap").write_text(
        f'#!/bin/sh\nmkdir -p "$4/bin" "$4/usr/sbin" "$4/etc/systemd/system"\n'
        f'cp {busybox} "$4/bin/sh" && cp {busybox} "$4/bin/env"\necho "$3 $2" > "$4/asked"\n'
    )
    (bin_dir / "debootstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(systemd_root, "CACHE", tmp_path / "systemd")
    shared_binaries(tmp_path, monkeypatch, "29.7.2-dev")

    root = systemd_root.ensure_root(engine_root.lookup("29"))
    assert root == tmp_path / "systemd" / "sid-29"
    suite, include = (root / "asked").read_text().split()
    assert suite == "sid" and "docker-cli" in include.split(",")
    assert (root / "usr/sbin/dockerd").stat().st_mode & 0o777 == 0o755
    assert (root / "etc/systemd/system/ga-cgroups-rw.service").is_file()
    stamp = (root / engine_root.STAMP).read_text()
    assert "suite: sid\n" in stamp
    assert "dockerd: Docker version 29.7.2-dev" in stamp
    assert "usr/sbin/docker-proxy: docker-proxy-29.7.2-dev.xz sha256" in stamp
