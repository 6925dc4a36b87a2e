"""Privileged mode by policy (allocator/core/access/privileged.py): which creates ask for the whole
host, and which leases cover it."""

from __future__ import annotations

from allocator.core.access import privileged
from allocator.core.access.facts import EngineView
from allocator.core.judging import verdicts as decide
from allocator.core.machine.inventory import GPU, Inventory
from tests.support import engine

UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]
GPUS = Inventory(tuple(GPU(u, k) for k, u in enumerate(UUIDS)))


def test_the_plugin_admits_a_privileged_create_only_for_a_lease_of_the_whole_host():
    spec = {"Env": [f"NVIDIA_VISIBLE_DEVICES={','.join(UUIDS[:3])}"]}
    grants = decide.access.of_create({"HostConfig": {"Privileged": True}}, EngineView(), GPUS, None)
    assert privileged.asked(grants)
    assert isinstance(privileged.leased(spec, grants, GPUS), str)  # GPU 3 left out
    spec = {"Env": [f"NVIDIA_VISIBLE_DEVICES={','.join(UUIDS)}"]}
    assert privileged.leased(spec, grants, GPUS) == frozenset(UUIDS)


def test_every_mig_slice_counts_as_the_host():
    parent = GPU("GPU-m", 1, mig_mode=True)
    slices = tuple(GPU(f"MIG-{k}", 1, parent="GPU-m", mig_index=k) for k in range(2))
    inv = Inventory((GPU("GPU-0", 0), parent), migs=slices)
    assert privileged.covers_host(inv, ["GPU-0", "MIG-0", "MIG-1"])
    assert privileged.covers_host(inv, ["GPU-0"])  # policy.mig: none leases no slice
    assert not privileged.covers_host(inv, ["GPU-0", "MIG-0"])  # one slice left to others
    assert not privileged.covers_host(inv, ["MIG-0", "MIG-1"])
