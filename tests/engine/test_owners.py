"""Who asks, and the operator's policy, through the shim with real non-root users.

The docker CLI runs as ga11alice (in group ga11ml) and ga11bob, the way people on a
shared server use the gpu-alloc context; the shim learns them from SO_PEERCRED.
GPUs 0-1 are 80 GB A100s in the ml-staff pool, 2-3 are 16 GB T4s open to all.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from allocator.core.leases.leases import StateError
from allocator.core.rules.policy import POOL
from allocator.host import unixhttp
from allocator.ops import cli
from allocator.service.reconciler import Reconciler
from allocator.service.views.wire import explain_target as explain_route
from tests.support import engine, host_users
from tests.support.engine import gpu_alloc

IMAGE = engine.BUSYBOX_TAG
ALICE, BOB, GROUP = "ga11alice", "ga11bob", "ga11ml"
UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]
POLICY = {
    "limits": {"default": {"gpus": 1}, "users": {ALICE: {"gpus": 2}}},
    "pools": {"training": {"gpus": [0, 1], "groups": [GROUP]}, "open": {"gpus": [2, 3]}},
    "gpu_defaults": {"shm_size": "2g", "ulimits": {"memlock": -1}},
}
GPUS = [
    {
        "uuid": UUIDS[k],
        "index": k,
        "minor": k,
        "numa_node": 0,
        "name": "NVIDIA A100-SXM4-80GB" if k < 2 else "Tesla T4",
        "memory_mib": 81920 if k < 2 else 16384,
    }
    for k in range(4)
]


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=4, policy=POLICY, sim=GPUS)


@pytest.fixture(scope="module", autouse=True)
def users(stack: engine.Stack) -> Iterator[None]:
    """Two people who may use the shim socket, and nothing else of the stack."""
    with host_users.present(ALICE, BOB, groups={ALICE: GROUP}):
        host_users.open_shim(stack)
        yield


def as_user(stack: engine.Stack, user: str | None, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args, user=user)


def gpus_of(stack: engine.Stack, name: str) -> list[str]:
    info = engine.engine_api(stack.engine_sock).inspect_container(name)
    return info["HostConfig"]["DeviceRequests"][0]["DeviceIDs"]


def create(stack: engine.Stack, user: str | None, name: str, *flags: str):
    return as_user(stack, user, "create", "--name", name, "--gpus", "1", *flags, IMAGE, "true")


def test_a_users_container_shows_them_in_status_and_its_name_after_rename(stack):
    made = create(stack, ALICE, "job")
    assert made.returncode == 0, made.stderr + stack.logs()
    labels = engine.engine_api(stack.engine_sock).inspect_container("job")["Config"]["Labels"]
    uid = int(subprocess.run(["id", "-u", ALICE], capture_output=True, text=True).stdout)
    assert labels["io.gpu-alloc.owner"] == f"{uid}:{ALICE}"
    assert as_user(stack, ALICE, "rename", "job", "job-renamed").returncode == 0
    snap = json.loads(gpu_alloc(stack, "status", "--json").stdout)
    (holder,) = snap["holders"]
    assert holder["owner"] == {"uid": uid, "user": ALICE}
    assert holder["name"] == "job-renamed" and holder["state"] == "created"
    assert holder["since"].endswith("Z")
    table = gpu_alloc(stack, "status").stdout
    line = next(row for row in table.splitlines() if ALICE in row)
    assert "job-renamed" in line and "created" in line
    assert max(map(len, table.splitlines())) <= 100
    assert "free: 3 of 4 GPUs" in table


def test_a_second_gpu_over_the_limit_is_refused_naming_the_rule(stack):
    assert create(stack, BOB, "first").returncode == 0
    second = create(stack, BOB, "second")
    assert second.returncode != 0
    assert f"{BOB} holds 1 of 1 GPU allowed (policy.limits.default)" in second.stderr
    assert "docker rm" in second.stderr
    other = create(stack, ALICE, "someone-else")
    assert other.returncode == 0, other.stderr
    for name in ("root-1", "root-2"):  # root is exempt by default
        assert create(stack, None, name).returncode == 0


def test_a_full_host_names_each_holder_once_with_owner(stack):
    assert (
        as_user(stack, ALICE, "create", "--name", "alices", "--gpus", "1", IMAGE, "true").returncode
        == 0
    )
    assert (
        as_user(stack, None, "create", "--name", "roots", "--gpus", "3", IMAGE, "true").returncode
        == 0
    )
    full = create(stack, None, "late")
    assert full.returncode != 0
    assert "0 of 4 free" in full.stderr
    assert full.stderr.count(f"of {ALICE}") == 1 and full.stderr.count("of root") == 1
    assert "'roots' of root" in full.stderr


def test_asking_for_more_than_the_host_has_says_so(stack):
    many = as_user(stack, None, "create", "--gpus", "9", IMAGE, "true")
    assert "this host has only 4" in many.stderr and "Remove" not in many.stderr


def test_pools_and_request_labels_pick_matching_gpus(stack):
    pool = "--label=io.gpu-alloc.pool=training"
    assert create(stack, ALICE, "train", pool).returncode == 0
    assert gpus_of(stack, "train")[0] in UUIDS[:2]
    barred = create(stack, BOB, "not-staff", pool)
    assert barred.returncode != 0 and "(policy.pools.training)" in barred.stderr
    t4 = create(stack, BOB, "small", "--label=io.gpu-alloc.request.model=T4")
    assert t4.returncode == 0, t4.stderr
    assert gpus_of(stack, "small")[0] in UUIDS[2:]
    big = create(stack, None, "big", "--label=io.gpu-alloc.request.min-memory=40g")
    assert big.returncode == 0 and gpus_of(stack, "big")[0] in UUIDS[:2]
    unknown = create(stack, None, "x", "--label=io.gpu-alloc.pool=nope")
    assert "gpu-alloc refused the container create: there is no GPU pool 'nope'" in unknown.stderr
    assert "name one of them with --label io.gpu-alloc.pool=NAME" in unknown.stderr


def test_gpu_defaults_only_where_the_client_set_nothing(stack):
    assert create(stack, None, "plain").returncode == 0
    assert (
        create(stack, None, "own", "--shm-size", "1g", "--ulimit", "memlock=1024").returncode == 0
    )
    api = engine.engine_api(stack.engine_sock)
    plain = api.inspect_container("plain")["HostConfig"]
    own = api.inspect_container("own")["HostConfig"]
    assert plain["ShmSize"] == 2 * 2**30
    assert {"Name": "memlock", "Soft": -1, "Hard": -1} in plain["Ulimits"]
    assert own["ShmSize"] == 2**30
    assert own["Ulimits"] == [{"Name": "memlock", "Soft": 1024, "Hard": 1024}]
    cpu_only = as_user(stack, None, "create", "--name", "cpu", IMAGE, "true")
    assert cpu_only.returncode == 0
    assert api.inspect_container("cpu")["HostConfig"]["ShmSize"] == 64 * 2**20


def test_a_privileged_gpu_container_is_refused_in_plain_words(stack):
    out = as_user(stack, ALICE, "run", "--rm", "--privileged", "--gpus", "1", IMAGE, "true")
    assert out.returncode != 0
    assert (
        "a privileged container sees every device on the host, every GPU included, so it is "
        "not allowed here (HostConfig.Privileged" in out.stderr
    )
    assert "--context" not in out.stderr and "--gpus N" in out.stderr


def test_a_denial_on_the_real_socket_gives_the_context_command(stack):
    out = engine.docker_cli(stack.engine_sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert out.returncode != 0
    assert "it asks for GPUs without a gpu-alloc lease (HostConfig.DeviceRequests" in out.stderr
    assert f"docker context create gpu-alloc --docker host=unix://{stack.shim_sock}" in out.stderr


def explain(stack: engine.Stack, *args: str) -> tuple[int, dict]:
    out = gpu_alloc(stack, "explain", *args, "--json")
    return out.returncode, json.loads(out.stdout) if out.stdout else {"stderr": out.stderr}


def test_explain_answers_each_case_with_its_exit_code(stack):
    code, fits = explain(stack, "--user", BOB, "--gpus", "1")
    assert code == 0 and fits["verdict"] == "fits" and len(fits["gpus"]) == 1
    assert engine.engine_api(stack.engine_sock).containers(all=True) == []  # took nothing
    assert explain(stack, "--gpus", "1")[1]["user"] == "root"  # whoever runs it
    assert create(stack, BOB, "bobs").returncode == 0
    code, refused = explain(stack, "--user", BOB, "--gpus", "1")
    assert code == 4 and "(policy.limits.default)" in refused["message"]
    code, barred = explain(stack, "--user", BOB, "--label", "io.gpu-alloc.pool=training")
    assert code == 4 and "(policy.pools.training)" in barred["message"]
    assert as_user(stack, None, "create", "--gpus", "3", IMAGE, "true").returncode == 0
    code, short = explain(stack, "--gpus", "1")
    assert code == 2 and f"'bobs' of {BOB}" in short["message"]
    assert explain(stack, "--gpus", "device=7")[0] == 3
    assert explain(stack, "--user", "no-such-user-here")[0] == 3
    assert explain(stack, "--label", "io.gpu-alloc.request.min-memory=lots")[0] == 3
    broken = gpu_alloc(stack, "explain", "--config", str(stack.dir / "missing.yaml"))
    assert broken.returncode == 1 and "no such config file" in broken.stderr
    text = gpu_alloc(stack, "explain", "--user", ALICE, "--gpus", "1")
    assert text.returncode == 2 and "not enough free GPUs" in text.stdout


def as_peer(user: str, sock: str, target: str, cgroups: Sequence[Path] = ()) -> tuple[int, dict]:
    """GET ``target`` on ``sock`` from a process running as ``user`` (forked, not exec'd:
    the venv's interpreter may be one only root can run), first moved into ``cgroups``
    (their directories), as root may."""
    pw = pwd.getpwnam(user)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the user, ask, report, leave
        try:
            for where in cgroups:
                (where / "cgroup.procs").write_text(str(os.getpid()))
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            code, body = unixhttp.request(sock, "GET", target, timeout=60)
            os.write(w, json.dumps([code, body.decode()]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as got:
        data = got.read()
    os.waitpid(pid, 0)
    code, body = json.loads(data)
    return code, json.loads(body)


def test_explain_through_the_shim_answers_for_the_user_who_asks(stack):
    code, answer = as_peer(BOB, str(stack.shim_sock), explain_route("1", []))
    assert code == 200 and answer["user"] == BOB and answer["verdict"] == "fits", answer
    pool = [f"{POOL}=training"]
    code, answer = as_peer(BOB, str(stack.shim_sock), explain_route("1", pool))
    assert answer["verdict"] == "refused" and "not open to ga11bob" in answer["message"]


def test_explain_asks_the_shim_when_the_state_cannot_be_read(stack, monkeypatch, capsys):
    def unreadable(self, adopt: bool = False):
        raise StateError("state.json: cannot read: Permission denied")

    monkeypatch.setattr(Reconciler, "reconcile", unreadable)
    monkeypatch.setattr(cli.os, "access", lambda *a: False)  # not root
    assert cli.main(["explain", "--config", str(stack.config_path), "--gpus", "1", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["verdict"] == "fits" and answer["user"] == "root"  # whoever asked the shim


# Inside a container: a busybox with the host's docker CLI, the libraries it loads and the
# shim socket bound in, as a user might bind them into a dev container.
INNER_SOCK = "/run/gpu-alloc.sock"


def client(stack: engine.Stack) -> list[str]:
    """``docker run`` arguments for a container such a client runs in."""
    cli_path = shutil.which("docker") or "/usr/bin/docker"
    ldd = subprocess.run(["ldd", cli_path], capture_output=True, text=True).stdout
    binds = [f"{cli_path}:/bin/docker:ro", f"{stack.shim_sock}:{INNER_SOCK}"]
    binds += [f"{lib}:{lib}:ro" for lib in re.findall(r"(/\S+) \(0x", ldd)]
    # The policy's memlock=-1 is more than this host lets runc set: keep its own limit.
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    flags = ["--ulimit", f"memlock={memlock}", *(a for b in binds for a in ("-v", b))]
    return [*flags, IMAGE, "sleep", "300"]


def inside(stack: engine.Stack, container: str, uid: str, *args: str):
    """The docker CLI run as ``uid`` inside ``container``, against the shim."""
    return engine.docker_cli(
        stack.engine_sock, "exec", "-u", uid, "-e", "DOCKER_CONFIG=/tmp", container,
        "docker", "-H", f"unix://{INNER_SOCK}", *args,
    )  # fmt: skip


def run_client(stack: engine.Stack, user: str, name: str, *flags: str) -> None:
    made = as_user(stack, user, "run", "-d", "--name", name, *flags, *client(stack))
    assert made.returncode == 0, made.stderr + stack.logs()


def test_a_client_inside_alices_container_is_alice_whatever_uid_it_runs_as(stack):
    """Charged to alice, under her limit; and what it makes is hers again."""
    run_client(stack, ALICE, "alices", "--gpus", "1")
    made = inside(stack, "alices", "0", "run", "-d", "--name", "nested", "--gpus", "1",
                  *client(stack))  # fmt: skip
    assert made.returncode == 0, made.stderr + stack.logs()
    labels = engine.engine_api(stack.engine_sock).inspect_container("nested")["Config"]["Labels"]
    assert labels["io.gpu-alloc.owner"] == f"{pwd.getpwnam(ALICE).pw_uid}:{ALICE}"
    bob = str(pwd.getpwnam(BOB).pw_uid)
    for uid in ("0", bob, "4321"):  # root (exempt), another user, a fresh uid
        inner = inside(stack, "nested", uid, "create", "--gpus", "1", IMAGE, "true")
        assert inner.returncode != 0, f"uid {uid}: created"
        assert f"{ALICE} holds 2 of 2 GPUs allowed (policy.limits.users.{ALICE})" in inner.stderr


def test_a_client_inside_a_container_gpu_alloc_did_not_make_is_unknown(stack):
    # made on dockerd's own socket, without a GPU: no lease, no creator the shim saw
    made = engine.docker_cli(stack.engine_sock, "run", "-d", "--name", "plain", *client(stack))
    assert made.returncode == 0, made.stderr
    made = inside(stack, "plain", "0", "create", "--gpus", "1", "--name", "inner", IMAGE, "true")
    assert made.returncode == 0, made.stderr + stack.logs()
    labels = engine.engine_api(stack.engine_sock).inspect_container("inner")["Config"]["Labels"]
    assert labels["io.gpu-alloc.owner"] == ":unknown"
    again = inside(stack, "plain", "0", "create", "--gpus", "1", IMAGE, "true")
    assert "unknown holds 1 of 1 GPU allowed (policy.limits.default)" in again.stderr


@pytest.mark.parametrize("uid", ["0", "4321"])
def test_a_client_inside_a_plain_container_the_shim_made_is_its_creator(stack, uid):
    """bob at his limit runs a container without GPUs through the shim, the shim's socket
    bound in: from inside it he is still bob, at his limit, not ``unknown``."""
    run_client(stack, BOB, "bobs", "--gpus", "1")
    run_client(stack, BOB, "plain")  # no GPU: the shim records its creator all the same
    got = inside(stack, "plain", uid, "create", "--gpus", "1", IMAGE, "true")
    assert got.returncode != 0, got.stdout
    assert f"{BOB} holds 1 of 1 GPU allowed (policy.limits.default)" in got.stderr, got.stderr
    nested = inside(stack, "plain", uid, "run", "-d", "--name", "nested", *client(stack))
    assert nested.returncode == 0, nested.stderr  # what it makes is bob's again
    again = inside(stack, "nested", uid, "create", "--gpus", "1", IMAGE, "true")
    assert f"{BOB} holds 1 of 1 GPU allowed" in again.stderr, again.stderr
    plain = engine.engine_api(stack.engine_sock).inspect_container("plain")["Id"]
    creators = stack.state_dir / "creators.json"
    assert plain in json.loads(creators.read_text())
    engine.engine_api(stack.engine_sock).remove_container("plain", force=True)
    deadline = time.monotonic() + 10  # the shim follows the Engine's destroy events
    while plain in json.loads(creators.read_text()):
        assert time.monotonic() < deadline, "the record outlived its container"
        time.sleep(0.2)


def cgroup_dirs(pid: int) -> list[Path]:
    """The directories of each hierarchy process ``pid`` is in (cgroup v1 and v2)."""
    top = Path("/sys/fs/cgroup")
    out = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        name = controllers.removeprefix("name=") or (
            "unified" if (top / "unified").is_dir() else ""
        )
        out.append(top / name / path.lstrip("/"))
    return out


def test_a_host_process_moved_into_alices_container_asks_as_alice(stack):
    """The shim's own endpoints answer for the same person a create is charged to."""
    run_client(stack, ALICE, "alices", "--gpus", "1")
    pid = engine.engine_api(stack.engine_sock).inspect_container("alices")["State"]["Pid"]
    route = explain_route("2", [])
    code, answer = as_peer(BOB, str(stack.shim_sock), route, cgroup_dirs(pid))
    assert code == 200 and answer["user"] == ALICE, answer
    assert f"{ALICE} holds 1 of 2 GPUs allowed (policy.limits.users.{ALICE})" in answer["message"]
    assert as_peer(BOB, str(stack.shim_sock), route)[1]["user"] == BOB  # from the host: bob


def test_an_image_labelled_as_gpu_allocs_does_not_make_its_containers_anyones(stack):
    """dockerd merges an image's labels into its containers: `LABEL io.gpu-alloc.owner=0:root`
    with a lease label on an image must not make a client inside one root (exempt), nor
    charge anyone: only the ledger's lease names an owner."""
    api = engine.engine_api(stack.engine_sock)
    forged = "gpu-alloc-test/forged:latest"
    base = api.create_container(IMAGE, ["true"])["Id"]
    changes = ["LABEL io.gpu-alloc.owner=0:root", "LABEL io.gpu-alloc.lease=x"]
    try:
        api.commit(base, repository=forged, changes=changes)
        # on dockerd's own socket: the shim recorded no creator, only the labels could say
        made = engine.docker_cli(stack.engine_sock, "run", "-d", "--name", "forged",
                                 *client(stack)[:-3], forged, "sleep", "300")  # fmt: skip
        assert made.returncode == 0, made.stderr + stack.logs()
        got = inside(stack, "forged", "0", "create", "--gpus", "1", "--name", "took", IMAGE, "true")
        assert got.returncode == 0, got.stderr + stack.logs()
        labels = api.inspect_container("took")["Config"]["Labels"]
        assert labels["io.gpu-alloc.owner"] == ":unknown"  # not 0:root
        again = inside(stack, "forged", "0", "create", "--gpus", "1", IMAGE, "true")
        assert "unknown holds 1 of 1 GPU allowed (policy.limits.default)" in again.stderr
    finally:
        for name in ("forged", "took", base):
            api.remove_container(name, force=True)
        api.remove_image(forged, force=True)
