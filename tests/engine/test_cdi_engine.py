"""CDI names judged as the Engine turns them, on every Engine.

An nvidia device request's id that holds ``=`` is a CDI name: Engine 29 (with the
toolkit's CDI hook) passes it on as it is, so ``--gpus device=nvidia.com/gpu=all`` is every
GPU and ``nvidia.com/gpu=1`` GPU 1; ``--device nvidia.com/gpu=0`` asks the Engine's CDI
(the ``cdi`` driver from 26 on) directly.  The module's dockerd reads a CDI spec for the
simulated GPUs where it can (26 on, tests/support/cdi.py), so what the Engine would give
is real, and the shim and the plugin must judge each name as those GPUs.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.support import cdi, engine
from tests.support.engine_root import selected

IMAGE = engine.BUSYBOX_TAG
UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]
MAJOR = int(selected().version.split(".")[0])
# Engine 29 turns --gpus into CDI devices; 26 and 28 read CDI only for --device.
GPUS_MODE = "cdi" if MAJOR >= 29 else "hook"


def make_stack() -> engine.Stack:
    stack = engine.Stack(gpus=4)
    stack.gpu_mode = "cdi" if MAJOR >= cdi.FIRST else "hook"
    return stack


def shim(stack: engine.Stack, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args)


def real(stack: engine.Stack, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.engine_sock, *args)


def seen(stack: engine.Stack, sock: str, *args: str) -> subprocess.CompletedProcess:
    """A --rm container printing the GPUs the Engine gave it."""
    how = ["sh", "-c", cdi.seen(GPUS_MODE)]
    return engine.docker_cli(getattr(stack, sock), "run", "--rm", *args, IMAGE, *how)


def held(stack: engine.Stack) -> list[str]:
    out = engine.gpu_alloc(stack, "status", "--json")
    assert out.returncode == 0, out.stderr
    return [g["uuid"] for g in json.loads(out.stdout)["gpus"] if not g["free"]]


def test_a_gpu_named_by_its_cdi_name_gets_that_gpu_leased(stack):
    out = seen(stack, "shim_sock", "--gpus", '"device=nvidia.com/gpu=1"')
    assert out.returncode == 0, out.stderr + stack.logs()
    assert out.stdout.strip() == UUIDS[1]


def test_every_gpu_by_its_cdi_name_is_every_gpu(stack):
    holder = shim(stack, "run", "-d", "--gpus", '"device=2"', IMAGE, "sleep", "30")
    assert holder.returncode == 0, holder.stderr
    refused = seen(stack, "shim_sock", "--gpus", "device=nvidia.com/gpu=all")
    assert refused.returncode != 0, refused.stderr
    assert "asked for all GPUs, 3 of 4 free" in refused.stderr, refused.stderr
    assert held(stack) == [UUIDS[2]]
    assert shim(stack, "rm", "-f", holder.stdout.strip()).returncode == 0
    whole = seen(stack, "shim_sock", "--gpus", "device=nvidia.com/gpu=all")
    assert whole.returncode == 0, whole.stderr + stack.logs()
    assert sorted(whole.stdout.strip().split(",")) == UUIDS


@pytest.mark.parametrize(
    "args",
    [("--gpus", "device=nvidia.com/gpu=all"), ("--gpus", '"device=nvidia.com/gpu=0"'),
     ("--device", "nvidia.com/gpu=0"), ("--device", "nvidia.com/gpu=all")],
    ids=["gpus-all", "gpus-0", "device-0", "device-all"],
)  # fmt: skip
def test_cdi_names_on_the_real_socket_are_denied(stack, args):
    out = seen(stack, "engine_sock", *args)
    assert out.returncode != 0
    assert "authorization denied by plugin" in out.stderr, out.stderr
    assert engine.engine_api(stack.engine_sock).containers(all=True) == []


def test_a_cdi_device_through_the_shim_is_refused_naming_the_gpu(stack):
    out = seen(stack, "shim_sock", "--device", "nvidia.com/gpu=0")
    assert out.returncode != 0
    assert "CDI device nvidia.com/gpu=0" in out.stderr, out.stderr
    assert engine.engine_api(stack.engine_sock).containers(all=True) == []
    assert held(stack) == []


def test_a_gpu_the_cdi_spec_does_not_name_is_given_the_hooks_way_the_same_gpu():
    """29 cannot inject `nvidia.com/gpu=<uuid>` from a spec that names GPUs by index only: it
    logs the error and falls back to the runtime hook with the same ids (older Engines use
    the hook for --gpus anyway).  Either way the container gets the GPU asked, no other."""
    mode = "cdi" if MAJOR >= cdi.FIRST else "hook"
    with engine.Dockerd(gpu_mode=mode, gpus=UUIDS) as dockerd:
        if mode == "cdi":
            by_index = cdi.spec(UUIDS)
            by_index["devices"] = [d for d in by_index["devices"] if d["name"][0] != "G"]
            (dockerd.dir / "cdi" / cdi.SPEC).write_text(json.dumps(by_index))
            time.sleep(1)  # dockerd watches its spec directories
        engine.import_busybox(dockerd.sock)
        got = engine.docker_cli(
            dockerd.sock, "run", "--rm", "--gpus", f"device={UUIDS[1]}", IMAGE,
            "sh", "-c", f"printenv NVIDIA_VISIBLE_DEVICES; {cdi.seen('cdi')}",
        )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[:2] == [UUIDS[1], ""]  # the hook's ids; nothing injected
