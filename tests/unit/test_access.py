"""The access core on its own: no dockerd, no root, host facts from tables.

Each test pins how the Engine (or the toolkit it runs) reads a field, so the
core judges the value dockerd acts on rather than the spelling it was sent.
"""

from __future__ import annotations

import json

import pytest

from allocator.core.access import access
from allocator.core.access.facts import EngineView
from allocator.core.access.grants import Refusal
from allocator.core.machine.inventory import GPU, Inventory
from allocator.host.filesystem import Host, engine_paths
from tests.support.table_host import TableHost

INVENTORY = Inventory(tuple(GPU(f"GPU-{i:08x}-0000-0000-0000-000000000000", i, minor=i)
                            for i in range(4)))  # fmt: skip
OLD = EngineView(version=(20, 10, 24))
TRIXIE = EngineView(version=(26, 1, 5))
SID = EngineView(version=(28, 5, 2))


def create(env=None, count=0, ids=None, driver="", **hc) -> dict:
    req = {"Driver": driver, "Count": count, "DeviceIDs": ids, "Capabilities": [["gpu"]]}
    return {"Env": env, "HostConfig": {"DeviceRequests": [req], **hc}}


def inspect(env, count=0) -> dict:
    req = {"Driver": "", "Count": count, "DeviceIDs": None, "Capabilities": [["gpu"]]}
    return {"Config": {"Env": env}, "HostConfig": {"DeviceRequests": [req]}, "Mounts": []}


# ------------------------------------------------------------- cgroup rules


@pytest.mark.parametrize("rule", ["c 0195:* rwm", "c 000195:0 r", "a *:* m", "c *:* rwm",
                                  "c 0226:128 rw"])  # fmt: skip
def test_gpu_cgroup_rules_are_grants_however_the_number_is_spelled(rule):
    got = access.of_create({"HostConfig": {"DeviceCgroupRules": [rule]}}, OLD, INVENTORY,
                           TableHost())  # fmt: skip
    assert not got.none and not got.grants[0].leasable


# --------------------------------------------------------- Count 0 requests


@pytest.mark.parametrize("engine", [OLD, TRIXIE, EngineView()], ids=["20.10", "26.1", "unknown"])
def test_count_zero_on_an_engine_that_sets_no_env_is_decided_by_the_env(engine):
    unknown_image = access.of_create(create(), engine, INVENTORY, TableHost())
    (grant,) = unknown_image.grants
    assert grant.gpus is None and grant.guarded and not grant.leasable
    assert "image's ENV" in grant.detail
    pinned_off = access.of_create(create(["NVIDIA_VISIBLE_DEVICES=void"]), engine, INVENTORY,
                                  TableHost())  # fmt: skip
    assert pinned_off.none
    one = access.of_create(create(["NVIDIA_VISIBLE_DEVICES=2"]), engine, INVENTORY, TableHost())
    assert one.grants[0].gpus == {INVENTORY.gpus[2].uuid}


def test_count_zero_on_28_is_void_whatever_the_env_says():
    got = access.of_create(create(["NVIDIA_VISIBLE_DEVICES=all"]), SID, INVENTORY, TableHost())
    assert got.none


@pytest.mark.parametrize(
    ("env", "held"),
    [
        (["CUDA_VERSION=12.2"], "all"),  # the legacy CUDA rule
        (["CUDA_VERSION=12.2", "NVIDIA_REQUIRE_CUDA=cuda>=12"], "none"),
        (["CUDA_VERSION=12.2", "NVIDIA_REQUIRE_CUDA="], "all"),  # empty counts as unset
        (["NVIDIA_REQUIRE_CUDA=cuda>=12", "CUDA_VERSION=12.2", "NVIDIA_REQUIRE_CUDA="], "all"),
        (["CUDA_VERSION="], "none"),  # the toolkit wants a non-empty CUDA_VERSION
        (["NVIDIA_VISIBLE_DEVICES=all"], "all"),
        (["NVIDIA_VISIBLE_DEVICES=1,3"], "1,3"),
        (["NVIDIA_VISIBLE_DEVICES=none"], "none"),
        (["NVIDIA_VISIBLE_DEVICES="], "none"),
        ([], "none"),
    ],
)
def test_a_running_count_zero_container_holds_what_its_env_gives_the_hook(env, held):
    got = access.of_container(inspect(env), OLD, INVENTORY, TableHost())
    if held == "none":
        assert got.none
    elif held == "all":
        assert got.gpus(INVENTORY) == INVENTORY.uuids and not got.pinned
    else:
        assert got.gpus(INVENTORY) == {INVENTORY.gpus[int(i)].uuid for i in held.split(",")}
    assert access.of_container(inspect(env), SID, INVENTORY, TableHost()).none


def test_a_swarm_resource_name_without_a_value_is_no_variable_to_the_toolkit():
    """A bare name (found by the property test of mutated bodies) selects nothing: the
    toolkit's spec builder refuses an entry without ``=`` (builder.go ``WithEnv``), so such
    a container does not start, and no GPU is reached either way."""
    pinned = ["NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU"]
    assert access.of_create(create(pinned), OLD, INVENTORY, TableHost()).none
    task = inspect(["DOCKER_RESOURCE_GPU", f"DOCKER_RESOURCE_GPU={INVENTORY.gpus[1].uuid}"])
    assert access.of_container(task, OLD, INVENTORY, TableHost()).gpus(INVENTORY) == {
        INVENTORY.gpus[1].uuid
    }


def test_a_swarm_variable_at_a_create_is_void_or_the_gpus_its_visible_devices_name():
    """What the shim writes on a leased create: a leasable ask of those GPUs, so only a
    lease of them covers it; any other value is refused."""
    gpu = INVENTORY.gpus[2].uuid
    leased = create([f"NVIDIA_VISIBLE_DEVICES={gpu}", "DOCKER_RESOURCE_GPU=2"], ids=[gpu])
    grants = access.of_create(leased, OLD, INVENTORY, TableHost()).grants
    assert [(g.gpus, g.leasable) for g in grants] == [({gpu}, True), ({gpu}, True)]
    for env in (["DOCKER_RESOURCE_GPU=2"], ["NVIDIA_VISIBLE_DEVICES=1", "DOCKER_RESOURCE_GPU=2"],
                ["NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_GPU=all"]):  # fmt: skip
        with pytest.raises(Refusal, match="DOCKER_RESOURCE_GPU can select GPUs"):
            access.of_create(create(env, count=1), OLD, INVENTORY, TableHost())


def test_device_ids_all_is_leased_like_count_minus_one():
    (grant,) = access.of_create(create(ids=["all"]), OLD, INVENTORY, TableHost()).grants
    assert grant.demand == access.Demand(all=True, caps=("gpu",))


# ---------------------------------------------------------------- mounts


def test_a_named_volume_is_judged_by_the_options_the_engine_has_for_it():
    def volume_of(name):
        return {"devs": ("local", {"type": "none", "o": "rbind", "device": "/dev"})}.get(name)

    spec = {"HostConfig": {"Binds": ["devs:/d"], "Mounts": [
        {"Type": "volume", "Source": "devs", "Target": "/e"}]}}  # fmt: skip
    got = access.of_create(spec, OLD, INVENTORY, TableHost(), volume_of=volume_of)
    assert [g.field for g in got.refused()] == [
        "HostConfig.Binds[0] (volume devs)",
        "HostConfig.Mounts[0] (volume devs)",
    ]
    assert "exposes /dev" in got.grants[0].detail
    fresh = {"HostConfig": {"Binds": ["new:/d"]}}
    assert access.of_create(fresh, OLD, INVENTORY, TableHost(), volume_of=volume_of).none
    got = access.of_container({"HostConfig": spec["HostConfig"]}, OLD, INVENTORY, TableHost(),
                              volume_of)  # fmt: skip
    assert not got.none and got.gpus(INVENTORY) == INVENTORY.uuids


# ------------------------------------------------------- the Engine's own paths


def test_the_engines_paths_come_from_info_daemon_json_and_its_command_line(tmp_path):
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    sock = str(tmp_path / "docker.sock")
    (proc / "net/unix").write_text(
        "Num RefCount Protocol Flags Type St Inode Path\n"
        f"0000: 00000002 00000000 00010000 0001 01 4242 {sock}\n"
    )
    (proc / "77/fd").mkdir(parents=True)
    (proc / "77/fd/3").symlink_to("socket:[4242]")
    conf = tmp_path / "custom.json"
    conf.write_text(json.dumps({"exec-root": "/srv/exec"}))
    argv = ["dockerd", "--data-root=/srv/data", "--containerd", "/srv/ctd/c.sock",
            f"--config-file={conf}"]  # fmt: skip
    (proc / "77/cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    paths = engine_paths({"DockerRootDir": "/srv/root"}, "/nonexistent", sock, str(proc))
    assert {"/srv/root", "/srv/data", "/srv/exec", "/srv/ctd"} <= set(paths)
    # A container given the Engine's socket calls it where the plugin cannot tell who asks.
    assert {sock, "/var/run/docker.sock"} <= set(paths)


@pytest.mark.parametrize(
    ("argv", "hosts", "sockets"),
    [
        (["-H", "unix:///srv/a.sock", "-H=tcp://0.0.0.0:2375"], [], {"/srv/a.sock"}),
        (["--host=unix:///srv/b.sock", "-Hunix:///srv/c.sock"], [], {"/srv/b.sock", "/srv/c.sock"}),
        (["-H", "fd://"], [], {"/var/run/docker.sock"}),
        ([], ["unix:///srv/d.sock", "unix://"], {"/srv/d.sock", "/var/run/docker.sock"}),
        (["-H", "tcp://127.0.0.1:2375"], [], {"/var/run/docker.sock"}),
    ],
)
def test_every_api_socket_dockerd_serves_is_protected(tmp_path, argv, hosts, sockets):
    proc = tmp_path / "proc"
    sock = "/srv/config.sock"
    (proc / "net").mkdir(parents=True)
    (proc / "net/unix").write_text(
        "Num RefCount Protocol Flags Type St Inode Path\n"
        f"0000: 00000002 00000000 00010000 0001 01 4242 {sock}\n"
    )
    (proc / "77/fd").mkdir(parents=True)
    (proc / "77/fd/3").symlink_to("socket:[4242]")
    conf = tmp_path / "daemon.json"
    conf.write_text(json.dumps({"hosts": hosts}))
    (proc / "77/cmdline").write_bytes(b"\0".join(a.encode() for a in ["dockerd", *argv]) + b"\0")
    paths = set(engine_paths({}, str(conf), sock, str(proc)))
    assert sockets | {sock} <= paths


def test_a_container_whose_link_alias_makes_a_variable_holds_every_gpu_at_start():
    made = inspect(["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES"])
    made["HostConfig"]["Links"] = ["/child:/par3/NVIDIA_VISIBLE_DEVICES=all,a"]  # as inspected
    got = access.of_container(made, OLD, INVENTORY, TableHost())
    (grant,) = [g for g in got.grants if g.field == "HostConfig.Links[0]"]
    assert grant.gpus is None  # unpinned: every GPU, so only a lease for all would do
    assert "alias 'NVIDIA_VISIBLE_DEVICES=all,a'" in grant.detail
    assert "(NVIDIA_VISIBLE_DEVICES)" in grant.detail
    made["HostConfig"]["Links"] = ["/child:/par3/db"]
    assert not any(g.field.startswith("HostConfig.Links") for g in access.of_container(
        made, OLD, INVENTORY, TableHost()).grants)  # fmt: skip


def test_a_dynamic_major_loaded_after_gpu_alloc_started_counts_at_once(tmp_path):
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n")
    host = Host(proc_devices=str(devices))
    assert host.dynamic_majors() == {195}
    devices.write_text(devices.read_text() + "236 nvidia-caps\n510 nvidia-uvm\n")  # modprobe
    assert host.dynamic_majors() == {195, 236, 510}


def test_count_and_device_ids_together_says_how_to_quote_a_device_list():
    # `--gpus device=1,2` unquoted: the CLI splits on the comma and reads "2" as a count.
    with pytest.raises(Refusal) as refused:
        access.of_create(create(count=2, ids=["1"]), OLD, INVENTORY, TableHost())
    assert "sets both Count and DeviceIDs" in str(refused.value)
    assert "quote the list, --gpus '\"device=1,2\"'" in str(refused.value)


# ------------------------------------------- CDI names on the nvidia driver (Engine 29)

NEW = EngineView(version=(29, 7, 2))
UUIDS = [g.uuid for g in INVENTORY.gpus]


@pytest.mark.parametrize(
    ("ids", "held", "leasable"),
    [
        (["nvidia.com/gpu=all"], None, True),  # 29 passes it on as is: every GPU
        (["nvidia.com/gpu=0"], {UUIDS[0]}, True),
        (["nvidia.com/gpu=" + UUIDS[2]], {UUIDS[2]}, True),
        (["1", "nvidia.com/gpu=3"], {UUIDS[1], UUIDS[3]}, True),
        (["nvidia.com/gpu=all", "0"], None, True),
    ],
)
@pytest.mark.parametrize("engine", [TRIXIE, SID, NEW], ids=["26", "28", "29"])
def test_cdi_ids_on_the_nvidia_driver_are_the_gpus_they_name(engine, ids, held, leasable):
    got = access.of_container(
        {"Config": {"Env": []}, "Mounts": [], **create(ids=ids, driver="nvidia")},
        engine, INVENTORY, TableHost(),
    )  # fmt: skip
    (grant,) = got.grants
    assert grant.gpus == held and grant.leasable == leasable


def test_a_create_naming_a_gpu_by_its_cdi_name_leases_that_gpu():
    got = access.of_create(create(ids=["nvidia.com/gpu=2"], driver="nvidia"), NEW, INVENTORY,
                           TableHost())  # fmt: skip
    (grant,) = got.grants
    assert grant.gpus == {UUIDS[2]} and grant.demand is not None


def test_another_cdi_kind_on_the_nvidia_driver_is_a_device_of_its_own():
    with pytest.raises(Refusal, match=r"CDI device 'vendor\.com/fpga=0' is not one gpu-alloc"):
        access.of_create(create(ids=["vendor.com/fpga=0"], driver="nvidia"), NEW, INVENTORY,
                         TableHost())  # fmt: skip
    mixed = access.of_container(
        {"Config": {"Env": []}, "Mounts": [],
         **create(ids=["0", "other.nvidia.com/gpu=all"], driver="nvidia")},
        NEW, INVENTORY, TableHost(),
    )  # fmt: skip
    assert [(g.gpus, g.leasable) for g in mixed.grants] == [(None, False), ({UUIDS[0]}, True)]


@pytest.mark.parametrize("engine", [TRIXIE, SID, NEW], ids=["26", "28", "29"])
def test_a_cdi_driver_request_holds_the_gpus_it_names_and_is_not_leased(engine):
    got = access.of_container(
        {"Config": {"Env": []}, "Mounts": [],
         **create(ids=["nvidia.com/gpu=1", "nvidia.com/gpu=all"], driver="cdi")},
        engine, INVENTORY, TableHost(),
    )  # fmt: skip
    assert [(g.gpus, g.leasable) for g in got.grants] == [({UUIDS[1]}, False), (None, False)]


@pytest.mark.parametrize("engine", [SID, NEW], ids=["28", "29"])
def test_the_nvidia_driver_named_without_capabilities_is_a_gpu_request(engine):
    """29 selects the nvidia driver by its name alone (28 fails the start): GPUs either way."""
    body = {"HostConfig": {"DeviceRequests": [{"Driver": "nvidia", "Count": 1}]}}
    (grant,) = access.of_create(body, engine, INVENTORY, TableHost()).grants
    assert grant.demand is not None and grant.demand.count == 1
