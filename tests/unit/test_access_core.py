"""The access core on its own: no dockerd, no root, host facts from tables.

Each test pins how the Engine (or the toolkit it runs) reads a field, so the
core judges the value dockerd acts on rather than the spelling it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.core import access, gonum, mounts
from allocator.core.facts import EngineView, Node
from allocator.core.grants import Refusal
from allocator.core.inventory import GPU, Inventory
from allocator.core.mounts import Mount
from allocator.host.filesystem import Host, engine_paths

INVENTORY = Inventory(tuple(GPU(f"GPU-{i:08x}-0000-0000-0000-000000000000", i, minor=i)
                            for i in range(4)))  # fmt: skip
OLD = EngineView(version=(20, 10, 24))
TRIXIE = EngineView(version=(26, 1, 5))
SID = EngineView(version=(28, 5, 2))
V1_CGROUPS = (Mount("/", "ext4"), Mount("/dev", "devtmpfs"), Mount("/dev/shm", "tmpfs"),
              Mount("/sys", "sysfs"), Mount("/sys/fs/cgroup", "tmpfs"),
              Mount("/sys/fs/cgroup/devices", "cgroup"), Mount("/proc", "proc"))  # fmt: skip


@dataclass
class TableHost:
    """Host facts from a table: paths resolve to themselves, nothing is a device."""

    table: tuple[Mount, ...] = V1_CGROUPS
    protected: tuple[str, ...] = ("/dev", "/sys", "/proc", "/var/lib/docker", "/run/docker")
    nodes: dict[str, Node] = field(default_factory=dict)

    def resolve(self, path: str) -> str:
        return path

    def node(self, path: str) -> Node | None:
        return self.nodes.get(path)

    def walk(self, top: str) -> Iterable[str]:
        return ()

    def drm_bus_id(self, minor: int) -> str | None:
        return None

    def dynamic_majors(self) -> frozenset[int]:
        return frozenset()

    def mounts(self) -> Iterable[Mount]:
        return self.table


def create(env=None, count=0, ids=None, driver="", **hc) -> dict:
    req = {"Driver": driver, "Count": count, "DeviceIDs": ids, "Capabilities": [["gpu"]]}
    return {"Env": env, "HostConfig": {"DeviceRequests": [req], **hc}}


def inspect(env, count=0) -> dict:
    req = {"Driver": "", "Count": count, "DeviceIDs": None, "Capabilities": [["gpu"]]}
    return {"Config": {"Env": env}, "HostConfig": {"DeviceRequests": [req]}, "Mounts": []}


# ------------------------------------------------------------------ Go numbers


@given(st.integers(-(2**63), 2**63 - 1), st.integers(0, 5), st.sampled_from(["", "+"]))
def test_parse_int_reads_every_spelling_of_an_int64_as_go_does(value, zeros, plus):
    sign = "-" if value < 0 else plus
    assert gonum.parse_int(f"{sign}{'0' * zeros}{abs(value)}") == value


@given(st.integers(2**63, 2**70))
def test_parse_int_refuses_what_overflows_int64(value):
    with pytest.raises(gonum.NumError):
        gonum.parse_int(str(value))
    with pytest.raises(gonum.NumError):
        gonum.parse_int(f"-{value + 1}")


@pytest.mark.parametrize("text", ["", "+", "-", " 195", "195 ", "1_95", "١٩٥", "0x1f", "19.5"])
def test_parse_int_refuses_what_python_int_would_take_or_go_refuses(text):
    with pytest.raises(gonum.NumError):
        gonum.parse_int(text)


@given(st.integers(0, 2**64 - 1), st.integers(0, 3))
def test_parse_uint_takes_the_whole_uint64_range(value, zeros):
    assert gonum.parse_uint("0" * zeros + str(value)) == value
    assert gonum.parse_uint(format(value, "x"), 16) == value


@given(st.integers(0, 2**40), st.integers(0, 4), st.integers(0, 300), st.integers(0, 4))
def test_a_cgroup_rule_is_read_by_value(major, zeros, minor, mzeros):
    rule = f"c {'0' * zeros}{major}:{'0' * mzeros}{minor} rwm"
    assert gonum.cgroup_rule(rule) == ("c", major, minor, "rwm")


@pytest.mark.parametrize(
    "rule",
    ["c 195:* rwm\n", "c 195:* rwm ", "c  195:* rwm", "c -1:* rwm", "c +195:* rwm",
     "c 195:* rwmx", "c 195 rwm", "C 195:* rwm", "c 9223372036854775808:* rwm", "c ١٩٥:* rwm"],
)  # fmt: skip
def test_cgroup_rules_dockerd_refuses_are_refused(rule):
    with pytest.raises(gonum.NumError):
        gonum.cgroup_rule(rule)


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


def test_device_ids_all_is_leased_like_count_minus_one():
    (grant,) = access.of_create(create(ids=["all"]), OLD, INVENTORY, TableHost()).grants
    assert grant.demand == access.Demand(all=True, caps=("gpu",))


@pytest.mark.parametrize(
    ("text", "version"),
    [("20.10.24+dfsg1", (20, 10, 24)), ("28.5.2", (28, 5, 2)), ("27.3.0-rc.1", (27, 3, 0)),
     ("dev", None), ("", None), ("1.2", None)],
)  # fmt: skip
def test_the_engine_version_is_read_from_what_the_engine_says(text, version):
    assert EngineView.from_info({}, {"Version": text}).version == version


# ---------------------------------------------------------------- mounts


@pytest.mark.parametrize(
    ("path", "read_only", "exposes"),
    [
        ("/dev/shm", False, None),
        ("/dev/shm/sub", False, None),
        ("/sys/fs/cgroup", True, None),
        ("/sys/fs/cgroup", False, "/sys"),
        ("/sys/fs/cgroup/devices", False, "/sys"),
        ("/dev", False, "/dev"),
        ("/dev/pts", False, "/dev"),  # part of devtmpfs in this table
        ("/", True, "/dev"),
        ("/var", False, "/var/lib/docker"),
        ("/srv", False, None),
    ],
)
def test_a_bind_is_judged_by_the_filesystems_it_reaches(path, read_only, exposes):
    assert mounts.exposure(TableHost(), path, read_only) == exposes


def test_a_kernel_filesystem_mounted_below_a_bind_source_is_reached_by_it():
    host = TableHost(table=(*V1_CGROUPS, Mount("/srv/chroot/dev", "devtmpfs"),
                            Mount("/mnt/proc", "proc")))  # fmt: skip
    assert "devtmpfs" in (mounts.exposure(host, "/srv") or "")
    assert "proc" in (mounts.exposure(host, "/mnt/proc/1") or "")
    assert mounts.exposure(host, "/srv/data") is None


def test_dev_as_a_plain_directory_of_the_root_filesystem_stays_protected():
    host = TableHost(table=(Mount("/", "overlay"), Mount("/dev/shm", "tmpfs")))
    assert mounts.exposure(host, "/dev/shm") is None
    assert mounts.exposure(host, "/dev/null") == "/dev"


@pytest.mark.parametrize(
    ("options", "source", "refused"),
    [
        ({}, "", ""),
        ({"size": "1g"}, "", ""),
        ({"type": "tmpfs", "device": "tmpfs", "o": "size=10m,uid=1000"}, "", ""),
        ({"type": "nfs", "device": ":/export", "o": "addr=10.0.0.1,nolock,soft"}, "", ""),
        ({"type": "none", "device": "/srv/x", "o": "bind"}, "/srv/x", ""),
        ({"type": "proc", "device": "/srv/x", "o": "rbind,ro"}, "/srv/x", ""),  # bind wins
        ({"type": "none", "device": "srv/x", "o": "bind"}, "", "relative"),
        ({"type": "proc", "device": "proc"}, "", "proc"),
        ({"type": "sysfs", "device": "sysfs"}, "", "sysfs"),
        ({"type": "devtmpfs", "device": "udev"}, "", "devtmpfs"),
        ({"type": "ext4", "device": "/dev/sda1"}, "", "ext4"),
        ({"type": "overlay", "device": "overlay", "o": "lowerdir=/dev"}, "", "overlay"),
        ({"type": "none", "device": "/srv", "o": "Bind"}, "", "none"),  # Go's table is exact
        ({"type": "tmpfs", "device": "x", "o": "remount"}, "", "remount"),
        ({"type": "tmpfs", "device": "x", "mode": "1777"}, "", "mode"),
    ],
)
def test_local_volume_options_are_judged_by_the_mount_they_make(options, source, refused):
    made = mounts.local_volume(options)
    assert made.source == source
    assert refused in made.refusal if refused else made.refusal == ""


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
    assert sock not in paths  # every call on the Engine's socket passes the plugin


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


def test_the_engine_view_names_the_authorization_plugins_dockerd_consults():
    info = {"DefaultRuntime": "runc", "Plugins": {"Authorization": ["gpu-alloc"]}}
    assert EngineView.from_info(info).authz_plugins == ("gpu-alloc",)
    assert EngineView.from_info({"Plugins": {"Authorization": None}}).authz_plugins == ()


def test_count_and_device_ids_together_says_how_to_quote_a_device_list():
    # `--gpus device=1,2` unquoted: the CLI splits on the comma and reads "2" as a count.
    with pytest.raises(Refusal) as refused:
        access.of_create(create(count=2, ids=["1"]), OLD, INVENTORY, TableHost())
    assert "sets both Count and DeviceIDs" in str(refused.value)
    assert "quote the list, --gpus '\"device=1,2\"'" in str(refused.value)


def test_a_bind_source_is_read_as_dockerd_cleans_it_before_any_link():
    # dockerd stores /x/link/../../state as /state (Go's path.Clean), then mounts that:
    # walking the link first would judge another directory than the one mounted.
    from allocator.core.access_mounts import cleaned

    assert cleaned("/srv/ga/lnk/../state") == "/srv/ga/state"
    assert cleaned("//srv//ga/./state/") == "/srv/ga/state"
    assert cleaned("/tmp/x/link/../../marker") == "/tmp/marker"
