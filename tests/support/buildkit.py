"""A real BuildKit client asking a build step for a GPU, and the CDI spec it asks by.

`../shared/engines/buildkit-cdi-probe.xz` (its Go source beside it; usage in
../shared/docs/engine-29.md) is BuildKit's own client library: ``probe ADDRESS IMAGE
DEVICE`` runs one build step from IMAGE with the CDI device DEVICE and the ``device``
entitlement, and exits 0 only if the step saw /dev/nvidia0.  ADDRESS ``unix://PATH``
speaks gRPC directly on the socket (Engine 29.2+); ``upgrade://PATH`` first asks
``POST /grpc`` with ``Upgrade: h2c``, as the docker CLI's builder does.

The CDI spec is the CDI mode's (tests/support/cdi.py): the simulated GPUs as
``nvidia.com/gpu=0..N-1``, by UUID and ``all``, each bringing its /dev/nvidia<index>.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import subprocess
from dataclasses import dataclass
from pathlib import Path

from allocator.core.access import builds
from tests.support import cdi, engine, engine_root

PROBE = "buildkit-cdi-probe"
# The three ways in: (way, over the shim?) -> the probe's ADDRESS scheme.
WAYS = {
    "native gRPC on the Engine's socket": ("unix://", False),
    "POST /grpc upgrade on the Engine's socket": ("upgrade://", False),
    "POST /grpc upgrade through the shim": ("upgrade://", True),
    "native gRPC through the shim": ("unix://", True),
}
SAW = "the build step saw the device"


def probe_absent() -> str | None:
    """Why the probe cannot run here; None when it can."""
    packed = engine_root.SHARED / "engines" / f"{PROBE}.xz"
    if not packed.is_file():
        return f"{packed} is absent (the shared directory beside the checkout)"
    return None


def probe_binary(directory: Path) -> Path:
    """The probe unpacked into ``directory``, once checked against SHA256SUMS."""
    packed = engine_root.SHARED / "engines" / f"{PROBE}.xz"
    raw = packed.read_bytes()
    sums = engine_root.SHARED / "engines" / "SHA256SUMS"
    for line in sums.read_text().splitlines() if sums.is_file() else ():
        digest, _, name = line.partition("  ")
        if name.strip() == packed.name:
            assert hashlib.sha256(raw).hexdigest() == digest, f"{packed}: SHA256 mismatch"
    out = directory / PROBE
    out.write_bytes(lzma.decompress(raw))
    out.chmod(0o755)
    return out


def write_daemon_json(directory: Path, count: int, closed: bool) -> dict[str, object]:
    """``directory``/daemon.json naming a CDI spec dir with the simulated GPUs; ``closed``:
    with what deploy/install.sh writes (builder.entitlements.device false)."""
    (directory / "cdi").mkdir(parents=True, exist_ok=True)
    uuids = [engine.sim_gpu_uuid(k) for k in range(count)]
    (directory / "cdi" / cdi.SPEC).write_text(json.dumps(cdi.spec(uuids)))
    config: dict[str, object] = {}
    if not engine_root.selected().host:  # 20.10 refuses the key
        config["cdi-spec-dirs"] = [str(directory / "cdi")]
    if closed:
        config.update(builds.CLOSED)
    (directory / "daemon.json").write_text(json.dumps(config))
    return config


@dataclass(frozen=True)
class Outcome:
    rc: int
    out: str

    @property
    def saw_gpu(self) -> bool:
        return self.rc == 0 or SAW in self.out


def run_probe(probe: Path, address: str, device: str, timeout: float = 120) -> Outcome:
    try:
        done = subprocess.run(
            [str(probe), address, engine.BUSYBOX_TAG, device],
            capture_output=True, text=True, errors="replace", timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        return Outcome(124, f"timed out: {e.stdout!r} {e.stderr!r}")
    return Outcome(done.returncode, done.stdout + done.stderr)
