"""MPS shares on a real NVIDIA GPU: skipped where there is no driver, no MPS or no root.

gpu-alloc's own daemon code (allocator/host/mps.py) starts GPU 0's MPS control daemon
with two shares' caps, as a share's first lease would; two clients, each in a mount
namespace with the share's private /dev/shm as a container has it, allocate under and
over their memory cap with the driver API (ctypes, no CUDA toolkit needed), at once.
The GPU is in compute mode EXCLUSIVE_PROCESS while the daemon runs and in its own mode
once it stops; the daemon is stopped at the end, and GPU 0's mode set back only where
the test left it otherwise (a failure between the two).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.core.machine.inventory import GPU
from allocator.core.rules import sharing
from allocator.host.mps import Daemons
from allocator.host.nvml import EXCLUSIVE_PROCESS, NvmlModes


def _why_not() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as e:
        return f"no NVIDIA driver: {e}"
    if shutil.which("nvidia-cuda-mps-control") is None:
        return "nvidia-cuda-mps-control is not on PATH"
    if os.geteuid() != 0:
        return "needs root (the daemon's private /dev/shm is a bind mount)"
    return None


WHY = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
CAP_MIB = 2048  # each share's pinned device memory

# A share's process: context on its only device, then an allocation under its cap
# and one over it; prints "under=<CUresult> over=<CUresult>".
CLIENT = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit"
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate"
under = cuda.cuMemAlloc_v2(ctypes.byref(ptr), (int(sys.argv[1]) - 512) << 20)
if under == 0:
    cuda.cuMemFree_v2(ptr)
over = cuda.cuMemAlloc_v2(ctypes.byref(ptr), (int(sys.argv[1]) + 512) << 20)
print(f"under={under} over={over}", flush=True)
"""


@pytest.fixture
def gpu0() -> GPU:
    from allocator.host import nvml

    return nvml.read().gpus[0]


@pytest.fixture
def mode_before(gpu0: GPU) -> Iterator[int]:
    """GPU 0's compute mode before the test, set back after it only if it was changed."""
    modes = NvmlModes()
    before = modes.get(gpu0.uuid)
    yield before
    if modes.get(gpu0.uuid) != before:
        modes.set(gpu0.uuid, before)


def test_two_shares_each_run_and_each_meets_its_memory_cap(
    gpu0: GPU, tmp_path: Path, mode_before: int
) -> None:
    rule = sharing.Sharing(gpus=(gpu0.index,), shares=2, memory=CAP_MIB << 20)
    modes = NvmlModes()
    daemons = Daemons(str(tmp_path / "mps"), modes=modes)
    daemons.start(gpu0.uuid, sharing.daemon_commands(rule, gpu0))
    try:
        assert modes.get(gpu0.uuid) == EXCLUSIVE_PROCESS
        top = tmp_path / "mps" / gpu0.uuid
        env = {**os.environ, sharing.PIPE_ENV: str(top / sharing.PIPE)}
        env.pop("CUDA_VISIBLE_DEVICES", None)  # the client sees what MPS gives it
        argv = [
            "unshare", "--mount", "--propagation", "slave", "sh", "-c",
            'mount --bind "$1" /dev/shm && shift && exec "$@"', "sh", str(top / sharing.SHM),
            sys.executable, "-c", CLIENT, str(CAP_MIB),
        ]  # fmt: skip
        clients = [
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        said = [c.communicate(timeout=120) for c in clients]
    finally:
        daemons.stop(gpu0.uuid)
    for client, (out, err) in zip(clients, said, strict=True):
        assert client.returncode == 0, err.decode()
        assert out.decode().split() == ["under=0", "over=2"], err.decode()  # 2: out of memory
    assert daemons.running() == set()
    assert modes.get(gpu0.uuid) == mode_before
