"""The canonical create body the shim forwards (allocator/core/api/rewrite.py)."""

from __future__ import annotations

from allocator.core.api import labels
from allocator.core.api.rewrite import rewrite, strip_labels
from allocator.core.machine.cpus import Placed

GPUS = ("GPU-a", "GPU-b")
ASKED = {"Count": 2, "Capabilities": [["gpu"]]}


def spec(**extra: object) -> dict:
    return {"Image": "busybox", "Env": ["NVIDIA_VISIBLE_DEVICES=all", "A=1"],
            "Labels": {"team": "a", labels.LEASE: "forged"},
            "HostConfig": {"DeviceRequests": [ASKED]}, **extra}  # fmt: skip


def test_a_leased_create_gets_its_gpus_by_uuid_the_guard_env_and_the_lease_label() -> None:
    out = rewrite(spec(), GPUS, "l1", caps=("gpu", "utility"))
    assert out["HostConfig"]["DeviceRequests"] == [{
        "Driver": "nvidia", "Count": 0, "DeviceIDs": ["GPU-a", "GPU-b"],
        "Capabilities": [["gpu", "utility"]], "Options": {},
    }]  # fmt: skip
    assert out["Env"] == [
        "A=1",
        "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b",
        "DOCKER_RESOURCE_GPU=GPU-a,GPU-b",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ]
    assert out["Labels"] == {"team": "a", labels.PLACED: "", labels.LEASE: "l1"}


def test_a_cuda_device_order_the_user_set_is_kept() -> None:
    out = rewrite(spec(Env=["CUDA_DEVICE_ORDER=FASTEST_FIRST"]), GPUS, "l1")
    assert [e for e in out["Env"] if e.startswith("CUDA_DEVICE_ORDER=")] == [
        "CUDA_DEVICE_ORDER=FASTEST_FIRST"
    ]


def test_a_create_without_gpus_gets_only_the_void_guard_and_no_gpu_alloc_label() -> None:
    out = rewrite(spec(), (), None)
    assert out["Env"] == ["A=1", "NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU=void"]
    assert out["Labels"] == {"team": "a"}
    assert out["HostConfig"]["DeviceRequests"] == [ASKED]


def test_cores_and_memory_placed_with_the_gpus_are_set_and_labelled() -> None:
    out = rewrite(spec(), GPUS, "l1", placed=Placed(cpus=(0, 1, 16, 17), mems=(0,), memory=1 << 30))
    hc = out["HostConfig"]
    assert (hc["CpusetCpus"], hc["CpusetMems"], hc["Memory"]) == ("0-1,16-17", "0", 1 << 30)
    assert out["Labels"][labels.PLACED] == "cpus,memory"


def test_client_labels_under_the_prefix_are_dropped_and_others_kept() -> None:
    assert strip_labels(spec())["Labels"] == {"team": "a"}
    untouched = {"Labels": {"team": "a"}}
    assert strip_labels(untouched) is untouched


def swarm_env(out: dict) -> list[str]:
    return [e for e in out["Env"] if e.startswith("DOCKER_RESOURCE_")]


def test_a_create_without_gpus_has_the_swarm_variable_pinned_void_unless_it_sets_it() -> None:
    """A toolkit with swarm-resource reads DOCKER_RESOURCE_<swarm.kind> instead of
    NVIDIA_VISIBLE_DEVICES: the pin keeps an image's ENV of it from selecting GPUs."""
    out = rewrite(spec(), (), None, swarm_variable="DOCKER_RESOURCE_NVIDIA_GPU")
    assert out["Env"][-1] == "DOCKER_RESOURCE_NVIDIA_GPU=void"
    own = rewrite(spec(Env=["DOCKER_RESOURCE_GPU=void"]), (), None)
    assert swarm_env(own) == ["DOCKER_RESOURCE_GPU=void"]


def test_a_leased_create_has_the_swarm_variable_name_its_gpus_never_void() -> None:
    """Else a toolkit with swarm-resource gives the leased container no GPU (issue 42)."""
    out = rewrite(spec(), GPUS, "l1", swarm_variable="DOCKER_RESOURCE_NVIDIA_GPU")
    assert swarm_env(out) == ["DOCKER_RESOURCE_NVIDIA_GPU=GPU-a,GPU-b"]
    voided = rewrite(spec(Env=["DOCKER_RESOURCE_GPU=void", "DOCKER_RESOURCE_GPU=0"]), GPUS, "l1")
    assert swarm_env(voided) == ["DOCKER_RESOURCE_GPU=GPU-a,GPU-b"]


def test_a_leased_create_keeps_a_swarm_variable_of_another_kind_for_the_plugin() -> None:
    out = rewrite(spec(Env=["DOCKER_RESOURCE_OTHER=GPU-c"]), GPUS, "l1")
    assert swarm_env(out) == ["DOCKER_RESOURCE_OTHER=GPU-c", "DOCKER_RESOURCE_GPU=GPU-a,GPU-b"]
