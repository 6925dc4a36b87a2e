"""The build door on a real Engine: a real BuildKit client (tests/support/buildkit.py)
asks a build step for a CDI GPU by every way in, on the Engine's socket and through the
shim, and gets none; builds without devices still work.

What holds on each Engine (allocator/core/access/builds.py): 29 speaks BuildKit's gRPC on its
socket past every plugin and grants the ``device`` entitlement unless daemon.json says
``builder.entitlements.device: false``, which deploy/install.sh writes and the harness's
stack has too; 28 and older never grant it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.core.access import builds
from allocator.core.access.facts import engine_version
from tests.support import buildkit, engine, engine_root

GPUS = 4
DEVICES = ("nvidia.com/gpu=all", "nvidia.com/gpu=0")


class BuildStack(engine.Stack):
    """A stack whose dockerd has a CDI spec for the simulated GPUs; ``closed``: and the
    installer's builder.entitlements.device false."""

    def __init__(self, closed: bool = True) -> None:
        super().__init__(gpus=GPUS)
        self.closed = closed

    def start(self) -> BuildStack:
        self.engine_dir.mkdir(parents=True, exist_ok=True)
        buildkit.write_daemon_json(self.engine_dir, GPUS, self.closed)
        super().start()
        return self


def make_stack() -> engine.Stack:
    return BuildStack()


@pytest.fixture(scope="module")
def probe() -> Iterator[Path]:
    why = buildkit.probe_absent()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the BuildKit probe cannot run under CI: {why}", pytrace=False)
        pytest.skip(f"BuildKit probe not run: {why}")
    directory = Path(tempfile.mkdtemp(prefix="ga-probe-", dir="/tmp"))
    try:
        yield buildkit.probe_binary(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def this_engine() -> str:
    return engine_root.selected().name


def address(stack: engine.Stack, way: str) -> str:
    scheme, shim = buildkit.WAYS[way]
    return scheme + (stack.shim_sock if shim else stack.engine_sock)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("way", list(buildkit.WAYS))
def test_a_build_step_gets_no_gpu_by_any_way(
    stack: engine.Stack, probe: Path, way: str, device: str
) -> None:
    got = buildkit.run_probe(probe, address(stack, way), device)
    assert not got.saw_gpu, got.out
    scheme, shim = buildkit.WAYS[way]
    if scheme == "unix://" and shim:
        # The shim answered the HTTP/2 preface 400 in HTTP/1.1 and closed: the client
        # reads that answer, or finds the connection closed while it still writes.
        assert any(s in got.out for s in ("HTTP/1.1", "broken pipe", "reset by peer")), got.out
    elif this_engine() in ("28", "29") and (
        scheme == "upgrade://" or builds.native_grpc(_version(stack.engine_sock))
    ):
        # The plugin let the upgrade by (builds reach no device here): BuildKit refused.
        assert "403" not in got.out, got.out
        assert "granting entitlement device is not allowed" in got.out, got.out


def test_builds_without_devices_still_work(stack: engine.Stack, tmp_path: Path) -> None:
    """The classic builder, through the shim, on every Engine."""
    (tmp_path / "Dockerfile").write_text(f"FROM {engine.BUSYBOX_TAG}\nRUN echo built > /x\n")
    out = engine.docker_cli(
        stack.shim_sock, "build", "--network", "none", "-t", "ga-build-door:classic",
        str(tmp_path), env={"DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    try:
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        engine.docker_cli(stack.shim_sock, "rmi", "-f", "ga-build-door:classic")


def grpc_list_workers(sock: str, directory: Path) -> subprocess.CompletedProcess:
    """BuildKit's ListWorkers spoken as native HTTP/2 gRPC (what Engine 29.2+ serves)."""
    empty = directory / "empty-grpc-message"
    empty.write_bytes(b"\0" * 5)  # an uncompressed, empty protobuf message
    return subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-D", "-", "--max-time", "20", "--unix-socket",
         sock, "--http2-prior-knowledge", "-H", "content-type: application/grpc",
         "--data-binary", f"@{empty}", "http://docker/moby.buildkit.v1.Control/ListWorkers"],
        capture_output=True, text=True, errors="replace", check=False,
    )  # fmt: skip


def test_http2_is_never_carried_by_the_shim(stack: engine.Stack, tmp_path: Path) -> None:
    """Prior-knowledge HTTP/2 is refused by the shim's parser; the Engine 29 itself
    answers it (BuildKit's ordinary calls work there, with no device to give)."""
    through_shim = grpc_list_workers(stack.shim_sock, tmp_path)
    assert "grpc-status: 0" not in through_shim.stdout, through_shim.stdout
    direct = grpc_list_workers(stack.engine_sock, tmp_path)
    spoken = builds.native_grpc(_version(stack.engine_sock))
    assert ("grpc-status: 0" in direct.stdout) is spoken, direct.stdout + direct.stderr


def _version(sock: str) -> tuple[int, int, int] | None:
    return engine_version(str(engine.engine_api(sock).version().get("Version") or ""))


def test_the_installers_builder_setting_starts_every_engine() -> None:
    """dockerd refuses an unknown top-level key, but ignores one inside "builder" on 20.10
    to 28: the setting deploy/install.sh writes is safe on every Engine."""
    state = Path(tempfile.mkdtemp(prefix="ga-", dir="/tmp"))
    try:
        (state / "daemon.json").write_text(json.dumps(builds.CLOSED))
        with engine.Dockerd(state) as dockerd:
            assert engine.engine_api(dockerd.sock).version()["Version"]
        (state / "daemon.json").write_text(json.dumps({"no-such-option": True}))
        with pytest.raises(engine.EngineError, match="no-such-option"):
            engine.Dockerd(state).start()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_on_29_without_the_setting_only_the_native_way_stays_open(probe: Path) -> None:
    """What the plugin can and cannot close: it refuses the upgrades, the native way
    never reaches it, and doctor fails the host with the fix."""
    if this_engine() != "29":
        pytest.skip("Engine 29 alone grants the device entitlement by default")
    stack = BuildStack(closed=False).start()
    try:
        native = buildkit.run_probe(probe, address(stack, "native gRPC on the Engine's socket"),
                                    DEVICES[0])  # fmt: skip
        assert native.saw_gpu, native.out  # the door the Engine's configuration alone closes
        for way in ("POST /grpc upgrade on the Engine's socket",
                    "POST /grpc upgrade through the shim"):  # fmt: skip
            got = buildkit.run_probe(probe, address(stack, way), DEVICES[0])
            assert not got.saw_gpu and "403" in got.out, got.out
        doctor = subprocess.run(
            [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "doctor"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert doctor.returncode != 0
        assert "[FAIL] builds: a build step can be given GPUs" in doctor.stdout, doctor.stdout
        assert '"device": false' in doctor.stdout
    finally:
        stack.stop()


def test_on_29_a_reload_leaves_builds_open_and_a_restart_closes_them(probe: Path) -> None:
    """dockerd reads builder.entitlements only when it starts: why doctor fails a dockerd
    older than the daemon.json that closes the door, and the installer says to restart."""
    if this_engine() != "29":
        pytest.skip("Engine 29 alone grants the device entitlement by default")
    state = Path(tempfile.mkdtemp(prefix="ga-", dir="/tmp"))
    try:
        config = buildkit.write_daemon_json(state, GPUS, closed=False)
        with engine.Dockerd(state) as dockerd:
            engine.import_busybox(dockerd.sock)
            assert buildkit.run_probe(probe, f"unix://{dockerd.sock}", DEVICES[1]).saw_gpu
            (state / "daemon.json").write_text(json.dumps({**config, **builds.CLOSED}))
            os.kill(int((state / "pid").read_text()), signal.SIGHUP)  # dockerd's own pid
            engine.wait_until(
                lambda: "Reloaded configuration" in dockerd.log.read_text(),
                "dockerd's reload", dockerd.proc, dockerd.log, 20,
            )  # fmt: skip
            assert buildkit.run_probe(probe, f"unix://{dockerd.sock}", DEVICES[1]).saw_gpu
        with engine.Dockerd(state) as dockerd:
            got = buildkit.run_probe(probe, f"unix://{dockerd.sock}", DEVICES[1])
            assert not got.saw_gpu and "entitlement device is not allowed" in got.out, got.out
    finally:
        shutil.rmtree(state, ignore_errors=True)
