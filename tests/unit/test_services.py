"""Swarm service specs as a manager's plugin and shim judge them
(allocator/core/judging/services.py).

A task never passes a plugin, so the spec is all there is to judge: a service may reach
GPUs only through a generic-resource reservation, must pin NVIDIA_VISIBLE_DEVICES=void
and DOCKER_RESOURCE_GPU=void (nvidia is the default runtime on swarm nodes, and an image's
ENV is merged under the spec's), and is refused whatever else could give its tasks devices.
"""

from __future__ import annotations

import json

import pytest

from allocator.core.access.facts import EngineView, Node
from allocator.core.api import gojson
from allocator.core.api.routes import classify
from allocator.core.judging import decisions, route_checks, services
from allocator.core.judging.decisions import Deny, Facts
from tests.support.table_host import TableHost
from tests.unit.test_access import INVENTORY

ENGINE = EngineView(version=(20, 10, 24))
PIN = "NVIDIA_VISIBLE_DEVICES=void"
RESOURCE_PIN = "DOCKER_RESOURCE_GPU=void"
PINS = (PIN, RESOURCE_PIN)


def spec(env=PINS, mounts=(), gpus=1, **container) -> dict:
    """The body `docker service create --generic-resource gpu=N` sends, ContainerSpec extras
    in `container`."""
    reserved = [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": gpus}}] if gpus else []
    cs = {"Image": "cuda:12", "Env": list(env), "Mounts": list(mounts), **container}
    return {
        "Name": "train",
        "TaskTemplate": {
            "ContainerSpec": cs,
            "Resources": {"Reservations": {"GenericResources": reserved}},
        },
        "Mode": {"Replicated": {"Replicas": 2}},
    }


def judge(body: dict, host: TableHost | None = None) -> str | None:
    return services.refusal(body, "gpu", ENGINE, INVENTORY, host or TableHost())


def verdict(uri: str, body: bytes | None, marked: bool = True) -> decisions.Decision:
    """The plugin's verdict on a service write; ``marked``: one the shim forwarded
    (`core.judging.service_marks`), so only its spec is judged."""
    facts = Facts(INVENTORY, ENGINE, TableHost())
    return route_checks.service(classify("POST", uri), "POST", uri, body, facts, marked)


# ------------------------------------------------------------------ allowed


def test_a_pinned_service_whose_gpus_come_from_a_reservation_is_allowed() -> None:
    assert judge(spec()) is None


def test_a_pinned_service_without_gpus_is_allowed() -> None:
    assert judge(spec(gpus=0, env=("A=1", *PINS, "CUDA_VISIBLE_DEVICES=0"))) is None


def test_driver_capabilities_and_requirements_only_shape_granted_gpus_and_are_allowed() -> None:
    env = ("NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_REQUIRE_CUDA=cuda>=12", *PINS)
    assert judge(spec(env=env)) is None


def test_a_plain_tmpfs_and_a_data_bind_are_allowed() -> None:
    mounts = [{"Type": "tmpfs", "Target": "/scratch"},
              {"Type": "bind", "Source": "/srv/data", "Target": "/data"}]  # fmt: skip
    assert judge(spec(mounts=mounts)) is None


# ------------------------------------------------------------------ the void pin


def test_a_service_without_the_pin_is_refused_with_the_fix() -> None:
    why = judge(spec(env=("A=1",)))
    assert why is not None
    assert f"does not set {PIN}" in why and "--env " + PIN in why
    assert "gpu-alloc socket" in why and "--generic-resource gpu=N" in why


def test_a_service_without_the_swarm_variable_pinned_is_refused_with_the_fix() -> None:
    """An image's ENV DOCKER_RESOURCE_GPU=... would otherwise select GPUs in the toolkit,
    which reads the swarm variable before NVIDIA_VISIBLE_DEVICES."""
    why = judge(spec(env=(PIN,)))
    assert why is not None
    assert f"does not set {RESOURCE_PIN}" in why and "--env " + RESOURCE_PIN in why


def test_the_swarm_variable_pinned_twice_or_to_gpus_is_refused() -> None:
    assert judge(spec(env=(*PINS, RESOURCE_PIN))) is not None
    why = judge(spec(env=(PIN, "DOCKER_RESOURCE_GPU=GPU-00000001-0000-0000-0000-000000000000")))
    assert why is not None and "DOCKER_RESOURCE_GPU" in why


def test_the_pin_follows_the_configured_kind() -> None:
    assert services.refusal(spec(), "fpga", ENGINE, INVENTORY, TableHost()) is not None
    fpga = spec(env=(PIN, "DOCKER_RESOURCE_FPGA=void"))
    assert services.refusal(fpga, "fpga", ENGINE, INVENTORY, TableHost()) is None


@pytest.mark.parametrize("value", ["all", "0", "GPU-00000001-0000-0000-0000-000000000000"])
def test_a_service_that_names_gpus_in_nvidia_visible_devices_is_refused(value: str) -> None:
    why = judge(spec(env=(f"NVIDIA_VISIBLE_DEVICES={value}",)))
    assert why is not None and f"NVIDIA_VISIBLE_DEVICES={value}" in why


def test_a_later_entry_overriding_the_pin_is_refused() -> None:
    why = judge(spec(env=(*PINS, "NVIDIA_VISIBLE_DEVICES=all")))
    assert why is not None and "2 times" in why


# ------------------------------------------------------------------ variables of its own


def test_a_service_setting_the_swarm_variable_itself_is_refused() -> None:
    why = judge(spec(env=("DOCKER_RESOURCE_GPU=GPU-00000001-0000-0000-0000-000000000000", *PINS)))
    assert why is not None and "DOCKER_RESOURCE_GPU" in why and "reserve GPUs instead" in why


@pytest.mark.parametrize("name", sorted(services.DEVICE_VARIABLES))
def test_toolkit_variables_that_add_devices_are_refused(name: str) -> None:
    why = judge(spec(env=(f"{name}=all", *PINS)))
    assert why is not None and name in why


# ------------------------------------------------------------------ capabilities, plugins


@pytest.mark.parametrize(
    ("cap", "named"),
    [
        ("SYS_ADMIN", "SYS_ADMIN"),
        ("CAP_SYS_RAWIO", "SYS_RAWIO"),
        ("ALL", "ALL"),
        ("sys_time", "SYS_TIME"),
    ],
)
def test_capabilities_outside_the_allow_list_are_refused_with_their_grant(
    cap: str, named: str
) -> None:
    why = judge(spec(CapabilityAdd=["NET_ADMIN", cap]))
    assert why is not None and why.startswith(f"{services.SPEC}.CapabilityAdd: --cap-add {named} ")
    assert f"policy.powers: {{{named}:" in why


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"Privileges": {"Seccomp": {"Mode": "unconfined"}}}, "Privileges: --security-opt seccomp"),
        ({"Sysctls": {"kernel.core_pattern": "|/x"}}, "Sysctls[kernel.core_pattern]"),
        ({"OomScoreAdj": -1000}, "OomScoreAdj: --oom-score-adj -1000"),
    ],
)
def test_other_powers_of_a_task_are_refused_by_the_same_allow_list(fields, said) -> None:
    why = judge(spec(**fields))
    assert why is not None and why.startswith(f"{services.SPEC}.{said}"), why


def test_harmless_capabilities_are_allowed() -> None:
    assert judge(spec(CapabilityAdd=["NET_ADMIN", "SYS_PTRACE"])) is None


def test_a_plugin_task_is_refused() -> None:
    body = {"Name": "p", "TaskTemplate": {"Runtime": "plugin", "PluginSpec": {"Remote": "x"}}}
    why = judge(body)
    assert why is not None and "docker plugin install" in why


def test_a_container_spec_key_no_engine_we_know_has_is_refused() -> None:
    why = judge(spec(Devices=[{"PathOnHost": "/dev/nvidia0"}]))
    assert why is not None and "ContainerSpec.Devices" in why


def test_a_gpu_alloc_label_on_the_tasks_is_refused() -> None:
    why = judge(spec(Labels={"io.gpu-alloc.lease": "x"}))
    assert why is not None and "io.gpu-alloc.lease" in why


# ------------------------------------------------------------------ mounts, by the catalogue


def test_a_bind_of_the_device_directory_is_refused_by_the_create_catalogue() -> None:
    why = judge(spec(mounts=[{"Type": "bind", "Source": "/dev", "Target": "/dev"}]))
    assert why is not None and "TaskTemplate.ContainerSpec.Mounts[0]" in why


def test_a_bind_of_a_gpu_device_node_is_refused() -> None:
    host = TableHost(protected=(), nodes={"/srv/gpu0": Node("chr", 195, 0)})
    why = judge(spec(mounts=[{"Type": "bind", "Source": "/srv/gpu0", "Target": "/x"}]), host)
    assert why is not None and "Mounts[0]" in why


def test_a_bind_of_the_engine_state_is_refused() -> None:
    mount = {"Type": "bind", "Source": "/var/lib/docker/../docker", "Target": "/d"}
    why = judge(spec(mounts=[mount]))
    assert why is not None and "/var/lib/docker" in why


def test_a_local_volume_over_the_device_directory_is_refused() -> None:
    opts = {"type": "none", "o": "bind", "device": "/dev"}
    mount = {"Type": "volume", "Target": "/v",
             "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": opts}}}  # fmt: skip
    why = judge(spec(mounts=[mount]))
    assert why is not None and "Mounts[0]" in why


# ------------------------------------------------------------------ the shim's pin


def test_pin_adds_void_to_a_spec_that_sets_none() -> None:
    pinned = services.pin(spec(env=("A=1",)))
    assert services.container_spec(pinned)["Env"] == ["A=1", *PINS]
    assert judge(pinned) is None
    fpga = services.pin(spec(env=()), "fpga")
    assert services.container_spec(fpga)["Env"] == [PIN, "DOCKER_RESOURCE_FPGA=void"]


def test_pin_keeps_a_value_of_the_specs_own_to_be_refused() -> None:
    pinned = services.pin(spec(env=("NVIDIA_VISIBLE_DEVICES=all",)))
    assert services.container_spec(pinned)["Env"] == ["NVIDIA_VISIBLE_DEVICES=all", RESOURCE_PIN]
    assert judge(pinned) is not None


def test_pin_leaves_a_pinned_spec_as_it_is_and_strips_gpu_alloc_labels() -> None:
    body = spec(env=("A=1", *PINS), Labels={"io.gpu-alloc.lease": "x", "team": "ml"})
    pinned = services.pin(body)
    assert services.container_spec(pinned)["Env"] == ["A=1", *PINS]
    assert services.container_spec(pinned)["Labels"] == {"team": "ml"}


def test_pin_does_not_hide_a_refusal() -> None:
    pinned = services.pin(spec(env=("DOCKER_RESOURCE_GPU=GPU-x",), CapabilityAdd=["ALL"]))
    assert judge(pinned) is not None


# ------------------------------------------------------------------ the route


def test_services_create_and_update_are_judged_on_their_body() -> None:
    good = json.dumps(spec()).encode()
    assert verdict("/v1.41/services/create", good) == decisions.ALLOW
    assert verdict("/v1.41/services/abc/update?version=5", good) == decisions.ALLOW
    bad = verdict("/v1.41/services/create", json.dumps(spec(env=())).encode())
    assert isinstance(bad, Deny) and bad.msg.startswith("gpu-alloc refused the swarm service: ")


def test_a_service_body_dockerd_reads_differently_is_refused() -> None:
    body = b'{"TaskTemplate":{"ContainerSpec":{"env":["NVIDIA_VISIBLE_DEVICES=all"]}}}'
    found = verdict("/services/create", body)
    assert isinstance(found, Deny) and "swarm service" in found.msg


def test_a_service_call_without_its_body_is_refused() -> None:
    found = verdict("/services/create", None)
    assert isinstance(found, Deny) and "no request body" in found.msg


def test_decode_reads_the_spec_as_dockerd_does() -> None:
    with pytest.raises(gojson.BodyError):
        services.decode(b'{"TaskTemplate":{},"taskTemplate":{}}')
    assert services.decode(json.dumps(spec()).encode())["Name"] == "train"


def test_what_the_shim_cannot_fix_is_named_before_the_missing_pin() -> None:
    why = judge(spec(env=(), CapabilityAdd=["SYS_ADMIN"]))
    assert why is not None and "SYS_ADMIN" in why and "does not set" not in why
    why = judge(spec(env=(), mounts=[{"Type": "bind", "Source": "/dev", "Target": "/dev"}]))
    assert why is not None and "Mounts[0]" in why


# ------------------------------------------------------------------ secrets and configs


@pytest.mark.parametrize(
    "key, name",
    [
        ("Secrets", "/var/run/nvidia-container-devices/all"),
        ("Configs", "/var/run/nvidia-container-devices/GPU-00000001-0000-0000-0000-000000000000"),
        ("Configs", "var/run/nvidia-container-devices/all"),  # configs go under /
        ("Secrets", "../../var/run/nvidia-container-devices/0"),  # out of /run/secrets
    ],
)
def test_a_secret_or_config_mounted_in_the_toolkits_device_list_is_refused(key, name) -> None:
    """dockerd bind-mounts each at its File.Name, and the toolkit (with
    accept-nvidia-visible-devices-as-volume-mounts) reads that directory as GPUs to give."""
    ref = {"File": {"Name": name, "UID": "0", "GID": "0", "Mode": 292}, "SecretID": "x"}
    if key == "Configs":
        ref = {"File": ref["File"], "ConfigID": "x", "ConfigName": "c"}
    why = judge(spec(**{key: [ref]}))
    assert why is not None and f"{key}[0]" in why and "nvidia-container-devices" in why


def test_secrets_and_configs_elsewhere_are_allowed() -> None:
    secret = {"File": {"Name": "token", "UID": "0", "GID": "0", "Mode": 292}, "SecretID": "s"}
    config = {"File": {"Name": "/etc/app.conf"}, "ConfigID": "c", "ConfigName": "app"}
    assert judge(spec(Secrets=[secret], Configs=[config])) is None


def test_a_secret_target_spelled_as_dockerd_would_read_it_differently_is_refused() -> None:
    body = json.dumps(
        spec(Secrets=[{"file": {"Name": "/var/run/nvidia-container-devices/all"}}])
    ).encode()
    found = verdict("/services/create", body)
    assert isinstance(found, Deny) and "swarm service" in found.msg
