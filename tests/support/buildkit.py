"""A real BuildKit client asking a build step for a GPU, and the CDI spec it asks by.

`../shared/engines/buildkit-cdi-probe.xz` (its Go source beside it; usage in
../shared/docs/engine-29.md) is BuildKit's own client library: ``probe ADDRESS IMAGE
DEVICE`` runs one build step from IMAGE with the CDI device DEVICE and the ``device``
entitlement, and exits 0 only if the step saw /dev/nvidia0.  ADDRESS ``unix://PATH``
speaks gRPC directly on the socket (Engine 29.2+); ``upgrade://PATH`` first asks
``POST /grpc`` with ``Upgrade: h2c``, as the docker CLI's builder does.

The CDI spec names the simulated GPUs (`engine.sim_gpu_uuid`) as ``nvidia.com/gpu=0..N-1``
and ``all``, each bringing its fake device node (195:N, made under the kernel's /dev,
which a root Engine sees through its bind of /dev) and its NVIDIA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from allocator.core import builds
from tests.support import engine, engine_root

PROBE = "buildkit-cdi-probe"
NODES = Path("/dev/gpu-alloc-test-nodes")
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


def make_gpu_nodes(count: int) -> list[Path]:
    NODES.mkdir(parents=True, exist_ok=True)
    made = []
    for minor in range(count):
        path = NODES / f"nvidia{minor}"
        if not path.exists():
            os.mknod(path, 0o600 | 0o020000, os.makedev(195, minor))
        made.append(path)
    return made


def cdi_spec(count: int) -> dict[str, object]:
    nodes = make_gpu_nodes(count)

    def edits(minors: list[int]) -> dict[str, object]:
        uuids = ",".join(engine.sim_gpu_uuid(m) for m in minors)
        return {
            "env": [f"NVIDIA_VISIBLE_DEVICES={uuids}"],
            "deviceNodes": [
                {"path": f"/dev/nvidia{m}", "hostPath": str(nodes[m]), "type": "c",
                 "major": 195, "minor": m}
                for m in minors
            ],
        }  # fmt: skip

    devices = [{"name": str(m), "containerEdits": edits([m])} for m in range(count)]
    devices.append({"name": "all", "containerEdits": edits(list(range(count)))})
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}


def write_daemon_json(directory: Path, count: int, closed: bool) -> dict[str, object]:
    """``directory``/daemon.json naming a CDI spec dir with the simulated GPUs; ``closed``:
    with what deploy/install.sh writes (builder.entitlements.device false)."""
    (directory / "cdi").mkdir(parents=True, exist_ok=True)
    (directory / "cdi" / "nvidia.json").write_text(json.dumps(cdi_spec(count)))
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
