"""The allow-list of container powers on a real dockerd (allocator/core/access/powers.py):
each power that once let a container be root on the host (or stop the daemons that keep
GPUs exclusive) refused on dockerd's own socket and the shim's, ordinary use beside it
created as before, and a power ``policy.powers`` grants let through for its owner alone,
through the shim.  Each refusal is checked with the Engine's own answer: nothing created.
"""

from __future__ import annotations

import io
import json
import resource
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator

import docker
import pytest

from allocator.host import apparmor
from tests.support import clients, engine, engine_root, host_users
from tests.support.faults import IMAGE, real

SOCKETS = ["engine_sock", "shim_sock"]
# NGC's --ulimit memlock=-1 is more than this host lets runc set: its own limit starts.
MEMLOCK = f"memlock={resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]}"
GRANTED, NOT_NAMED = engine_root.host_user("ga41p-ann"), engine_root.host_user("ga41p-bob")


def make_stack() -> engine.Stack:
    grants = {name: {"users": [GRANTED]} for name in ("SYS_TIME", "SYS_ADMIN", "pid-host")}
    return engine.Stack(gpus=2, policy={"exempt": [], "powers": grants})


def create(stack, sock: str, *args: str, user: str | None = None):
    return clients.docker_cli(getattr(stack, sock), "create", *args, IMAGE, "true", user=user)


# The attacks, admitted before the allow-list, and the old root powers.
REFUSED = {
    "SYS_TIME (the host's clock)": (["--cap-add", "SYS_TIME"], "policy.powers: {SYS_TIME:"),
    "pid host alone (stop the daemons)": (["--pid", "host"], "policy.powers: {pid-host:"),
    "systempaths=unconfined (core_pattern)": (
        ["--security-opt", "systempaths=unconfined"],
        "policy.powers: {systempaths-unconfined:",
    ),
    "SYS_ADMIN (devices cgroup)": (["--cap-add", "SYS_ADMIN"], "policy.powers: {SYS_ADMIN:"),
    "seccomp=unconfined": (["--security-opt", "seccomp=unconfined"], "seccomp-unconfined"),
    "apparmor=unconfined": (["--security-opt", "apparmor=unconfined"], "apparmor-unconfined"),
    "userns host": (["--userns", "host"], "userns-host"),
    "uts host": (["--uts", "host"], "uts-host"),
    "unsafe sysctl": (["--sysctl", "kernel.msgmax=1", "--ipc", "host"], "sysctls"),
    "oom score below 0": (["--oom-score-adj", "-500"], "oom-score-adj"),
    "block device rule": (["--device-cgroup-rule", "b 7:* rwm"], "policy.powers: {devices:"),
    "pid host + SYS_PTRACE": (["--pid", "host", "--cap-add", "sys_ptrace"], "SYS_PTRACE"),
    "DAC_READ_SEARCH": (["--cap-add", "CAP_DAC_READ_SEARCH"], "DAC_READ_SEARCH"),
    "ALL, one dropped": (["--cap-add", "ALL", "--cap-drop", "SYS_ADMIN"], "{ALL:"),
}


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize(("args", "said"), REFUSED.values(), ids=REFUSED.keys())
def test_a_power_outside_the_allow_list_is_refused_naming_its_grant(stack, sock, args, said):
    out = create(stack, sock, *args)
    assert out.returncode != 0, out.stdout
    assert "gpu-alloc refused the container create" in out.stderr and said in out.stderr, out.stderr
    assert not engine.engine_api(stack.engine_sock).containers(all=True)


ORDINARY = {
    "plain": [],
    "ipc host, NGC's ulimits and shm": ["--ipc", "host", "--ulimit", MEMLOCK,
                                        "--ulimit", "stack=67108864", "--shm-size", "1g"],
    "network host": ["--network", "host"],
    "ML capabilities": ["--cap-add", "SYS_NICE", "--cap-add", "IPC_LOCK",
                        "--cap-add", "SYS_PTRACE", "--cap-add", "NET_ADMIN"],
    "drops": ["--cap-drop", "ALL", "--cap-add", "CHOWN"],
    "no-new-privileges": ["--security-opt", "no-new-privileges"],
    "safe sysctls": ["--sysctl", "net.ipv4.ip_local_port_range=1024 65000",
                     "--sysctl", "kernel.shmmax=68719476736"],
    "init, read-only root, tmpfs": ["--init", "--read-only", "--tmpfs", "/scratch"],
    "fuse device": ["--device", "/dev/fuse"],
}  # fmt: skip


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize("args", ORDINARY.values(), ids=ORDINARY.keys())
def test_ordinary_containers_are_created_and_started_as_before(stack, sock, args):
    out = create(stack, sock, *args)
    assert out.returncode == 0, out.stderr
    started = clients.docker_cli(getattr(stack, sock), "start", "-a", out.stdout.strip())
    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize("sock", SOCKETS)
def test_ngcs_unlimited_memlock_is_created_as_before(stack, sock):
    out = create(stack, sock, "--ulimit", "memlock=-1", "--ulimit", "stack=67108864")
    assert out.returncode == 0, out.stderr


def test_ipc_host_beside_whole_gpus_through_the_shim(stack):
    out = clients.docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1", "--ipc", "host",
                             "--ulimit", MEMLOCK, IMAGE, "true")  # fmt: skip
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def owners(stack) -> Iterator[None]:
    with host_users.present(GRANTED, NOT_NAMED):
        host_users.open_shim(stack)
        yield


def test_a_granted_power_is_its_owners_through_the_shim_and_started_by_them(stack, owners):
    out = create(stack, "shim_sock", "--cap-add", "SYS_TIME", user=GRANTED)
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    started = clients.docker_cli(stack.shim_sock, "start", "-a", cid, user=GRANTED)
    assert started.returncode == 0, started.stderr
    again = clients.docker_cli(stack.engine_sock, "start", "-a", cid)  # the recorded owner's
    assert again.returncode == 0, again.stderr


def test_a_granted_power_is_nobody_elses_and_not_on_dockerds_socket(stack, owners):
    other = create(stack, "shim_sock", "--cap-add", "SYS_TIME", user=NOT_NAMED)
    assert other.returncode != 0 and "policy.powers: {SYS_TIME:" in other.stderr, other.stderr
    api = engine.engine_api(stack.engine_sock)
    body = {"Image": IMAGE, "Cmd": ["true"], "Labels": {"io.gpu-alloc.engine-socket": GRANTED},
            "HostConfig": {"CapAdd": ["SYS_TIME"]}}  # fmt: skip
    answer = api.post(api._url("/containers/create"), data=json.dumps(body),
                      headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 403, answer.text  # the owner's label, copied: forged
    assert not api.containers(all=True)


@pytest.mark.parametrize("sock", SOCKETS)
def test_joining_the_pid_namespace_of_a_container_in_the_hosts_is_refused(stack, owners, sock):
    """``--pid container:X``: what X holds, the joiner holds (core/access/joined.py), X's
    power over the host included, whoever was granted it for X."""
    hop = create(stack, "shim_sock", "--pid", "host", user=GRANTED)
    assert hop.returncode == 0, hop.stderr
    out = create(stack, sock, "--pid", f"container:{hop.stdout.strip()}")
    assert out.returncode != 0 and "--pid host sees and signals" in out.stderr, out.stderr
    plain = real(stack, "create", IMAGE, "true")
    joined = create(stack, sock, "--pid", f"container:{plain.stdout.strip()}")
    assert joined.returncode == 0, joined.stderr


def test_a_granted_sys_admin_needs_apparmor_on_the_host(stack, owners):
    """This host runs no AppArmor: nothing would keep SYS_ADMIN's mounts from the devices
    cgroup, so even its owner is refused it."""
    if apparmor.loaded():
        pytest.skip("AppArmor is loaded here: the grant would hold")
    out = create(stack, "shim_sock", "--cap-add", "SYS_ADMIN", user=GRANTED)
    assert out.returncode != 0 and "AppArmor" in out.stderr, out.stderr


def payload_tar() -> bytes:
    """A tar of one script, as `docker cp - CONTAINER:DIR` reads it from stdin."""
    data = b"echo from someone else\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("payload")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_granted_containers_exec_is_its_owners_and_roots_alone_and_copies_nobodys(stack, owners):
    """A power granted to one owner is not everyone's by `docker exec` or `docker cp`."""
    made = clients.docker_cli(stack.shim_sock, "run", "-d", "--cap-add", "SYS_TIME", IMAGE,
                              "sleep", "300", user=GRANTED)  # fmt: skip
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    for user in (GRANTED, None):  # the owner, and root, through the shim
        ran = clients.docker_cli(stack.shim_sock, "exec", cid, "true", user=user)
        assert ran.returncode == 0, ran.stderr
    other = clients.docker_cli(stack.shim_sock, "exec", cid, "true", user=NOT_NAMED)
    assert other.returncode != 0 and "gpu-alloc refused to exec into" in other.stderr, other.stderr
    assert f"grants {GRANTED} alone (HostConfig.CapAdd)" in other.stderr
    for user in (GRANTED, NOT_NAMED):  # a copy's stream says nobody's name
        copied = clients.docker_cli(stack.shim_sock, "cp", "-", f"{cid}:/tmp/",
                                    input=payload_tar(), user=user)  # fmt: skip
        said = copied.stderr.decode()  # bytes: the tar went in as bytes
        assert copied.returncode != 0 and "gpu-alloc refused to copy files into" in said, said
        assert "cat > PATH" in said
    there = clients.docker_cli(stack.engine_sock, "cp", f"{cid}:/tmp/payload", "-")
    assert there.returncode != 0 and "payload" in there.stderr, there.stderr
    real = clients.docker_cli(stack.engine_sock, "exec", cid, "true")  # nobody by name
    assert real.returncode != 0 and "gpu-alloc refused to exec into" in real.stderr, real.stderr


ECHO = ["sh", "-c", "read line; echo got $line"]


def attached(stack, cid: str, since: float) -> bool:
    """dockerd has an attach to ``cid`` since ``since`` (its own event says so)."""
    api = engine.engine_api(stack.engine_sock)
    seen = api.events(since=int(since), until=int(time.time()) + 1, decode=True,
                      filters={"container": cid, "event": "attach"})  # fmt: skip
    return any(True for _ in seen)


def test_a_granted_containers_input_is_its_owners_and_its_output_anyones(stack, owners):
    """An attach that feeds stdin types into the main process, as an exec runs in it: an
    owned container's is its owner's; one that only reads output is anyone's."""
    typed = clients.docker_cli(stack.shim_sock, "run", "-i", "--cap-add", "SYS_TIME", IMAGE,
                               *ECHO, input="hi\n", user=GRANTED)  # fmt: skip
    assert typed.returncode == 0 and typed.stdout.strip() == "got hi", typed.stderr
    made = clients.docker_cli(stack.shim_sock, "run", "-d", "-i", "--cap-add", "SYS_TIME", IMAGE,
                              *ECHO, user=GRANTED)  # fmt: skip
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    for sock, user in ((stack.shim_sock, NOT_NAMED), (stack.engine_sock, None)):
        other = clients.docker_cli(sock, "attach", cid, input="reboot\n", user=user)
        # the CLI drops the body of an answer that is no upgrade: the reason is logged
        assert other.returncode != 0, other.stdout
        assert "unable to upgrade to tcp, received 403" in other.stderr, other.stderr
    assert "gpu-alloc refused to attach to the input of" in stack.logs()
    since = time.time() - 1
    watched: list[subprocess.CompletedProcess] = []
    watcher = threading.Thread(target=lambda: watched.append(clients.docker_cli(
        stack.shim_sock, "attach", "--no-stdin", cid, user=NOT_NAMED)))  # fmt: skip
    watcher.start()
    try:
        deadline = time.monotonic() + 60
        while not attached(stack, cid, since):
            assert time.monotonic() < deadline and watcher.is_alive(), watched
            time.sleep(0.2)
        # (the CLI of 29 shows no output once its stdin has ended: the logs say what came)
        owner = clients.docker_cli(stack.shim_sock, "attach", cid, input="hi\n", user=GRANTED)
        assert owner.returncode == 0, owner.stderr
        assert real(stack, "logs", cid).stdout.strip() == "got hi"
        watcher.join(120)
        assert watched[0].returncode == 0 and watched[0].stdout.strip() == "got hi", watched
    finally:
        real(stack, "rm", "-f", cid)


_FIRST_ANSWER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.stdin.buffer.read())
got = b""
while b"\\r\\n\\r\\n" not in got and (chunk := s.recv(65536)):
    got += chunk
head, _, body = got.partition(b"\\r\\n\\r\\n")
length = [int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\\r\\n"))
          if k.strip().lower() == b"content-length"]
while length and len(body) < length[0] and (chunk := s.recv(65536)):
    body += chunk
sys.stdout.write((head + b"\\r\\n\\r\\n" + body).decode())
"""


def first_answer(sock: str, request: bytes, user: str | None) -> str:
    """The head and body of the first answer to ``request``, sent as ``user``; the
    connection is closed then, a hijacked one too."""
    ran = subprocess.run(["/usr/bin/python3", "-c", _FIRST_ANSWER, sock], input=request,
                         capture_output=True, timeout=60, check=True, user=user)  # fmt: skip
    return ran.stdout.decode()


def start_exec(sock: str, exec_id: str, user: str | None) -> str:
    """``POST /exec/ID/start`` detached, as ``user``: the answer's status line and body."""
    body = b'{"Detach":true}'
    request = (b"POST /v1.41/exec/%s/start HTTP/1.1\r\nHost: docker\r\nContent-Type: "
               b"application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
               % (exec_id.encode(), len(body), body))  # fmt: skip
    return first_answer(sock, request, user)


def test_a_websocket_attach_is_kept_as_an_attach_is(stack, owners):
    """Below API 1.42 a websocket attach always feeds stdin (dockerd's wsContainersAttach)."""
    made = clients.docker_cli(stack.shim_sock, "run", "-d", "-i", "--cap-add", "SYS_TIME", IMAGE,
                              "cat", user=GRANTED)  # fmt: skip
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    request = (b"GET /v1.41/containers/%s/attach/ws?stream=1&stdout=1 HTTP/1.1\r\n"
               b"Host: docker\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
               b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               b"Origin: http://docker\r\n\r\n" % cid.encode())  # fmt: skip
    for sock, user in ((stack.shim_sock, NOT_NAMED), (stack.engine_sock, None)):
        answer = first_answer(sock, request, user)
        assert answer.startswith("HTTP/1.1 403 "), answer
        assert "gpu-alloc refused to attach to the input of" in answer, answer
    answer = first_answer(stack.shim_sock, request, GRANTED)
    assert answer.startswith("HTTP/1.1 101 "), answer
    real(stack, "rm", "-f", cid)


def test_an_owners_exec_is_started_by_them_alone(stack, owners):
    """Whoever starts an exec gets its stream: reading an exec's id from ``ExecIDs`` in
    an owned container's inspect gives nobody else its start."""
    made = clients.docker_cli(stack.shim_sock, "run", "-d", "--cap-add", "SYS_TIME", IMAGE,
                              "sleep", "300", user=GRANTED)  # fmt: skip
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    made_exec = engine.engine_api(stack.shim_sock).exec_create(cid, ["true"])  # root's, marked
    for sock, user in ((stack.shim_sock, NOT_NAMED), (stack.engine_sock, None)):
        answer = start_exec(sock, made_exec["Id"], user)
        assert answer.startswith("HTTP/1.1 403 "), answer
        assert "gpu-alloc refused to start an exec in" in answer, answer
    started = start_exec(stack.shim_sock, made_exec["Id"], None)  # root, through the shim
    assert started.startswith("HTTP/1.1 200 "), started
    real(stack, "rm", "-f", cid)


def test_an_owned_container_is_not_moved_under_a_reference_judged_on_another(stack, owners):
    """dockerd looks a reference up again after the plugin judged it: renaming an owned
    container is its owner's, a call that names nothing is refused, and a reference that
    reads as an id prefix is judged on every container it could name."""
    # created, not run: 29 renames a running container's endpoints, and the harness's
    # dockerds run with no bridge network
    made = clients.docker_cli(stack.shim_sock, "create", "--name", "ga41-owned", "--cap-add",
                              "SYS_TIME", IMAGE, "sleep", "300", user=GRANTED)  # fmt: skip
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    for sock, user in ((stack.shim_sock, NOT_NAMED), (stack.engine_sock, None)):
        moved = clients.docker_cli(sock, "rename", "ga41-owned", "vv1", user=user)
        assert moved.returncode != 0, moved.stdout
        assert "gpu-alloc refused to rename ga41-owned" in moved.stderr, moved.stderr
    for name in ("ga41-mine", "ga41-owned"):  # its owner may, through the shim
        renamed = clients.docker_cli(stack.shim_sock, "rename", cid, name, user=GRANTED)
        assert renamed.returncode == 0, renamed.stderr
    api = engine.engine_api(stack.engine_sock)
    with pytest.raises(docker.errors.APIError, match="no container is vv1 now"):
        api.exec_create("vv1", ["true"])
    prefix = cid[:8]
    plain = real(stack, "run", "-d", "--name", prefix, IMAGE, "sleep", "300")
    assert plain.returncode == 0, plain.stderr  # named like the owned container's id
    with pytest.raises(docker.errors.APIError, match=f"refused to exec into {prefix}"):
        api.exec_create(prefix, ["true"])  # once renamed away, dockerd reads the prefix
    ran = clients.docker_cli(stack.shim_sock, "exec", prefix, "true", user=NOT_NAMED)
    assert ran.returncode == 0, ran.stderr  # pinned: judged on the full id it names now
    # A link's alias names the owned container until its parent, anyone's, is renamed.
    parent = real(stack, "create", "--name", "ga41-parent", "--link", f"{cid}:al", IMAGE, "true")
    assert parent.returncode == 0, parent.stderr
    with pytest.raises(docker.errors.APIError, match="by a link's alias"):
        api.exec_create("ga41-parent/al", ["true"])
    real(stack, "rm", "-f", cid, prefix, "ga41-parent")


def test_a_plain_containers_doors_stay_open_to_everyone(stack, owners):
    made = clients.docker_cli(stack.shim_sock, "run", "-d", IMAGE, "sleep", "300", user=GRANTED)
    assert made.returncode == 0, made.stderr
    for sock, user in ((stack.shim_sock, NOT_NAMED), (stack.engine_sock, None)):
        ran = clients.docker_cli(sock, "exec", made.stdout.strip(), "true", user=user)
        assert ran.returncode == 0, ran.stderr
