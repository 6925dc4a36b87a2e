"""The allow-list of container powers (allocator/core/access/powers.py): what a container
may hold over the host without a grant, what is refused and how a grant lets it through."""

from __future__ import annotations

import json

import pytest

from allocator.core.access import powers, privileged
from allocator.core.access.facts import EngineView, Node
from allocator.core.judging import verdicts as decide
from allocator.core.machine.inventory import GPU, Inventory
from tests.support import engine

UUIDS = [engine.sim_gpu_uuid(k) for k in range(2)]
GPUS = Inventory(tuple(GPU(u, k) for k, u in enumerate(UUIDS)))


def refused(strict: bool = True, **host_config):
    return powers.refused(host_config, powers.Ask(strict=strict))


def granting(*names: str, apparmor: bool = False) -> powers.Ask:
    return powers.Ask(lambda p: p in names, lambda: apparmor)


@pytest.mark.parametrize(
    "host_config",
    [
        {},
        {"CapAdd": ["CHOWN", "NET_RAW", "SYS_NICE", "IPC_LOCK", "SYS_PTRACE", "NET_ADMIN"]},
        {"CapAdd": ["cap_sys_nice"]},  # dockerd's spelling rules
        {"CapDrop": ["ALL"]},  # dropping is always fine
        {"IpcMode": "host", "ShmSize": 1 << 30},  # NGC images
        {"IpcMode": "container:other", "PidMode": "container:other"},  # joined.py judges
        {"NetworkMode": "host"},
        {"Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}]},
        {"SecurityOpt": ["no-new-privileges", "no-new-privileges:true", "apparmor=mine"]},
        {"SecurityOpt": ["label=level:s0:c100,c200", "label:user:me"]},
        {"SecurityOpt": [f"seccomp={json.dumps({'defaultAction': 'SCMP_ACT_ERRNO'})}"]},
        {"Sysctls": {"net.ipv4.ip_local_port_range": "1024 65000", "kernel.shmmax": "1"}},
        {"CgroupnsMode": "private", "UTSMode": "", "UsernsMode": ""},
        {"MaskedPaths": sorted(powers.table.MASKED_PATHS | {"/proc/asound"})},
        {"OomScoreAdj": 500},
        {"Privileged": True, "PidMode": "host", "CapAdd": ["ALL"]},  # privileged's own row
        {"Capabilities": None, "SomeNewField": None},  # zero values read as none
    ],
)
def test_ordinary_containers_hold_only_allowed_powers(host_config):
    assert refused(**host_config) == []


@pytest.mark.parametrize(
    ("host_config", "power", "said"),
    [
        ({"CapAdd": ["SYS_TIME"]}, "SYS_TIME", "clock"),
        ({"CapAdd": "CAP_sys_admin"}, "SYS_ADMIN", "devices cgroup"),
        ({"CapAdd": ["ALL"]}, "ALL", "every capability"),
        ({"CapAdd": ["DAC_READ_SEARCH"]}, "DAC_READ_SEARCH", "open_by_handle_at"),
        ({"CapAdd": ["SYS_MODULE"]}, "SYS_MODULE", "kernel modules"),
        ({"CapAdd": ["NET_ADMIN"], "NetworkMode": "host"}, "NET_ADMIN", "host's network"),
        ({"PidMode": "host"}, "pid-host", "signals every host process"),
        ({"UsernsMode": "host"}, "userns-host", "host's root"),
        ({"CgroupnsMode": "host"}, "cgroupns-host", "cgroup tree"),
        ({"UTSMode": "host"}, "uts-host", "hostname"),
        ({"SecurityOpt": ["seccomp=unconfined"]}, "seccomp-unconfined", "seccomp"),
        ({"SecurityOpt": ["seccomp:unconfined"]}, "seccomp-unconfined", "seccomp"),
        ({"SecurityOpt": ["apparmor=unconfined"]}, "apparmor-unconfined", "AppArmor"),
        ({"SecurityOpt": ["label=disable"]}, "label-disable", "SELinux"),
        ({"SecurityOpt": ["disable"]}, "label-disable", "SELinux"),
        ({"SecurityOpt": ["label=type:spc_t"]}, "label-disable", "SELinux"),
        ({"SecurityOpt": ["systempaths=unconfined"]}, "systempaths-unconfined", "core_pattern"),
        ({"MaskedPaths": []}, "systempaths-unconfined", "core_pattern"),
        ({"ReadonlyPaths": ["/proc/bus"]}, "systempaths-unconfined", "/proc/sys"),
        ({"Sysctls": {"kernel.core_pattern": "|/x"}}, "sysctls", "kernel parameter"),
        ({"Sysctls": {"net.core.somaxconn": "1"}, "NetworkMode": "host"}, "sysctls", "kernel"),
        ({"Sysctls": {"kernel.shmmax": "1"}, "IpcMode": "host"}, "sysctls", "kernel"),
        ({"OomScoreAdj": -500}, "oom-score-adj", "OOM killer"),
    ],
)
def test_each_power_outside_the_list_is_refused_with_what_it_does_and_its_grant(
    host_config, power, said
):
    found = refused(**host_config)
    assert [f.power for f in found] == [power]
    assert said in found[0].why
    text = found[0].text()
    assert f"{powers.KEY}: {{{power}: {{users: [...], groups: [...]}}}}" in text


def test_a_namespace_is_named_by_the_flag_a_person_typed():
    (found,) = refused(PidMode="host")
    assert found.field == "HostConfig.PidMode" and found.value == "--pid host"
    assert found.text().startswith("--pid host sees and signals every host process")


def test_a_namespace_mode_dockerd_does_not_know_is_refused_and_never_granted():
    (found,) = refused(PidMode="private")
    assert found.value == "--pid private" and found.power == ""
    assert found.text() == "--pid private is no --pid mode dockerd knows; leave it out"


def test_tracing_is_allowed_only_in_the_containers_own_pid_namespace():
    found = powers.refused({"CapAdd": ["SYS_PTRACE"], "PidMode": "container:x"}, granting())
    assert [f.power for f in found] == ["SYS_PTRACE"] and "/proc/<pid>/root" in found[0].why


def test_api_1_40s_capabilities_read_as_added_and_as_a_field_no_engine_reads_now():
    found = refused(Capabilities=["SYS_MODULE"])
    assert [(f.field, f.power) for f in found] == [
        ("HostConfig.Capabilities", ""),
        ("HostConfig.CapAdd", "SYS_MODULE"),
    ]


def test_a_seccomp_profile_that_allows_every_call_is_unconfined_by_another_name():
    profile = json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []})
    assert [f.power for f in refused(SecurityOpt=[f"seccomp={profile}"])] == ["seccomp-unconfined"]


def test_what_no_policy_can_grant_is_named_and_left_out():
    found = refused(CapAdd=["NOT_A_CAP"], SecurityOpt=["mask=/x"], SomeNewField={"a": 1})
    assert [(f.field, f.power) for f in found] == [
        ("HostConfig.SomeNewField", ""),
        ("HostConfig.CapAdd", ""),
        ("HostConfig.SecurityOpt", ""),
    ]
    assert all(f.text().endswith("leave it out") for f in found)


def test_an_existing_container_is_judged_without_the_fields_and_defaults_dockerd_adds():
    inspected = {
        "CgroupnsMode": "host",  # dockerd's default on cgroup v1
        "SecurityOpt": ["label=disable"],  # dockerd's beside --ipc host
        "IpcMode": "host",
        "SomeNewField": "x",
    }
    assert refused(strict=False, **inspected) == []
    assert [f.power for f in refused(**inspected)] == ["", "label-disable", "cgroupns-host"]


def test_a_grant_lets_its_own_power_through_and_no_other():
    hc = {"CapAdd": ["SYS_TIME"], "PidMode": "host"}
    assert [f.power for f in powers.refused(hc, granting("SYS_TIME"))] == ["pid-host"]
    assert powers.refused(hc, granting("SYS_TIME", "pid-host")) == []


def test_sys_admin_even_granted_needs_apparmor_to_keep_its_mounts_from_the_host():
    hc = {"CapAdd": ["SYS_ADMIN"]}
    assert powers.refused(hc, granting("SYS_ADMIN", apparmor=True)) == []
    bare = powers.refused(hc, granting("SYS_ADMIN", apparmor=False))
    assert [f.power for f in bare] == [""] and "AppArmor" in bare[0].why
    unconfined = {**hc, "SecurityOpt": ["apparmor=unconfined"]}
    both = granting("SYS_ADMIN", "apparmor-unconfined", apparmor=True)
    assert [f.power for f in powers.refused(unconfined, both)] == [""]


def test_only_devices_that_are_no_gpu_and_not_listed_are_refused():
    nodes = {
        "/dev/sda": Node("other"),
        "/dev/mem": Node("chr", 1, 1),
        "/dev/nvidia0": Node("chr", 195, 0),
        "/dev/fuse": Node("chr", 10, 229),
        "/srv/devs/null": Node("chr", 1, 3),  # judged by its numbers, wherever it is
        "/dev/infiniband": Node("dir"),
        "/dev/infiniband/uverbs0": Node("chr", 231, 192),
        "/dev/infiniband/rdma_cm": Node("chr", 10, 58),  # misc: a minor of its own
    }
    hc = {
        "Devices": [{"PathOnHost": p} for p in list(nodes)[:6]],
        "DeviceCgroupRules": ["c 10:229 rwm", "c 195:* rwm", "b 8:* rwm", "c 1:1 rwm"],
    }
    walk = {"/dev/infiniband": ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"]}
    found = powers.devices_refused(hc, nodes.get, lambda p: walk.get(p, []), frozenset({195}))
    assert [(f.field, f.value, f.power) for f in found] == [
        ("HostConfig.DeviceCgroupRules[2]", "--device-cgroup-rule 'b 8:* rwm'", "devices"),
        ("HostConfig.DeviceCgroupRules[3]", "--device-cgroup-rule 'c 1:1 rwm'", "devices"),
        ("HostConfig.Devices[0]", "--device /dev/sda", "devices"),
        ("HostConfig.Devices[1]", "--device /dev/mem", "devices"),
    ]
    assert "block device" in found[2].why and "MKNOD" in found[0].why
    granted = powers.devices_refused(hc, nodes.get, lambda p: [], frozenset({195}), bool)
    assert granted == []


def test_a_create_with_a_power_is_refused_in_the_engines_words_on_both_sockets():
    facts = decide.Facts(GPUS, EngineView(), host=None)  # type: ignore[arg-type]
    body = {"Image": "x", "HostConfig": {"CapAdd": ["SYS_TIME"]}}
    denied = decide.shim_ask(body, facts)
    assert isinstance(denied, decide.Deny), denied
    assert denied.msg.startswith("gpu-alloc refused the container create: HostConfig.CapAdd:")
    assert "--cap-add SYS_TIME sets the host's clock" in denied.msg
    assert "policy.powers: {SYS_TIME:" in denied.msg
    grants = decide.access.of_create(body, EngineView(), GPUS, None)
    assert grants.refused() and not grants.pinned  # an existing one holds every GPU
    assert not privileged.asked(grants)  # refused under lease-all too
