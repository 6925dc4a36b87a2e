"""Privileged mode by policy (allocator/core/access/privileged.py): which creates ask for the whole
host, and which leases cover it."""

from __future__ import annotations

import pytest

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


def create(**host_config):
    """No container a namespace mode names exists (allocator/core/access/joined.py)."""
    body = {"HostConfig": host_config}
    return decide.access.of_create(body, EngineView(), GPUS, None, lambda name: None)


@pytest.mark.parametrize(
    "host_config",
    [
        {"PidMode": "host", "CapAdd": ["SYS_PTRACE"]},
        {"PidMode": "host", "CapAdd": ["CAP_SYS_PTRACE"]},
        {"PidMode": "host", "CapAdd": ["sys_ptrace"]},
        {"PidMode": "host", "CapAdd": "SYS_PTRACE"},  # StrSlice: one string
        {"PidMode": "host", "CapAdd": ["NET_ADMIN", "ALL"]},
        {"PidMode": "container:other", "CapAdd": ["SYS_PTRACE"]},
        {"CapAdd": ["DAC_READ_SEARCH"]},
        {"CapAdd": ["cap_dac_read_search"]},
        {"CapAdd": ["ALL"], "CapDrop": ["DAC_READ_SEARCH"]},  # a drop is not trusted
        {"CapAdd": ["SYS_MODULE"]},
        {"CapAdd": ["CAP_SYS_RAWIO"]},
        {"PidMode": "HOST", "CapAdd": ["SYS_PTRACE"]},  # compared without case
    ],
)
def test_powers_that_make_a_container_root_on_the_host_hold_every_gpu(host_config):
    grants = create(**host_config)
    assert grants.refused() and not grants.pinned
    assert all("root on the host" in g.detail for g in grants.refused())
    assert not privileged.asked(grants)  # refused even under lease-all: no lease pins it


@pytest.mark.parametrize(
    "host_config",
    [
        {"PidMode": "host"},
        {"CapAdd": ["SYS_PTRACE"]},
        {"PidMode": "host", "CapAdd": ["DAC_OVERRIDE", "FOWNER", "NET_ADMIN"]},
        {"PidMode": "container:x", "CapAdd": ["NET_RAW"]},
        {"Privileged": True, "PidMode": "host", "CapAdd": ["ALL"]},  # privileged's own row
    ],
)
def test_other_powers_are_not_root_on_the_host(host_config):
    assert not [g for g in create(**host_config).grants if g.field != privileged.FIELD]


def test_the_refusal_says_what_to_drop():
    facts = decide.Facts(GPUS, EngineView(), host=None)  # type: ignore[arg-type]
    body = {"Image": "x", "HostConfig": {"PidMode": "host", "CapAdd": ["SYS_PTRACE"]}}
    denied = decide.shim_ask(body, facts)
    assert isinstance(denied, decide.Deny), denied
    assert "root on the host" in denied.msg and "SYS_PTRACE" in denied.msg
