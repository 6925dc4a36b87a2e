"""No way around a lease, on a real dockerd: each way in that once reached a GPU (or the
ledger that guards them) without a lease, tried on dockerd's own socket and the shim's.

- managed plugins whose mount sources climb out of their bundle (runc joins a relative
  source to it, and ``..`` stops at ``/``): install, upgrade, ``plugin set``;
- authorization plugins known by their capability, whatever its version;
- plugins whose privileges hold powers outside the allow-list (a container's are in
  test_powers_engine.py);
- binds of dockerd's own API socket;
- a paused container past its time limit.

Each refusal is checked with the Engine's own answer (nothing created, installed or set),
and each has its allowed neighbour beside it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.engine.test_plugin_chain_engine import call, docker, listed, plugin_config, rootfs
from tests.support import clients, engine, engine_root, host_users
from tests.support.faults import IMAGE, shim
from tests.support.plugin_registry import PluginRegistry

SOCKETS = ["engine_sock", "shim_sock"]
# A path no plugin needs: runc would create nothing there, and gpu-alloc judges the text.
CLIMB = "../../../../../../../../../../../../.."


# Owners the policy trusts with dockerd's socket: one by name, one by group; one not.
BINDER, GROUPED = engine_root.host_user("ga34b-alice"), engine_root.host_user("ga34b-carol")
OPS, NOT_NAMED = engine_root.host_user("ga34b-ops"), engine_root.host_user("ga34b-bob")


def make_stack() -> engine.Stack:
    binders = {"users": [BINDER], "groups": [OPS]}
    return engine.Stack(gpus=2, policy={"exempt": [], "time_limit": {"default": "1h"},
                                        "engine_socket_binds": binders})  # fmt: skip


def mounting(source: str) -> dict:
    """A volume plugin with one bind mount of ``source``, whose source is settable."""
    config = plugin_config(["docker.volumedriver/1.0"])
    config["Mounts"] = [{"Name": "st", "Description": "", "Source": source, "Destination": "/st",
                         "Type": "bind", "Options": ["rbind"], "Settable": ["source"]}]  # fmt: skip
    return config


def powered(capabilities: list[str], pid_host: bool = False) -> dict:
    """A volume plugin with extra capabilities, in the host's PID namespace or not."""
    config = plugin_config(["docker.volumedriver/1.0"])
    config["Linux"] = {"Capabilities": capabilities, "AllowAllDevices": False, "Devices": None}
    config["PidHost"] = pid_host
    return config


@pytest.fixture(scope="module")
def registry(stack):
    served = PluginRegistry({
        "climbs": (mounting(f"{CLIMB}{stack.state_dir}"), rootfs("climbs")),
        "climbs-short": (mounting("../x"), rootfs("climbs-short")),
        "inside": (mounting("rootfs/data"), rootfs("inside")),
        "tracer": (powered(["CAP_SYS_PTRACE"], pid_host=True), rootfs("tracer")),
        "handles": (powered(["CAP_DAC_READ_SEARCH"]), rootfs("handles")),
        "fuse": (powered(["CAP_SYS_ADMIN"]), rootfs("fuse")),
        "authz2": (plugin_config(["docker.authz/2.0"]), rootfs("authz2")),
        "authz-beside": (plugin_config(["docker.volumedriver/1.0", "docker.authz/1.1"]),
                         rootfs("authz-beside")),
    })  # fmt: skip
    yield served
    served.close()


def install(stack, sock: str, tmp_path, registry, repo: str, alias: str, *flags: str):
    return docker(getattr(stack, sock), tmp_path, "plugin", "install", "--grant-all-permissions",
                  *flags, "--alias", alias, f"{registry.address}/{repo}")  # fmt: skip


def remove_plugin(stack, tmp_path, name: str) -> None:
    docker(stack.engine_sock, tmp_path, "plugin", "rm", "-f", name)


# ------------------------------------------------------------ managed plugins' mounts


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize("repo", ["climbs", "climbs-short"])
def test_a_plugin_whose_mount_climbs_out_of_its_bundle_is_not_installed(
    stack, registry, tmp_path, sock, repo
):
    out = install(stack, sock, tmp_path, registry, repo, f"ga-{repo}")
    assert out.returncode != 0
    assert "gpu-alloc refused the plugin install" in out.stderr, out.stderr
    assert "climbs out of the plugin's bundle" in out.stderr
    assert f"ga-{repo}:latest" not in listed(stack)


@pytest.mark.parametrize("sock", SOCKETS)
def test_a_plugin_whose_mount_stays_in_its_bundle_installs(stack, registry, tmp_path, sock):
    out = install(stack, sock, tmp_path, registry, "inside", "ga-inside", "--disable")
    try:
        assert out.returncode == 0, out.stderr
        assert "ga-inside:latest" in listed(stack)
    finally:
        remove_plugin(stack, tmp_path, "ga-inside")


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize(
    "source", [f"{CLIMB}{{state}}", "../x", "rootfs/../../x", "./../../../{state}"]
)
def test_plugin_set_of_a_mount_source_out_of_its_bundle_is_refused(
    stack, registry, tmp_path, sock, source
):
    assert (
        install(
            stack, "engine_sock", tmp_path, registry, "inside", "ga-set", "--disable"
        ).returncode
        == 0
    )
    try:
        setting = f"st.source={source.format(state=stack.state_dir)}"
        out = docker(getattr(stack, sock), tmp_path, "plugin", "set", "ga-set", setting)
        assert out.returncode != 0 and "gpu-alloc refused the plugin setting" in out.stderr, (
            out.stderr
        )
        mounts = listed(stack)["ga-set:latest"]["Settings"]["Mounts"]
        assert [m["Source"] for m in mounts] == ["rootfs/data"]  # unchanged
        ok = docker(
            getattr(stack, sock), tmp_path, "plugin", "set", "ga-set", "st.source=rootfs/other"
        )
        assert ok.returncode == 0, ok.stderr
    finally:
        remove_plugin(stack, tmp_path, "ga-set")


@pytest.mark.parametrize("sock", SOCKETS)
def test_a_plugin_upgrade_to_a_mount_out_of_its_bundle_is_refused(stack, registry, tmp_path, sock):
    assert (
        install(stack, "engine_sock", tmp_path, registry, "inside", "ga-up", "--disable").returncode
        == 0
    )
    api = engine.engine_api(getattr(stack, sock))
    try:
        privileges = [{"Name": "mount", "Description": "", "Value": [f"{CLIMB}{stack.state_dir}"]}]
        answer = call(api, "POST", "/plugins/ga-up/upgrade", privileges,
                      remote=f"{registry.address}/climbs")  # fmt: skip
        assert answer.status_code == 403 and "climbs out" in answer.text, answer.text
    finally:
        api.close()
        remove_plugin(stack, tmp_path, "ga-up")


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize("repo", ["tracer", "handles", "fuse"])
def test_a_plugin_whose_privileges_hold_powers_outside_the_allow_list_is_not_installed(
    stack, registry, tmp_path, sock, repo
):
    """No AppArmor profile confines a managed plugin, so SYS_ADMIN (FUSE's) is refused too."""
    out = install(stack, sock, tmp_path, registry, repo, f"ga-{repo}")
    assert out.returncode != 0
    assert "policy.powers grants it nothing" in out.stderr, out.stderr
    assert f"ga-{repo}:latest" not in listed(stack)


# -------------------------------------------------- authorization plugins by capability


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize("repo", ["authz2", "authz-beside"])
def test_an_authorization_plugin_of_any_version_is_not_enabled(
    stack, registry, tmp_path, sock, repo
):
    out = install(stack, sock, tmp_path, registry, repo, f"ga-{repo}")
    try:
        assert out.returncode != 0
        assert "authz capability" in out.stderr, out.stderr
        assert listed(stack)[f"ga-{repo}:latest"]["Enabled"] is False
    finally:
        remove_plugin(stack, tmp_path, f"ga-{repo}")


# ------------------------------------------------------------ the Engine's own socket


def socket_binds(stack) -> dict[str, list[str]]:
    """Spellings of dockerd's socket; the link where a chrooted dockerd sees it too."""
    link = stack.dir / "sock-link"
    if not link.is_symlink():
        link.symlink_to(stack.engine_sock)
    return {
        "-v": ["-v", f"{stack.engine_sock}:/var/run/docker.sock"],
        "-v ro": ["-v", f"{stack.engine_sock}:/s:ro"],
        "--mount": ["--mount", f"type=bind,src={stack.engine_sock},dst=/s"],
        "through a link": ["-v", f"{link}:/s"],
        "spelled with ..": ["-v", f"{stack.engine_dir}/../e/./docker.sock:/s"],
    }


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize("how", ["-v", "-v ro", "--mount", "through a link", "spelled with .."])
def test_a_bind_of_dockerds_socket_is_refused(stack, sock, how):
    args = socket_binds(stack)[how]
    out = engine.docker_cli(getattr(stack, sock), "create", *args, IMAGE, "true")
    assert out.returncode != 0, out.stdout
    assert "gpu-alloc refused" in out.stderr and "docker.sock" in out.stderr, out.stderr


@pytest.mark.parametrize("sock", SOCKETS)
def test_a_bind_of_the_shims_socket_is_created_as_before(stack, sock):
    """The shim's socket vets every call, and knows who asks from inside a container."""
    out = engine.docker_cli(getattr(stack, sock), "create", "-v", f"{stack.shim_sock}:/s",
                            IMAGE, "true")  # fmt: skip
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def binders(stack) -> Iterator[None]:
    """Host users for `policy.engine_socket_binds`: BINDER by name, GROUPED in OPS."""
    with host_users.present(BINDER, GROUPED, NOT_NAMED, groups={GROUPED: OPS}):
        host_users.open_shim(stack)
        yield


@pytest.mark.parametrize("user", ["named", "in a named group"])
@pytest.mark.parametrize("how", ["-v", "--mount", "through a link", "beside --gpus 1"])
def test_an_owner_the_policy_names_binds_dockerds_socket_through_the_shim(
    stack, binders, user, how
):
    """The shim labels and marks the create; the start is judged by the owner it recorded
    (the creator, or the lease's), on either socket."""
    who = BINDER if user == "named" else GROUPED
    args = (
        ["--gpus", "1", *socket_binds(stack)["-v"]] if "gpus" in how else socket_binds(stack)[how]
    )
    out = clients.docker_cli(stack.shim_sock, "create", *args, IMAGE, "true", user=who)
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    try:
        labels = engine.engine_api(stack.engine_sock).inspect_container(cid)["Config"]["Labels"]
        assert labels.get("io.gpu-alloc.engine-socket") == who, labels
        started = clients.docker_cli(stack.shim_sock, "start", "-a", cid, user=who)
        assert started.returncode == 0, started.stderr
        again = clients.docker_cli(stack.engine_sock, "start", cid)
        assert again.returncode == 0, again.stderr
    finally:
        clients.docker_cli(stack.engine_sock, "rm", "-f", cid)


def test_an_owner_the_policy_does_not_name_is_refused_through_the_shim(stack, binders):
    args = socket_binds(stack)["-v"]
    out = clients.docker_cli(stack.shim_sock, "create", *args, IMAGE, "true", user=NOT_NAMED)
    assert out.returncode != 0, out.stdout
    assert "policy.engine_socket_binds" in out.stderr and "--context gpu-alloc" in out.stderr


def test_another_owner_cannot_borrow_a_named_owners_socket_through_the_shim(stack, binders):
    """Their own copy of the shim's label is stripped, and a named owner's container
    lends its socket bind to nobody else's --volumes-from."""
    args = socket_binds(stack)["-v"]
    label = ["--label", f"io.gpu-alloc.engine-socket={BINDER}"]
    out = clients.docker_cli(stack.shim_sock, "create", *label, *args, IMAGE, "true",
                             user=NOT_NAMED)  # fmt: skip
    assert out.returncode != 0 and "policy.engine_socket_binds" in out.stderr, out.stderr
    made = clients.docker_cli(stack.shim_sock, "create", *args, IMAGE, "true", user=BINDER)
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    try:
        for sock, who in ((stack.shim_sock, NOT_NAMED), (stack.engine_sock, None)):
            out = clients.docker_cli(sock, "create", "--volumes-from", cid, IMAGE, "true",
                                     user=who)  # fmt: skip
            assert out.returncode != 0 and "API socket" in out.stderr, out.stderr
    finally:
        clients.docker_cli(stack.engine_sock, "rm", "-f", cid)


def test_a_named_owner_still_may_not_bind_the_directory_that_holds_the_socket(stack, binders):
    out = clients.docker_cli(stack.shim_sock, "create", "-v", f"{stack.engine_dir}:/e",
                             IMAGE, "true", user=BINDER)  # fmt: skip
    assert out.returncode != 0 and "gpu-alloc refused" in out.stderr, out.stderr


@pytest.mark.parametrize("header", [None, "0" * 64])
def test_the_shims_label_and_mark_cannot_be_made_on_dockerds_socket(stack, binders, header):
    """A docker-group user copying what the shim sends: the label, a mark of their own."""
    api = engine.engine_api(stack.engine_sock)
    body = {"Image": IMAGE, "Cmd": ["true"], "Labels": {"io.gpu-alloc.engine-socket": BINDER},
            "HostConfig": {"Binds": [f"{stack.engine_sock}:/s"]}}  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["X-Gpu-Alloc-Create"] = header
    answer = api.post(api._url("/containers/create"), data=json.dumps(body), headers=headers)
    assert answer.status_code == 403, answer.text
    assert "io.gpu-alloc.engine-socket" in answer.text
    assert not [c for c in api.containers(all=True)
                if (c.get("Labels") or {}).get("io.gpu-alloc.engine-socket")]  # fmt: skip


# ----------------------------------------------------------------------------- pause


def running(stack, cid: str) -> bool:
    return engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]["Running"]


def test_a_paused_container_is_stopped_at_its_time_limit(stack):
    out = shim(stack, "run", "-d", "--gpus", "1", "--stop-timeout", "1",
               "--label", "io.gpu-alloc.time=3s", IMAGE, "sleep", "300")  # fmt: skip
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    assert shim(stack, "pause", cid).returncode == 0
    deadline = time.monotonic() + 30
    while running(stack, cid):
        assert time.monotonic() < deadline, "a paused container ran past its limit"
        time.sleep(0.3)
    assert engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]["Paused"] is False


def test_pause_and_unpause_within_a_limit_work_as_before(stack):
    out = shim(stack, "run", "-d", "--gpus", "1", "--stop-timeout", "1", IMAGE, "sleep", "300")
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    assert shim(stack, "pause", cid).returncode == 0
    time.sleep(2)
    assert shim(stack, "unpause", cid).returncode == 0
    time.sleep(1)
    state = engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]
    assert state["Running"] and not state["Paused"]


# ------------------------------------------------- reservations kept by what a grant does

ALICE, BOB = engine_root.host_user("ga34alice"), engine_root.host_user("ga34bob")


@pytest.fixture(scope="module")
def users(stack) -> Iterator[None]:
    with host_users.present(ALICE, BOB):
        host_users.open_shim(stack)
        yield


def as_user(stack, user: str, *args: str):
    return clients.docker_cli(stack.shim_sock, *args, user=user)


def reserve(stack, gpu: int, lead: float) -> tuple[str, float]:
    """A reservation of GPU ``gpu`` for alice from ``lead`` s on: (its id, a monotonic time
    by which its window has surely begun)."""
    made = engine.gpu_alloc(stack, "reserve", "--gpu", str(gpu), "--for", ALICE,
                            "--from", f"+{lead:g}s", "--to", "+5m")  # fmt: skip
    begun = time.monotonic() + lead
    assert made.returncode == 0, made.stderr
    listed = json.loads(engine.gpu_alloc(stack, "reservations", "--json").stdout)
    return next(r["id"] for r in listed if gpu in r["gpus"]), begun


def test_a_start_that_would_run_into_another_holders_window_is_refused(stack, users):
    """Granted as ending by the window's start, a container's clock starts at its first
    run: a start that would then run into the window is refused on both sockets."""
    rid, begun = reserve(stack, 1, 45)  # begun: when the window begins (monotonic)
    try:
        fits = as_user(stack, BOB, "create", "--name", "fits", "--gpus", "device=1",
                       "--label", "io.gpu-alloc.time=3s", IMAGE, "true")  # fmt: skip
        assert fits.returncode == 0, fits.stderr
        assert as_user(stack, BOB, "start", "fits").returncode == 0  # ends before the window
        engine.engine_api(stack.engine_sock).wait("fits", timeout=30)
        assert clients.docker_cli(stack.engine_sock, "rm", "fits").returncode == 0
        # A time limit that fits now with 5 s to spare, however long the above took, and
        # a wait until it no longer does, 10 s or more before the window.
        span = int(begun - time.monotonic()) - 5
        assert span >= 15, "too slow to tell: the window is upon us"
        late = as_user(stack, BOB, "create", "--name", "late", "--gpus", "device=1",
                       "--label", f"io.gpu-alloc.time={span}s", IMAGE, "sleep", "300")  # fmt: skip
        assert late.returncode == 0, late.stderr
        time.sleep(max(0.0, begun - span + 5 - time.monotonic()))  # now `span` runs into it
        for sock in (stack.shim_sock, stack.engine_sock):
            out = clients.docker_cli(sock, "start", "late", user=BOB if "shim" in sock else None)
            assert out.returncode != 0, out.stdout
            assert "would run inside that window" in out.stderr and rid in out.stderr, out.stderr
        assert not running(stack, "late")
    finally:
        clients.docker_cli(stack.engine_sock, "rm", "-f", "fits", "late")
        engine.gpu_alloc(stack, "reserve", "cancel", rid)


def test_a_container_not_running_when_the_window_begins_gives_its_gpu_up(stack, users):
    began = time.monotonic()
    rid, begun = reserve(stack, 0, 20)
    try:
        kept = as_user(stack, BOB, "create", "--name", "kept", "--gpus", "device=0",
                       "--label", "io.gpu-alloc.time=3s", IMAGE, "true")  # fmt: skip
        assert time.monotonic() < began + 17, "too slow to tell: 3 s no longer fit"
        assert kept.returncode == 0, kept.stderr
        time.sleep(max(0.0, begun + 1 - time.monotonic()))  # begun: "kept" never started
        for sock in (stack.shim_sock, stack.engine_sock):
            out = clients.docker_cli(sock, "start", "kept", user=BOB if "shim" in sock else None)
            assert out.returncode != 0 and rid in out.stderr, out.stderr
        mine = as_user(stack, ALICE, "create", "--name", "mine", "--gpus", "device=0",
                       IMAGE, "true")  # fmt: skip
        assert mine.returncode == 0, mine.stderr  # the holder gets it: "kept" gave it up
        out = clients.docker_cli(stack.engine_sock, "start", "kept")
        assert out.returncode != 0 and "gave that GPU up" in out.stderr, out.stderr
        audit = (stack.state_dir / "audit.jsonl").read_text().splitlines()
        released = [json.loads(line) for line in audit if '"release"' in line]
        assert any("gave the GPU up" in str(e.get("reason")) and rid in str(e.get("reason"))
                   for e in released), released[-3:]  # fmt: skip
    finally:
        clients.docker_cli(stack.engine_sock, "rm", "-f", "kept", "mine")
        engine.gpu_alloc(stack, "reserve", "cancel", rid)
