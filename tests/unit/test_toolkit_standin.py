"""The harness's toolkit stand-in (tests/support/toolkit.py) against the toolkit's own cases.

Each table row is a case of NVIDIA/nvidia-container-toolkit's
internal/config/image/cuda_image_test.go (the test function named above its table),
with the device list the toolkit's test expects; the last tables are what the bug of
issue 42 turns on: what gpu-alloc's rewrite puts in a leased container's env.
"""

from __future__ import annotations

import pytest

from tests.support import toolkit
from tests.support.toolkit import Config, SpecError

GPU, ANOTHER, THIRD = "GPU-12345", "GPU-67890", "MIG-12345"
SWARM = "DOCKER_RESOURCE_GPUS"
ADDITIONAL = "DOCKER_RESOURCE_GPUS_ADDITIONAL"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
LEGACY = {"CUDA_VERSION": "11.0"}

# cuda_image_test.go TestGetDevicesFromEnvvar: (preferred swarm-resource, env, devices),
# privileged.
FROM_ENV = [
    ((), {}, []),
    ((), {VISIBLE: ""}, []),
    ((), {VISIBLE: "void"}, []),
    ((), {VISIBLE: "none"}, [""]),
    ((), {VISIBLE: GPU}, [GPU]),
    ((), {VISIBLE: GPU, **LEGACY}, [GPU]),
    ((), LEGACY, ["all"]),
    # DOCKER_RESOURCE_GPUS present, swarm-resource not configured: ignored
    ((), {SWARM: ANOTHER}, []),
    ((), {VISIBLE: "", SWARM: ANOTHER}, []),
    ((), {VISIBLE: "void", SWARM: ANOTHER}, []),
    ((), {VISIBLE: "none", SWARM: ANOTHER}, [""]),
    ((), {VISIBLE: GPU, SWARM: ANOTHER}, [GPU]),
    ((), {VISIBLE: GPU, SWARM: ANOTHER, **LEGACY}, [GPU]),
    ((), {SWARM: ANOTHER, **LEGACY}, ["all"]),
    # configured: the swarm variable, when present, is read instead
    ((SWARM,), {}, []),
    ((SWARM,), {SWARM: ""}, []),
    ((SWARM,), {SWARM: "void"}, []),
    ((SWARM,), {SWARM: "none"}, [""]),
    ((SWARM,), {SWARM: GPU}, [GPU]),
    ((SWARM,), {SWARM: GPU, **LEGACY}, [GPU]),
    ((SWARM,), {VISIBLE: GPU, SWARM: ANOTHER}, [ANOTHER]),
    ((ADDITIONAL,), {VISIBLE: GPU, ADDITIONAL: ANOTHER}, [ANOTHER]),
    ((SWARM, ADDITIONAL), {VISIBLE: GPU, SWARM: THIRD, ADDITIONAL: ANOTHER}, [THIRD, ANOTHER]),
    ((SWARM, ADDITIONAL), {VISIBLE: GPU, ADDITIONAL: ANOTHER}, [ANOTHER]),
]


@pytest.mark.parametrize(("preferred", "env", "expected"), FROM_ENV)
def test_devices_from_the_env_are_the_toolkits(
    preferred: tuple[str, ...], env: dict[str, str], expected: list[str]
) -> None:
    config = Config(swarm_resource=preferred, accept_envvar_unprivileged=False)
    listed = [f"{k}={v}" for k, v in env.items()]
    assert toolkit.devices(listed, privileged=True, config=config) == expected


def _null_mounts(*names: str) -> list[tuple[str, str]]:
    return [("/dev/null", f"{toolkit.MOUNTS_ROOT}/{n}") for n in names]


# cuda_image_test.go TestGetVisibleDevicesFromMounts: (mounts, devices).
FROM_MOUNTS = [
    ([], []),
    ([("/not/dev/null", f"{toolkit.MOUNTS_ROOT}/GPU0")], []),
    ([("/dev/null", "/other/prefix/GPU0")], []),
    ([("/dev/null", toolkit.MOUNTS_ROOT)], []),
    (_null_mounts("GPU0", "GPU1"), ["GPU0", "GPU1"]),
    (_null_mounts("GPU0-MIG0/0/1", "GPU1-MIG0/0/1"), ["GPU0-MIG0/0/1", "GPU1-MIG0/0/1"]),
    (_null_mounts("GPU0", "nvidia.com/gpu=all", "GPU1"), ["GPU0", "nvidia.com/gpu=all", "GPU1"]),
    (_null_mounts("GPU0", "imex/0", "GPU1"), ["GPU0", "GPU1"]),
    (_null_mounts("cdi/nvidia.com/gpu/0"), ["nvidia.com/gpu=0"]),
]


@pytest.mark.parametrize(("mounts", "expected"), FROM_MOUNTS)
def test_devices_from_volume_mounts_are_the_toolkits(
    mounts: list[tuple[str, str]], expected: list[str]
) -> None:
    config = Config(accept_volume_mounts=True, accept_envvar_unprivileged=False)
    assert toolkit.devices([], mounts, config=config) == expected


# cuda_image_test.go TestVisibleDevices: (mounts, NVIDIA_VISIBLE_DEVICES, privileged, accept
# unprivileged, accept mounts, swarm-resource, more env, devices).
VISIBLE_DEVICES = [
    (_null_mounts("GPU0", "GPU1"), "GPU2,GPU3", False, False, True, (), {}, ["GPU0", "GPU1"]),
    ([], "GPU0,GPU1", False, False, True, (), {}, []),
    ([], "GPU0,GPU1", True, False, True, (), {}, ["GPU0", "GPU1"]),
    ([], "GPU0,GPU1", False, True, True, (), {}, ["GPU0", "GPU1"]),
    (_null_mounts("GPU0", "GPU1"), "GPU2,GPU3", False, True, False, (), {}, ["GPU2", "GPU3"]),
    (_null_mounts("GPU0", "GPU1"), "GPU2,GPU3", False, False, False, (), {}, []),
    ([], "", True, False, True, (SWARM,), {SWARM: GPU}, [GPU]),
    ([], "", False, True, True, (SWARM,), {SWARM: GPU}, [GPU]),
    ([], "", False, False, True, (SWARM,), {SWARM: GPU}, []),
    ([], "", True, False, True, (SWARM, ADDITIONAL), {SWARM: GPU, ADDITIONAL: ANOTHER},
     [GPU, ANOTHER]),
    ([], GPU, True, False, True, (SWARM,), {}, [GPU]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mounts", "visible", "privileged", "unprivileged", "accept_mounts", "preferred", "env",
     "expected"),
    VISIBLE_DEVICES,
)  # fmt: skip
def test_visible_devices_are_the_toolkits(
    mounts: list[tuple[str, str]],
    visible: str,
    privileged: bool,
    unprivileged: bool,
    accept_mounts: bool,
    preferred: tuple[str, ...],
    env: dict[str, str],
    expected: list[str],
) -> None:
    listed = [f"{k}={v}" for k, v in ({VISIBLE: visible} if visible else {}).items()]
    listed += [f"{k}={v}" for k, v in env.items()]
    config = Config(preferred, unprivileged, accept_mounts)
    assert toolkit.devices(listed, mounts, privileged=privileged, config=config) == expected


def test_cdi_annotations_come_first_in_key_order_where_the_runtime_reads_them() -> None:
    """cuda_image_test.go TestCDIDeviceRequestsFromAnnotations; the hook reads none."""
    annotations = {"cdi.k8s.io/b": "vendor.com/class=1", "cdi.k8s.io/a": "vendor.com/class=0",
                   "other/key": "vendor.com/class=9"}  # fmt: skip
    runtime = Config(annotation_prefixes=(toolkit.CDI_ANNOTATION_PREFIX,))
    env = [f"{VISIBLE}={GPU}"]
    assert toolkit.devices(env, annotations=annotations, config=runtime) == [
        "vendor.com/class=0",
        "vendor.com/class=1",
    ]
    assert toolkit.devices(env, annotations=annotations) == [GPU]


def test_all_and_none_decide_alone_and_void_anywhere_is_no_gpu_container() -> None:
    """devices.go NewVisibleDevices and cuda_image.go devicesFromEnvvars."""
    assert toolkit.devices([f"{VISIBLE}=0, all"]) == ["all"]
    assert toolkit.devices([f"{VISIBLE}=none,0"]) == [""]
    assert toolkit.devices([f"{VISIBLE}=0,void"]) == []
    assert toolkit.devices([f"{VISIBLE}= 0 ,,1"]) == ["0", "1"]


def test_the_last_value_of_a_variable_set_twice_is_read() -> None:
    """builder.go WithEnv: the env is a map; swarm appends its value after the pin."""
    config = Config(swarm_resource=("DOCKER_RESOURCE_GPU",))
    env = ["DOCKER_RESOURCE_GPU=void", f"DOCKER_RESOURCE_GPU={GPU}"]
    assert toolkit.devices(env, config=config) == [GPU]


def test_an_env_entry_without_equals_is_refused() -> None:
    with pytest.raises(SpecError):
        toolkit.devices(["NVIDIA_VISIBLE_DEVICES"])


def test_legacy_needs_a_non_empty_cuda_version_and_no_requirement() -> None:
    assert toolkit.devices(["CUDA_VERSION=11.0", "NVIDIA_REQUIRE_CUDA="]) == ["all"]
    assert toolkit.devices(["CUDA_VERSION=11.0", "NVIDIA_REQUIRE_CUDA=cuda>=11"]) == []
    assert toolkit.devices(["CUDA_VERSION="]) == []


def test_an_oci_spec_is_privileged_by_cap_sys_admin_in_its_bounding_set() -> None:
    """privileged.go IsPrivileged."""
    unprivileged = Config(accept_envvar_unprivileged=False)
    spec = {"process": {"env": [f"{VISIBLE}=0"], "capabilities": {"bounding": ["CAP_CHOWN"]}}}
    assert toolkit.of_spec(spec, unprivileged) == []
    spec["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")  # type: ignore[index]
    assert toolkit.of_spec(spec, unprivileged) == ["0"]


def test_the_config_toml_sets_swarm_resource_only_when_uncommented() -> None:
    """api/config/v1/toml.go: the default file has swarm-resource commented out."""
    assert Config.from_toml('#swarm-resource = "DOCKER_RESOURCE_GPU"\n') == Config()
    said = Config.from_toml('swarm-resource = "DOCKER_RESOURCE_GPU, DOCKER_RESOURCE_X"\n')
    assert said.swarm_resource == ("DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_X")


def test_gpus_resolve_indices_uuids_all_and_none() -> None:
    uuids = ["GPU-a", "GPU-b", "GPU-c"]
    assert toolkit.gpus(["1", "GPU-c"], uuids) == {"GPU-b", "GPU-c"}
    assert toolkit.gpus(["all"], uuids) == set(uuids)
    assert toolkit.gpus([""], uuids) == set()


# What issue 42 turns on: a leased `--gpus 1` as gpu-alloc's shim writes it, on a host
# whose toolkit reads swarm-resource.  dockerd appends the request's variable last.
SWARM_CONFIG = Config(swarm_resource=("DOCKER_RESOURCE_GPU",))


def test_a_void_swarm_pin_takes_a_leased_gpu_away_where_swarm_resource_is_set() -> None:
    env = [f"{VISIBLE}={GPU}", "DOCKER_RESOURCE_GPU=void", f"{VISIBLE}={GPU}"]
    assert toolkit.devices(env) == [GPU]
    assert toolkit.devices(env, config=SWARM_CONFIG) == []


def test_a_swarm_variable_naming_the_lease_gives_it_with_or_without_swarm_resource() -> None:
    env = [f"{VISIBLE}={GPU}", f"DOCKER_RESOURCE_GPU={GPU}", f"{VISIBLE}={GPU}"]
    assert toolkit.devices(env) == [GPU]
    assert toolkit.devices(env, config=SWARM_CONFIG) == [GPU]
