"""The Debian-root Engines' harness itself: choosing, caching, failing loudly, isolating.

No dockerd and no network here: debootstrap is replaced by scripts that fail the way
the archive (or this machine) does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import engine_root
from tests.support.engine_root import Engine

FAKE = Engine("fake", "fakesuite", "99.")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(engine_root, "CACHE", tmp_path)
    return tmp_path


def fake_debootstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "debootstrap").write_text("#!/bin/sh\n" + script)
    (bin_dir / "debootstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


CHOICES = [("20.10", None), ("26", "trixie"), ("28", "sid"), ("sid", "sid"), ("host", None)]


@pytest.mark.parametrize(("name", "suite"), CHOICES)
def test_engines_are_chosen_by_name_or_alias(name: str, suite: str | None) -> None:
    assert engine_root.lookup(name).suite == suite


def test_an_unknown_engine_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"choose one of 20\.10, 26, 28"):
        engine_root.lookup("27")


def test_ga_engine_selects_and_the_default_is_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GA_ENGINE", raising=False)
    assert engine_root.selected().host
    monkeypatch.setenv("GA_ENGINE", "28")
    assert engine_root.selected().root == engine_root.CACHE / "sid"


def test_a_download_failure_is_the_archives_fault(cache, tmp_path, monkeypatch) -> None:
    fake_debootstrap(
        tmp_path, monkeypatch, "echo 'E: Couldn'\"'\"'t download packages: docker.io'\nexit 1\n"
    )
    with pytest.raises(engine_root.ArchiveUnavailable, match="failed on the archive"):
        engine_root.ensure_root(FAKE)
    assert not (cache / "fakesuite").exists() and not (cache / "fakesuite.partial").exists()
    assert "download" in (cache / "fakesuite.log").read_text()


def test_any_other_build_failure_is_a_real_failure(cache, tmp_path, monkeypatch) -> None:
    fake_debootstrap(tmp_path, monkeypatch, "echo 'mkdir: Permission denied'\nexit 2\n")
    with pytest.raises(engine_root.RootError, match="status 2"):
        engine_root.ensure_root(FAKE)


def test_a_stamped_root_is_reused_without_building(cache, tmp_path, monkeypatch) -> None:
    fake_debootstrap(tmp_path, monkeypatch, "exit 1\n")  # would fail if it ran
    (cache / "fakesuite").mkdir()
    (cache / "fakesuite" / engine_root.STAMP).write_text("dockerd: Docker version 99.1\n")
    assert engine_root.ensure_root(FAKE) == cache / "fakesuite"
    assert "99.1" in engine_root.stamp(FAKE)


def test_a_root_without_its_stamp_is_rebuilt(cache, tmp_path, monkeypatch) -> None:
    (cache / "fakesuite").mkdir()  # a build that died half-way
    fake_debootstrap(tmp_path, monkeypatch, 'echo ran > "$4.ran"; exit 2\n')
    with pytest.raises(engine_root.RootError):
        engine_root.ensure_root(FAKE)
    assert (cache / "fakesuite.partial.ran").exists()


def test_the_launcher_isolates_mounts_and_keeps_one_pid() -> None:
    argv = engine_root.root_launcher(
        Path("/r"), [Path("/tmp/ga-x")], "/tmp/ga-x/bin:/usr/bin", ["dockerd", "--debug"]
    )
    assert argv[:4] == ["unshare", "-m", "--propagation", "private"]
    script = argv[6]
    steps = script.split(" && ")
    assert steps[:6] == [
        "mount --bind /r /r", "mount -t proc proc /r/proc", "mount --rbind /sys /r/sys",
        "mount --rbind /dev /r/dev", "mount -t tmpfs tmpfs /r/run", "mount -t tmpfs tmpfs /r/tmp",
    ]  # fmt: skip
    assert "mount --bind /tmp/ga-x /r/tmp/ga-x" in steps
    assert steps[-1].startswith("exec chroot")  # exec all the way: our pid is dockerd's
    assert argv[7:] == ["/r", "/tmp/ga-x/bin:/usr/bin", "dockerd", "--debug"]


def test_the_hosts_own_mount_namespace_is_never_killed() -> None:
    held = engine_root.hold_namespace(os.getpid())
    assert held is not None
    try:
        assert engine_root.kill_namespace(held) == []
    finally:
        os.close(held)
    assert engine_root.kill_namespace(None) == []


SHARED29 = Engine("29", "fakesuite", "29.7.", binaries="29.7.2-dev")


def shared_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> Path:
    """A shared directory whose dockerd says `version` (a script, xz-packed, summed)."""
    engines = tmp_path / "shared" / "engines"
    engines.mkdir(parents=True)
    for name in engine_root.SHARED_BINARIES:
        plain = engines / name
        plain.write_text(f"#!/bin/sh\necho 'Docker version {version}, build x'\n")
        subprocess.run(["xz", "-z", str(plain)], check=True)
        (engines / f"{name}.xz").rename(engines / f"{name}-29.7.2-dev.xz")
    names = sorted(p.name for p in engines.iterdir())
    sums = subprocess.run(
        ["sha256sum", *names], cwd=engines, capture_output=True, text=True, check=True
    ).stdout
    (engines / "SHA256SUMS").write_text(sums)
    monkeypatch.setattr(engine_root, "SHARED", tmp_path / "shared")
    return engines


def test_29_is_the_sid_root_with_the_shared_dockerd(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = engine_root.lookup("29")
    assert (eng.suite, eng.binaries) == ("sid", "29.7.2-dev")
    assert eng.root == engine_root.CACHE / "sid-29"  # its own copy: the 28 root stays as it is


def test_without_the_shared_binaries_the_engine_is_absent_saying_where(
    cache, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(engine_root, "SHARED", tmp_path / "nowhere")
    why = engine_root.binaries_absent(SHARED29)
    assert why is not None and str(tmp_path / "nowhere" / "engines") in why
    assert "dockerd-29.7.2-dev.xz" in why and "GA_SHARED" in why
    with pytest.raises(engine_root.BinariesAbsent, match="needs SHA256SUMS"):
        engine_root.ensure_root(SHARED29)
    assert engine_root.binaries_absent(engine_root.lookup("28")) is None


def fake_suite_root(cache: Path) -> None:
    """A built fakesuite root with a chroot-able shell (busybox-static), for the overlay."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox-static is not installed (make deps)")
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    for d in ("bin", "usr/bin", "usr/sbin"):
        (cache / "fakesuite" / d).mkdir(parents=True)
    for name in ("sh", "env"):
        shutil.copy(busybox, cache / "fakesuite" / "bin" / name)
    (cache / "fakesuite" / engine_root.STAMP).write_text("suite: fakesuite\ndockerd: old\n")


def test_the_shared_dockerd_replaces_the_suites_in_a_copy(cache, tmp_path, monkeypatch) -> None:
    fake_suite_root(cache)
    shared_binaries(tmp_path, monkeypatch, "29.7.2-dev")
    monkeypatch.setitem(engine_root.ENGINES, "fake", FAKE)
    root = engine_root.ensure_root(SHARED29)
    assert root == cache / "fakesuite-29"
    assert (root / "usr/sbin/dockerd").stat().st_mode & 0o777 == 0o755
    assert not (cache / "fakesuite" / "usr/sbin/dockerd").exists()  # the suite's root untouched
    said = engine_root.stamp(SHARED29)
    assert said.startswith("dockerd: Docker version 29.7.2-dev")
    assert "usr/sbin/docker-proxy: docker-proxy-29.7.2-dev.xz sha256" in said
    assert "suite: fakesuite" in said


def test_a_shared_binary_unlike_its_sum_is_refused(cache, tmp_path, monkeypatch) -> None:
    fake_suite_root(cache)
    engines = shared_binaries(tmp_path, monkeypatch, "29.7.2-dev")
    (engines / "SHA256SUMS").write_text((engines / "SHA256SUMS").read_text().replace("a", "b"))
    monkeypatch.setitem(engine_root.ENGINES, "fake", FAKE)
    with pytest.raises(engine_root.RootError, match="is not the one SHA256SUMS lists"):
        engine_root.ensure_root(SHARED29)
    assert not (cache / "fakesuite-29").exists() and not (cache / "fakesuite-29.partial").exists()
