"""MIG slices through the real stack, with a simulated MIG inventory and the docker CLI.

GPU 0 and GPU 1 are in MIG mode (three and two slices); GPUs 2 and 3 are whole.  Under
``policy.mig: single`` slices are the units of ``--gpus N``; under ``mixed`` they are
asked by profile with the ``io.gpu-alloc.request.mig`` label.  A GPU in MIG mode is never
leased whole, and the plugin refuses a slice or its GPU asked on the real socket.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import engine
from tests.support.faults import IMAGE, real, shim, status, visible_devices

GPU = [engine.sim_gpu_uuid(k) for k in range(4)]
A0, A1, A2 = (f"MIG-0a000000-0000-0000-0000-00000000000{k}" for k in range(3))
B0, B1 = (f"MIG-0b000000-0000-0000-0000-00000000000{k}" for k in range(2))
SLICES = {A0, A1, A2, B0, B1}


def sim() -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = [
        {"uuid": GPU[k], "index": k, "minor": k, "numa_node": 0, "memory_mib": 81920,
         "pci_bus_id": f"00000000:{0x10 + k:02X}:00.0"}
        for k in range(4)
    ]  # fmt: skip
    gpus[0]["migs"] = [
        {"uuid": A0, "profile": "1g.10gb", "memory_mib": 9984},
        {"uuid": A1, "profile": "1g.10gb", "memory_mib": 9984},
        {"uuid": A2, "profile": "3g.40gb", "memory_mib": 40192},
    ]
    gpus[1]["migs"] = [
        {"uuid": B0, "profile": "1g.10gb", "memory_mib": 9984},
        {"uuid": B1, "profile": "3g.40gb", "memory_mib": 40192},
    ]
    return gpus


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=4, sim=sim(), policy={"mig": "single"})


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def run_d(stack: engine.Stack, gpus: str, *extra: str) -> tuple[str, set[str]]:
    cid = ok(shim(stack, "run", "-d", "--gpus", gpus, *extra, IMAGE, "sleep", "300"))
    return cid, set((visible_devices(stack, cid) or "").split(","))


def test_single_leases_gpus_2_as_two_distinct_slices(stack: engine.Stack) -> None:
    cid, got = run_d(stack, "2")
    assert len(got) == 2 and got <= SLICES, got
    _, more = run_d(stack, "2")
    assert more <= SLICES and not more & got
    snap = status(stack, reconcile=False)
    held = {m["uuid"]: m["holder"]["container"] for m in snap["migs"] if not m["free"]}
    assert held.keys() == got | more and held[next(iter(got))] == cid


def test_a_gpu_in_mig_mode_is_never_leased_whole_and_never_overlaps_a_slice(
    stack: engine.Stack,
) -> None:
    run_d(stack, f'"device={A0}"')
    refused = shim(stack, "run", "--rm", "--gpus", "device=0", IMAGE, "true")
    assert refused.returncode != 0
    assert "in MIG mode, so it is leased only as its slices" in refused.stderr
    _, rest = run_d(stack, "6")  # every other unit: four slices and GPUs 2, 3
    assert rest == {A1, A2, B0, B1, GPU[2], GPU[3]}
    again = shim(stack, "run", "--rm", "--gpus", f"device={A0}", IMAGE, "true")
    assert again.returncode != 0 and "asked by name, is not free" in again.stderr
    assert "Name others, or wait" in again.stderr  # a slice: no count to ask for


@pytest.mark.parametrize("gpus", [f"device={A1}", "device=0:1", "device=0", "1"])
def test_the_plugin_refuses_a_slice_or_its_gpu_on_the_real_socket(
    stack: engine.Stack, gpus: str
) -> None:
    refused = real(stack, "run", "--rm", "--gpus", gpus, IMAGE, "true")
    assert refused.returncode != 0
    assert "without a gpu-alloc lease" in refused.stderr or "not pinned" in refused.stderr


def test_status_lists_the_slices_under_their_gpu(stack: engine.Stack) -> None:
    from tests.support.engine import gpu_alloc

    table = ok(gpu_alloc(stack, "status", "--no-reconcile"))
    snap = status(stack, reconcile=False)
    assert [g["free"] for g in snap["gpus"]] == [False, False, True, True]  # 0, 1: MIG mode
    assert snap["free"] == 2 and len(snap["migs"]) == 5
    print(table)
    assert "GPU 0 is in MIG mode, leased as its slices" in table
    assert "GPU 1 is in MIG mode" in table and "0:2 3g.40gb" in table
    assert [(m["index"], m["mig_index"], m["uuid"]) for m in snap["migs"]][2] == (0, 2, A2)


def test_mixed_leases_slices_by_profile_and_whole_gpus_without_a_label() -> None:
    s = engine.Stack(gpus=4, sim=sim(), policy={"mig": "mixed"}).start()
    try:
        label = "io.gpu-alloc.request.mig=3g.40gb"
        _, big = run_d(s, "2", "--label", label)
        assert big == {A2, B1}
        _, whole = run_d(s, "1")
        assert whole <= {GPU[2], GPU[3]}
        short = shim(s, "run", "--rm", "--gpus", "1", "--label", label, IMAGE, "true")
        assert short.returncode != 0 and "1 MIG slice of profile 3g.40gb" in short.stderr
    finally:
        s.stop()
