"""Exclusive GPUs end to end: docker CLI, Compose and the SDK against a real dockerd.

One stack for the module: the gpu-alloc plugin, a private dockerd that uses it,
and the shim in front; 4 simulated GPUs.  Tests leave no container behind, so
each starts with every GPU free.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import tempfile

import pytest

from tests.support import cdi, engine

IMAGE = engine.BUSYBOX_TAG
UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]


def shim(stack: engine.Stack, *args: str, **kw) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args, **kw)


def real(stack: engine.Stack, *args: str, **kw) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.engine_sock, *args, **kw)


def status(stack: engine.Stack) -> dict:
    out = subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def visible(stack: engine.Stack, *gpus_args: str) -> subprocess.CompletedProcess:
    """The GPUs a container got: as the runtime hook is told, or as CDI injected them."""
    return shim(stack, "run", "--rm", *gpus_args, IMAGE, "sh", "-c", cdi.seen())


def test_gpus_1_gets_an_unused_gpu_by_uuid_not_index_0(stack):
    first = shim(stack, "run", "-d", "--gpus", "1", IMAGE, "sleep", "30")
    assert first.returncode == 0, first.stderr
    second = visible(stack, "--gpus", "1")
    assert second.returncode == 0, second.stderr + stack.logs()
    held = [g["uuid"] for g in status(stack)["gpus"] if not g["free"]]
    assert len(held) == 1
    assert second.stdout.strip() in UUIDS
    assert second.stdout.strip() != held[0]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--gpus", "2"), 2),
        (("--gpus", "all"), 4),
        (("--gpus", '"device=1"'), [UUIDS[1]]),
        (("--gpus", f"device={UUIDS[3]}"), [UUIDS[3]]),
        (("--gpus", f'"device=0,{UUIDS[2]}"'), [UUIDS[0], UUIDS[2]]),
    ],
    ids=["count-2", "all", "index-1", "uuid", "index-and-uuid"],
)
def test_each_gpus_form_gets_exactly_what_it_names(stack, args, expect):
    out = visible(stack, *args)
    assert out.returncode == 0, out.stderr + stack.logs()
    got = out.stdout.strip().split(",")
    if isinstance(expect, int):
        assert len(set(got)) == expect and set(got) <= set(UUIDS)
    else:
        assert sorted(got) == sorted(expect)


def test_a_named_gpu_that_is_held_is_refused_with_the_holder(stack):
    held = shim(
        stack, "run", "-d", "--name", "holder", "--gpus", '"device=1"', IMAGE, "sleep", "30"
    )
    assert held.returncode == 0, held.stderr
    again = visible(stack, "--gpus", '"device=1"')
    assert again.returncode != 0
    assert "GPU 1 (" in again.stderr and "asked by name, is not free" in again.stderr
    assert "holder" in again.stderr


def test_unknown_gpu_is_refused_and_lists_the_gpus(stack):
    out = visible(stack, "--gpus", '"device=7"')
    assert out.returncode != 0
    assert "GPU '7' is not a GPU on this host" in out.stderr
    assert UUIDS[0] in out.stderr


def test_more_gpus_than_the_host_has_is_a_409_saying_so(stack):
    out = visible(stack, "--gpus", "5")
    assert out.returncode != 0
    assert "asked for 5 GPUs but this host has only 4; ask for fewer" in out.stderr
    assert "Remove" not in out.stderr


def test_sixteen_parallel_runs_share_four_gpus_without_overlap(stack):
    # Each container reports its GPU and when it ran (host uptime: shared clock).
    script = f"cat /proc/uptime; {cdi.seen()}; sleep 1; cat /proc/uptime"

    def one(_: int) -> subprocess.CompletedProcess:
        return shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "sh", "-c", script)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    runs = []
    for r in results:
        if r.returncode == 0:
            start, gpu, end = r.stdout.split("\n")[:3]
            runs.append((float(start.split()[0]), float(end.split()[0]), gpu))
        else:
            assert "not enough free GPUs: asked for 1 GPU, 0 of 4 free" in r.stderr, r.stderr
    assert runs, stack.logs()
    for i, (s1, e1, g1) in enumerate(runs):
        assert g1 in UUIDS
        overlapping = [g2 for s2, e2, g2 in runs[i + 1 :] if s2 < e1 and s1 < e2]
        assert g1 not in overlapping, f"GPU {g1} granted to two running containers"
    assert status(stack)["free"] == 4


def test_gpus_on_the_real_socket_are_denied_by_the_plugin(stack):
    out = real(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert out.returncode != 0
    assert "authorization denied by plugin" in out.stderr
    assert "--context gpu-alloc" in out.stderr
    assert engine.engine_api(stack.engine_sock).containers(all=True) == []


def test_containers_without_gpus_work_on_both_sockets(stack):
    via_shim = shim(stack, "run", "--rm", IMAGE, "printenv", "NVIDIA_VISIBLE_DEVICES")
    assert via_shim.returncode == 0, via_shim.stderr
    assert via_shim.stdout.strip() == "void"  # the visibility guard
    direct = real(stack, "run", "--rm", IMAGE, "echo", "hello")
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout.strip() == "hello"


def test_a_stopped_container_keeps_its_gpu_and_rm_frees_it(stack):
    made = shim(stack, "run", "--name", "keeper", "--gpus", "1", IMAGE, "sh", "-c", cdi.seen())
    assert made.returncode == 0, made.stderr
    gpu = made.stdout.strip()
    assert status(stack)["free"] == 3  # exited, still leased
    restarted = shim(stack, "start", "-a", "keeper")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.strip() == gpu
    assert shim(stack, "rm", "keeper").returncode == 0
    assert status(stack)["free"] == 4


def test_a_refusal_names_the_stopped_container_that_holds_the_only_gpu(stack_factory):
    """A GPU that looks unused (its holder exited): the refusal says so, and what frees it."""
    stack = stack_factory(gpus=1)
    made = shim(stack, "run", "--name", "train", "--gpus", "1", IMAGE, "true")
    assert made.returncode == 0, made.stderr
    refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0
    err = refused.stderr
    assert (
        "not enough free GPUs: asked for 1 GPU, 0 of 1 free on this host, held by:\n  GPU 0: "
        in err
    )
    assert "'train' of root, held " in err and ", bound; stopped: Exited (0) " in err, err
    assert err.count("A stopped container keeps its GPUs until it is removed") == 1, err
    assert "its owner can 'docker rm' it, or the operator can set policy." in err, err
    text = subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 0, text.stderr
    assert "train" in text.stdout and "exited (0)" in text.stdout, text.stdout
    assert status(stack)["free"] == 0
    assert shim(stack, "rm", "train").returncode == 0
    freed = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert freed.returncode == 0, freed.stderr


def test_a_docker_context_pointing_at_the_shim_works(stack):
    with tempfile.TemporaryDirectory() as cfg:
        env = {"DOCKER_CONFIG": cfg}
        make = subprocess.run(
            [
                "docker",
                "context",
                "create",
                "gpu-alloc",
                "--docker",
                f"host=unix://{stack.shim_sock}",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=30,
        )
        assert make.returncode == 0, make.stderr
        out = subprocess.run(
            [
                "docker",
                "--context",
                "gpu-alloc",
                "run",
                "--rm",
                "--gpus",
                "1",
                IMAGE,
                "sh",
                "-c",
                cdi.seen(),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=60,
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in UUIDS


def test_interactive_exec_logs_and_stdin_pass_through_the_shim(stack):
    piped = shim(stack, "run", "-i", "--rm", IMAGE, "cat", input="through the shim\n")
    assert piped.stdout == "through the shim\n", piped.stderr
    assert (
        shim(
            stack, "run", "-d", "--name", "svc", IMAGE, "sh", "-c", "echo started; sleep 30"
        ).returncode
        == 0
    )
    execd = shim(stack, "exec", "-i", "svc", "cat", input="exec stdin\n")
    assert execd.stdout == "exec stdin\n", execd.stderr
    logs = shim(stack, "logs", "svc")
    assert logs.stdout == "started\n"


def test_the_python_sdk_gets_gpus_through_the_shim(stack):
    import docker

    client = docker.DockerClient(base_url=f"unix://{stack.shim_sock}")
    try:
        out = client.containers.run(
            IMAGE,
            ["sh", "-c", cdi.seen()],
            remove=True,
            device_requests=[docker.types.DeviceRequest(count=2, capabilities=[["gpu"]])],
        )
    finally:
        client.close()
    got = out.decode().strip().split(",")
    assert len(got) == 2 and set(got) <= set(UUIDS)


def test_the_sdk_nvidia_runtime_with_visible_devices_is_leased_too(stack):
    """The 001 article's way: runtime="nvidia" and NVIDIA_VISIBLE_DEVICES by index."""
    import docker

    client = docker.DockerClient(base_url=f"unix://{stack.shim_sock}")
    try:
        out = client.containers.run(
            IMAGE,
            ["printenv", "NVIDIA_VISIBLE_DEVICES"],
            runtime="nvidia",
            environment=["NVIDIA_VISIBLE_DEVICES=2"],
            remove=True,
        )
    finally:
        client.close()
    assert out.decode().strip() == UUIDS[2]


def test_compose_up_and_down_lease_and_free(stack, tmp_path):
    (tmp_path / "docker-compose.yml").write_text(f"""
version: "3.8"
services:
  trainer:
    image: {IMAGE}
    command: ["sleep", "60"]
    deploy:
      resources:
        reservations:
          devices:
            - driver: nvidia
              count: 2
              capabilities: [gpu]
""")
    up = engine.docker_compose(stack.shim_sock, tmp_path, "up", "-d", project_name="e2e")
    assert up.returncode == 0, up.stderr + stack.logs()
    assert status(stack)["free"] == 2
    down = engine.docker_compose(stack.shim_sock, tmp_path, "down", project_name="e2e")
    assert down.returncode == 0, down.stderr
    assert status(stack)["free"] == 4


def test_users_without_the_state_dir_read_status_through_the_shim(stack):
    made = shim(stack, "run", "-d", "--name", "seen", "--gpus", "1", IMAGE, "sleep", "30")
    assert made.returncode == 0, made.stderr
    from allocator.host import unixhttp

    code, body = unixhttp.request(stack.shim_sock, "GET", "/gpu-alloc/v1/status")
    assert code == 200
    snap = json.loads(body)
    assert snap["free"] == 3
    assert [g["holder"]["name"] for g in snap["gpus"] if not g["free"]] == ["seen"]


def test_a_gpu_that_disappears_is_reported_and_never_granted(stack):
    held = shim(stack, "run", "-d", "--name", "on-gpu3", "--gpus", '"device=3"', IMAGE,
                "sleep", "60")  # fmt: skip
    assert held.returncode == 0, held.stderr
    original = stack.gpus_file.read_text()
    engine.write_sim_gpus(stack.gpus_file, 3)  # GPU 3 falls off the bus
    try:
        table = subprocess.run(
            [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "status"],
            capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        assert f"warning: {UUIDS[3]} is held by container" in table
        assert "'on-gpu3'" in table and "no longer on this host" in table
        everything = visible(stack, "--gpus", "all")
        assert sorted(everything.stdout.strip().split(",")) == UUIDS[:3], everything.stderr
        gone = visible(stack, "--gpus", f"device={UUIDS[3]}")
        assert "is not a GPU on this host" in gone.stderr
    finally:
        stack.gpus_file.write_text(original)


def on_a_terminal(stack: engine.Stack, *args: str) -> str:
    """Run the docker CLI on a pseudo-terminal, as a person at a shell would."""
    import pty

    with tempfile.TemporaryDirectory(prefix="ga-tty-") as cfg:
        pid, fd = pty.fork()
        if pid == 0:  # pragma: no cover - the child execs
            os.execvpe("docker", ["docker", "-H", f"unix://{stack.shim_sock}", *args],
                       {**os.environ, "DOCKER_CONFIG": cfg})  # fmt: skip
        out = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.waitpid(pid, 0)
    return out.decode(errors="replace")


def test_run_it_and_exec_it_get_a_terminal_through_the_shim(stack):
    script = f"test -t 0 && echo tty-ok; {cdi.seen()}"
    out = on_a_terminal(stack, "run", "-it", "--rm", "--gpus", "1", IMAGE, "sh", "-c", script)
    assert "tty-ok" in out
    assert any(u in out for u in UUIDS), out
    assert shim(stack, "run", "-d", "--name", "box", IMAGE, "sleep", "30").returncode == 0
    assert "tty-ok" in on_a_terminal(stack, "exec", "-it", "box", "sh", "-c", script)
