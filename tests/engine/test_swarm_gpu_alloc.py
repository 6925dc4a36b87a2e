"""A swarm whose every node runs gpu-alloc (tests/support/swarm.py with gpu_alloc=True).

Each node gives two fake GPUs to swarm (``swarm.gpus``, written into daemon.json by
`gpu-alloc swarm configure`, nvidia the default runtime) and keeps one for local leases.
Services are judged on the manager's two sockets; task containers never pass a worker's
plugin, so their GPUs are what swarm's scheduler reserved, recorded by the fake runtime.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import engine, engine_root, host_users, swarm
from tests.support.busybox_image import busybox_rootfs_tar
from tests.support.clients import docker_cli
from tests.support.swarm import SwarmLab

ALL_IMAGE = "gpu-alloc-test/cuda-like:latest"  # an image whose ENV asks for every GPU
# Non-root users with a limit of 2 GPUs each; root is exempt.
ANN, BEN = engine_root.host_user("gasvcann"), engine_root.host_user("gasvcben")
SWARM_ENV_IMAGE = "gpu-alloc-test/swarm-env:latest"  # its ENV sets swarm's own variable


def make_swarm_lab() -> SwarmLab:
    limits = {"users": {ANN: {"gpus": 2}, BEN: {"gpus": 2}}}
    return SwarmLab(nodes=2, gpus_per_node=2, gpu_alloc=True, local_gpus=1,
                    policy={"limits": limits})  # fmt: skip


def service(
    lab: SwarmLab,
    sock: str,
    name: str,
    *args: str,
    image: str = engine.BUSYBOX_TAG,
    user: str | None = None,
):
    """`docker service create` of a sleeping busybox on the host network (no overlay: see
    swarm.stack_file), stopped by SIGKILL; as ``user`` where given."""
    return docker_cli(
        sock, "service", "create", "-d", "--name", name, "--stop-signal", "KILL",
        "--no-resolve-image", "--network", "host", *args, image, "sleep", "600", user=user,
    )  # fmt: skip


@pytest.fixture
def clean(swarm_lab: SwarmLab):
    yield swarm_lab
    swarm_lab.clear()


def test_a_service_through_the_shim_is_pinned_and_its_tasks_get_only_their_reservation(
    clean: SwarmLab,
) -> None:
    done = service(clean, clean.shim(1), "train", "--replicas", "3", "--generic-resource", "gpu=1")
    assert done.returncode == 0, done.stderr
    runs = clean.task_runs("train", 3)
    assert len(runs) == 3, clean.runs()
    given = [(r.node, r.resource()) for r in runs]
    assert len(set(given)) == 3 and all(g in clean.swarm_gpus(n) for n, g in given), given
    assert all(r.env.get("NVIDIA_VISIBLE_DEVICES") == "void" for r in runs), runs


def test_a_service_without_a_reservation_whose_image_asks_for_all_gets_no_gpu(
    clean: SwarmLab,
) -> None:
    for i in clean.nodes:
        done = docker_cli(
            clean.sock(i), "import", "--change", "ENV NVIDIA_VISIBLE_DEVICES=all",
            "--change", 'CMD ["sh"]', "-", ALL_IMAGE, input=busybox_rootfs_tar(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    done = service(clean, clean.shim(1), "plain", "--replicas", "2", image=ALL_IMAGE)
    assert done.returncode == 0, done.stderr
    runs = clean.task_runs("plain", 2)
    assert len(runs) == 2
    pins = {"NVIDIA_VISIBLE_DEVICES": "void", "DOCKER_RESOURCE_GPU": "void"}
    assert all(r.env == pins for r in runs), runs


def test_an_image_whose_env_sets_the_swarm_variable_gets_only_the_reservation(
    clean: SwarmLab,
) -> None:
    """The toolkit reads DOCKER_RESOURCE_GPU before NVIDIA_VISIBLE_DEVICES, and dockerd
    merges the image's ENV under the spec's: the shim pins the swarm variable to void too,
    and swarm's own value, appended after the pin, is the one the toolkit reads."""
    for i in clean.nodes:
        done = docker_cli(
            clean.sock(i), "import", "--change", "ENV DOCKER_RESOURCE_GPU=all",
            "--change", 'CMD ["sh"]', "-", SWARM_ENV_IMAGE, input=busybox_rootfs_tar(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    done = service(clean, clean.shim(1), "free", "--replicas", "2", image=SWARM_ENV_IMAGE)
    assert done.returncode == 0, done.stderr
    runs = clean.task_runs("free", 2)
    assert len(runs) == 2 and all(r.resource() == "void" for r in runs), runs
    done = service(clean, clean.shim(1), "held", "--generic-resource", "gpu=1",
                   image=SWARM_ENV_IMAGE)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = clean.task_runs("held", 1)
    assert run.resource() in clean.swarm_gpus(run.node), run


FORBIDDEN = {
    "its own swarm variable": ["--env", f"DOCKER_RESOURCE_GPU={swarm.uuid(2, 0)}"],
    "every GPU by env": ["--env", "NVIDIA_VISIBLE_DEVICES=all"],
    "MIG control devices": ["--env", "NVIDIA_MIG_CONFIG_DEVICES=all"],
    "SYS_ADMIN": ["--cap-add", "SYS_ADMIN"],
    "SYS_TIME (outside the allow-list of powers)": ["--cap-add", "SYS_TIME"],
    "a sysctl of the host's": ["--sysctl", "vm.swappiness=1"],
    "the device directory": ["--mount", "type=bind,source=/dev,target=/hostdev"],
    "the Engine's state": ["--mount", "type=bind,source=/var/lib/docker,target=/d"],
}  # fmt: skip


@pytest.mark.parametrize("args", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_each_forbidden_service_spec_is_refused_on_both_sockets_of_the_manager(
    clean: SwarmLab, args: list[str]
) -> None:
    for sock in (clean.shim(1), clean.sock(1)):
        done = service(clean, sock, "bad", "--generic-resource", "gpu=1", *args)
        assert done.returncode != 0, (sock, done.stdout)
        assert "gpu-alloc refused the swarm service" in done.stderr, done.stderr
    assert clean.docker(1, "service", "ls", "-q").stdout.split() == []


def test_an_update_adding_a_forbidden_field_is_refused(clean: SwarmLab) -> None:
    done = service(clean, clean.shim(1), "upd", "--generic-resource", "gpu=1")
    assert done.returncode == 0, done.stderr
    for sock in (clean.shim(1), clean.sock(1)):
        bad = docker_cli(sock, "service", "update", "-d", "--cap-add", "SYS_ADMIN", "upd")
        assert bad.returncode != 0 and "SYS_ADMIN" in bad.stderr, bad.stderr
    ok = docker_cli(clean.shim(1), "service", "scale", "-d", "upd=2")
    assert ok.returncode == 0, ok.stderr


def test_a_service_the_real_socket_gets_without_the_pin_is_refused_with_the_fix(
    clean: SwarmLab,
) -> None:
    done = service(clean, clean.sock(1), "nopin", "--generic-resource", "gpu=1")
    assert done.returncode != 0
    assert "add --env NVIDIA_VISIBLE_DEVICES=void" in done.stderr, done.stderr
    half = service(clean, clean.sock(1), "half", "--generic-resource", "gpu=1",
                   "--env", "NVIDIA_VISIBLE_DEVICES=void")  # fmt: skip
    assert half.returncode != 0
    assert "add --env DOCKER_RESOURCE_GPU=void" in half.stderr, half.stderr
    pinned = service(clean, clean.sock(1), "pinned", "--generic-resource", "gpu=1",
                     "--env", "NVIDIA_VISIBLE_DEVICES=void",
                     "--env", "DOCKER_RESOURCE_GPU=void")  # fmt: skip
    # pinned, it still counts for no owner gpu-alloc can tell (swarm.engine_socket_services)
    assert pinned.returncode != 0
    assert "swarm.engine_socket_services: trusted" in pinned.stderr, pinned.stderr


def test_a_gpu_service_on_the_real_socket_is_refused_and_cannot_add_to_a_limit(
    clean: SwarmLab,
) -> None:
    """3 replicas on dockerd's socket, then more through the shim: never past the limit."""
    pins = ["--env", "NVIDIA_VISIBLE_DEVICES=void", "--env", "DOCKER_RESOURCE_GPU=void"]
    modes = (["--replicas", "3"], ["--replicas", "1"], ["--mode", "global"])
    for mode, reservation in zip(modes, ("gpu=1", "gpu=2", "gpu=1"), strict=True):
        done = service(clean, clean.sock(1), "real", *mode, "--generic-resource", reservation,
                       *pins)  # fmt: skip
        assert done.returncode != 0, done.stdout
        assert "counts for no owner gpu-alloc can tell" in done.stderr, done.stderr
    assert clean.docker(1, "service", "ls", "-q").stdout.split() == []
    plain = service(clean, clean.sock(1), "plain", *pins)  # no GPU: as before
    assert plain.returncode == 0, plain.stderr


LABEL_LEVELS = {
    "service label": ["--label", "io.gpu-alloc.owner=1001:someone"],
    "container label": ["--container-label", "io.gpu-alloc.lease=abc"],
    "volume label": ["--mount", "type=volume,dst=/v,volume-label=io.gpu-alloc.owner=x"],
}


@pytest.mark.parametrize("args", LABEL_LEVELS.values(), ids=LABEL_LEVELS.keys())
def test_gpu_allocs_labels_at_any_level_of_a_service_are_refused_on_the_real_socket(
    clean: SwarmLab, args: list[str]
) -> None:
    pins = ["--env", "NVIDIA_VISIBLE_DEVICES=void", "--env", "DOCKER_RESOURCE_GPU=void"]
    done = service(clean, clean.sock(1), "labelled", *pins, *args)
    assert done.returncode != 0, done.stdout
    assert "gpu-alloc refused the swarm service" in done.stderr, done.stderr
    assert "only gpu-alloc sets" in done.stderr or "are gpu-alloc's own" in done.stderr
    assert clean.docker(1, "service", "ls", "-q").stdout.split() == []


def test_gpu_allocs_labels_at_any_level_are_stripped_through_the_shim(clean: SwarmLab) -> None:
    args = [a for level in LABEL_LEVELS.values() for a in level]
    done = service(clean, clean.shim(1), "stripped", "--generic-resource", "gpu=1", *args)
    assert done.returncode == 0, done.stderr
    spec = clean.docker(1, "service", "inspect", "--format", "{{json .Spec}}", "stripped")
    assert "io.gpu-alloc.lease" not in spec.stdout and "someone" not in spec.stdout
    assert '"io.gpu-alloc.owner":"0:root"' in spec.stdout.replace(" ", ""), spec.stdout
    # its update on dockerd's own socket carries the shim's owner label: refused there
    upd = docker_cli(clean.sock(1), "service", "update", "-d", "--env-add", "A=1", "stripped")
    assert upd.returncode != 0 and "only gpu-alloc sets" in upd.stderr, upd.stderr
    ok = docker_cli(clean.shim(1), "service", "update", "-d", "--env-add", "A=1", "stripped")
    assert ok.returncode == 0, ok.stderr


def test_a_local_gpu_run_on_a_node_never_gets_a_swarm_gpu(clean: SwarmLab) -> None:
    first = docker_cli(
        clean.shim(2), "run", "-d", "--gpus", "1", engine.BUSYBOX_TAG, "sleep", "600"
    )
    assert first.returncode == 0, first.stderr
    local = swarm.uuid(2, 2)  # the one GPU node 2 keeps
    run = next(r for r in clean.runs() if r.container == first.stdout.strip())
    assert run.env.get("NVIDIA_VISIBLE_DEVICES") == local, run
    second = docker_cli(clean.shim(2), "run", "-d", "--gpus", "1", engine.BUSYBOX_TAG, "true")
    assert second.returncode != 0, "swarm's GPUs are free, but never leased locally"
    named = docker_cli(clean.shim(2), "run", "-d", "--gpus", f'"device={swarm.uuid(2, 0)}"',
                       engine.BUSYBOX_TAG, "true")  # fmt: skip
    assert named.returncode != 0 and "given to Docker Swarm" in named.stderr, named.stderr


def test_status_on_a_worker_shows_the_swarm_tasks_holding_their_gpus(clean: SwarmLab) -> None:
    done = service(clean, clean.shim(1), "hold", "--replicas", "4", "--generic-resource", "gpu=1")
    assert done.returncode == 0, done.stderr
    runs = [r for r in clean.task_runs("hold", 4) if r.node == 2]
    assert len(runs) == 2, clean.runs()
    status = engine.gpu_alloc(clean.stacks[2], "status")
    assert status.returncode == 0, status.stderr
    for r in runs:
        assert r.resource() in status.stdout
    assert status.stdout.count("hold.") >= 2 and "swarm task" in status.stdout, status.stdout
    assert "free: 1 of 3 GPUs (GPU 2)" in status.stdout, status.stdout
    assert "given to Docker Swarm (swarm.gpus), never leased here: GPU 0,1" in status.stdout


def test_doctor_accepts_nvidia_as_the_default_runtime_of_a_swarm_node(swarm_lab: SwarmLab) -> None:
    done = engine.gpu_alloc(swarm_lab.stacks[2], "doctor")
    assert "default runtime is 'nvidia'" not in done.stdout, done.stdout
    assert "default runtime nvidia" in done.stdout, done.stdout
    assert "swarm: 2 GPU(s) given to swarm as 'gpu'" in done.stdout, done.stdout


def test_stack_deploy_through_the_shim_runs_a_compose_file_with_generic_resources(
    clean: SwarmLab,
) -> None:
    path = swarm.stack_file(clean.dir, [("job", 2, 1)])
    done = docker_cli(clean.shim(1), "stack", "deploy", "--resolve-image", "never", "-c",
                      str(path), "st")  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = clean.task_runs("st_job", 2)
    given = {(r.node, r.resource()) for r in runs}
    assert len(given) == 2 and all(r.env.get("NVIDIA_VISIBLE_DEVICES") == "void" for r in runs)


@pytest.fixture
def users(clean: SwarmLab) -> Iterator[SwarmLab]:
    """ANN and BEN, who may reach the manager's shim socket (and no other)."""
    with host_users.present(ANN, BEN):
        host_users.open_lab_shim(clean)
        yield clean


def test_a_service_s_replicas_times_gpus_count_against_its_owner_s_limit(users: SwarmLab) -> None:
    shim = users.shim(1)
    done = service(users, shim, "ann", "--replicas", "2", "--generic-resource", "gpu=1", user=ANN)
    assert done.returncode == 0, done.stderr
    owner = users.docker(1, "service", "inspect", "--format",
                         '{{index .Spec.Labels "io.gpu-alloc.owner"}}', "ann")  # fmt: skip
    assert owner.stdout.strip().endswith(f":{ANN}"), owner.stdout
    more = docker_cli(shim, "service", "scale", "-d", "ann=3", user=ANN)
    assert more.returncode != 0, more.stdout
    assert f"{ANN} may hold 2 GPUs in swarm at once (policy.limits.users.{ANN})" in more.stderr
    assert "would make 3 (now 2)" in more.stderr, more.stderr
    ben = service(users, shim, "ben", "--replicas", "2", "--generic-resource", "gpu=1", user=BEN)
    assert ben.returncode == 0, ben.stderr
    fewer = docker_cli(shim, "service", "scale", "-d", "ann=1", user=ANN)
    assert fewer.returncode == 0, fewer.stderr


def test_a_service_binding_dockerds_socket_is_refused_on_both_sockets(clean: SwarmLab) -> None:
    """Its tasks would call dockerd where no plugin can tell who asks."""
    pins = ["--env", "NVIDIA_VISIBLE_DEVICES=void", "--env", "DOCKER_RESOURCE_GPU=void"]
    bind = ["--mount", f"type=bind,src={clean.sock(1)},dst=/var/run/docker.sock"]
    for sock in (clean.shim(1), clean.sock(1)):
        done = service(clean, sock, "sock", *pins, *bind)
        assert done.returncode != 0, done.stdout
        assert "gpu-alloc refused the swarm service" in done.stderr, done.stderr
    assert clean.docker(1, "service", "ls", "-q").stdout.split() == []
