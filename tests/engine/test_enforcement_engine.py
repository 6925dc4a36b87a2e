"""Enforcement against the real dockerd: raw requests on the real socket, adoption, start-up.

Raw HTTP, not the docker CLI: attackers write bodies the CLI never would, and
each test checks the Engine really did not act (no container appeared).
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess

import pytest
import yaml

from allocator.host.ledger import Ledger
from tests.conftest import require_engine
from tests.support import engine
from tests.support.engine import gpu_alloc

IMAGE = engine.BUSYBOX_TAG


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("docker", timeout=60)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def raw(sock: str, method: str, target: str, body: bytes | None = None) -> tuple[int, dict]:
    conn = UnixHTTP(sock)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, target, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(data) if data.strip() else {}
    except ValueError:  # API versions before 1.24 answer errors as plain text
        return resp.status, {"message": data.decode()}


def containers(stack: engine.Stack) -> list[str]:
    return [c["Id"] for c in engine.engine_api(stack.engine_sock).containers(all=True)]


GPU_REQ = '[{"Driver":"","Count":1,"Capabilities":[["gpu"]]}]'
RAW_CREATES = {
    "lower-case hostconfig": f'{{"Image":"{IMAGE}","hostconfig":{{"DeviceRequests":{GPU_REQ}}}}}',
    "repeated HostConfig": f'{{"Image":"{IMAGE}","HostConfig":{{}},'
    f'"HostConfig":{{"DeviceRequests":{GPU_REQ}}}}}',
    "top-level DeviceRequests": f'{{"Image":"{IMAGE}","DeviceRequests":{GPU_REQ}}}',
    "privileged": f'{{"Image":"{IMAGE}","HostConfig":{{"Privileged":true}}}}',
    "nvidia cgroup rule": f'{{"Image":"{IMAGE}","HostConfig":{{"DeviceCgroupRules":'
    '["c 195:* rwm"]}}',
    "bind mount of /dev": f'{{"Image":"{IMAGE}","HostConfig":{{"Binds":["/dev:/hostdev"]}}}}',
    "nvidia runtime, image env": f'{{"Image":"{IMAGE}","HostConfig":{{"Runtime":"nvidia"}}}}',
    "count via nvidia driver": f'{{"Image":"{IMAGE}","HostConfig":{{"DeviceRequests":'
    '[{"Driver":"nvidia","Count":-1}]}}',
    # dockerd writes the alias's ALIAS_NAME=... at start, before Config.Env: the first
    # alias's NVIDIA_VISIBLE_DEVICES=ALL,... outlives the bare name that unsets the second
    "link aliases that make the env": f'{{"Image":"{IMAGE}","Env":["NVIDIA_VISIBLE_DEVICES=void",'
    '"NVIDIA_VISIBLE_DEVICES"],"HostConfig":{"Runtime":"nvidia","Links":'
    '["child:NVIDIA_VISIBLE_DEVICES=all,a","child:NVIDIA_VISIBLE_DEVICES=all,b"]}}',
}


@pytest.mark.parametrize("payload", RAW_CREATES.values(), ids=RAW_CREATES.keys())
@pytest.mark.parametrize(
    "target",
    [
        "/v1.41/containers/create",
        "/containers/create",
        "/v1.41/containers%2Fcreate",
        "/v1.41/containers/%63reate",
    ],
)
def test_raw_gpu_creates_on_the_real_socket_are_denied(stack, payload, target):
    status, answer = raw(stack.engine_sock, "POST", target, payload.encode())
    assert status == 403, answer
    assert "authorization denied by plugin" in answer["message"]
    assert containers(stack) == []


def test_a_pre_1_24_start_with_a_hostconfig_is_denied(stack):
    status, made = raw(
        stack.engine_sock,
        "POST",
        "/v1.41/containers/create",
        json.dumps({"Image": IMAGE, "Cmd": ["true"]}).encode(),
    )
    assert status == 201, made
    body = json.dumps({"Privileged": True, "DeviceRequests": json.loads(GPU_REQ)}).encode()
    status, answer = raw(stack.engine_sock, "POST", f"/v1.23/containers/{made['Id']}/start", body)
    assert status == 403
    assert "1.24" in answer["message"]
    info = engine.engine_api(stack.engine_sock).inspect_container(made["Id"])
    assert info["State"]["Running"] is False
    assert not info["HostConfig"]["Privileged"]


def test_update_and_exec_cannot_widen_device_access(stack):
    assert (
        engine.docker_cli(
            stack.engine_sock, "run", "-d", "--name", "worker", IMAGE, "sleep", "30"
        ).returncode
        == 0
    )
    status, answer = raw(
        stack.engine_sock,
        "POST",
        "/v1.41/containers/worker/update",
        b'{"DeviceCgroupRules":["c 195:* rwm"]}',
    )
    assert status == 403 and "DeviceCgroupRules" in answer["message"]
    status, answer = raw(
        stack.engine_sock,
        "POST",
        "/v1.41/containers/worker/exec",
        b'{"Cmd":["true"],"Privileged":true}',
    )
    assert status == 403 and "Privileged" in answer["message"]


def test_a_lease_label_replayed_from_inspect_is_denied_and_shows_no_token(stack):
    made = engine.docker_cli(stack.shim_sock, "create", "--gpus", "1", IMAGE, "true")
    assert made.returncode == 0, made.stderr
    info = engine.engine_api(stack.engine_sock).inspect_container(made.stdout.strip())
    copy = {
        "Image": IMAGE,
        "Env": [e for e in info["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")],
        "Labels": info["Config"]["Labels"],
        "HostConfig": {"DeviceRequests": info["HostConfig"]["DeviceRequests"]},
    }
    before = containers(stack)
    status, answer = raw(
        stack.engine_sock, "POST", "/v1.41/containers/create", json.dumps(copy).encode()
    )
    assert status == 403
    assert "without a gpu-alloc lease" in answer["message"]
    assert containers(stack) == before
    # The token went to the plugin in a request header: the label is the lease id alone.
    lease_id = info["Config"]["Labels"]["io.gpu-alloc.lease"]
    assert lease_id in Ledger(stack.state_dir).read().leases
    assert "." not in lease_id
    # Through the shim, the copied label is stripped and a fresh lease is made instead.
    again = engine.docker_cli(
        stack.shim_sock,
        "create",
        "--label",
        f"io.gpu-alloc.lease={info['Config']['Labels']['io.gpu-alloc.lease']}",
        "--gpus",
        "1",
        IMAGE,
        "true",
    )
    assert again.returncode == 0, again.stderr
    label = engine.engine_api(stack.engine_sock).inspect_container(again.stdout.strip())["Config"][
        "Labels"
    ]["io.gpu-alloc.lease"]
    assert label != info["Config"]["Labels"]["io.gpu-alloc.lease"]


def test_containers_made_before_gpu_alloc_are_adopted_as_claims(tmp_path_factory):
    """Containers that took GPUs without gpu-alloc hold them; unpinned ones hold them all."""
    require_engine()
    s = engine.Stack(gpus=4)
    pre = engine.Dockerd(s.engine_dir).start()
    try:
        engine.import_busybox(pre.sock)
        for args in (
            ("--name", "pinned", "--gpus", f"device={engine.sim_gpu_uuid(2)}"),
            (
                "--name",
                "plain",
            ),
        ):
            made = engine.docker_cli(pre.sock, "create", *args, IMAGE, "true")
            assert made.returncode == 0, made.stderr
    finally:
        pre.stop(remove=False)
    s.start()
    try:
        snap = json.loads(gpu_alloc(s, "status", "--json").stdout)
        held = {g["uuid"]: g["holder"] for g in snap["gpus"] if not g["free"]}
        assert list(held) == [engine.sim_gpu_uuid(2)]
        assert held[engine.sim_gpu_uuid(2)]["name"] == "pinned"
        assert "DeviceIDs" in held[engine.sim_gpu_uuid(2)]["why"]
        (row,) = snap["holders"]
        assert row["since"].endswith("Z") and row["age_s"] >= 0  # since its creation
        # The adopted GPU is not granted again.
        out = engine.docker_cli(s.shim_sock, "run", "--rm", "--gpus", "4", IMAGE, "true")
        assert out.returncode != 0 and "pinned" in out.stderr
        # An unpinned old-style claim (Count 1 on a daemon without gpu-alloc) holds everything.
        engine.docker_cli(s.engine_sock, "rm", "pinned")
    finally:
        s.stop()


def test_an_unpinned_adopted_claim_holds_every_gpu():
    require_engine()
    s = engine.Stack(gpus=2)
    pre = engine.Dockerd(s.engine_dir).start()
    try:
        engine.import_busybox(pre.sock)
        made = engine.docker_cli(pre.sock, "create", "--name", "old", "--gpus", "1", IMAGE, "true")
        assert made.returncode == 0, made.stderr
    finally:
        pre.stop(remove=False)
    s.start()
    try:
        status = gpu_alloc(s, "status")
        holder = next(line for line in status.stdout.splitlines() if "old (adopted)" in line)
        assert holder.startswith("0,1 ") and "unknown" in holder, status.stdout
        assert "GPU 0,1 'old': HostConfig.DeviceRequests[0]: Count 1" in status.stdout
        refused = engine.docker_cli(s.shim_sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
        assert "0 of 2 free" in refused.stderr
        assert engine.docker_cli(s.engine_sock, "rm", "old").returncode == 0
        ok = engine.docker_cli(s.shim_sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
        assert ok.returncode == 0, ok.stderr
    finally:
        s.stop()


def test_the_shim_refuses_to_start_when_nvidia_is_the_default_runtime(tmp_path):
    require_engine()
    d = engine.Dockerd(extra_args=["--default-runtime", "nvidia"]).start()
    try:
        engine.write_sim_gpus(tmp_path / "gpus.yaml", 1)
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({
            "engine": {"socket": d.sock}, "shim": {"socket": str(tmp_path / "s.sock")},
            "state_dir": str(tmp_path / "state"), "gpus": str(tmp_path / "gpus.yaml"),
        }))  # fmt: skip
        out = subprocess.run(
            [*engine.gpu_alloc_command(), "--config", str(cfg), "shim"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        d.stop()
    assert out.returncode == 1
    assert "default runtime is 'nvidia'" in out.stderr
    assert 'Remove "default-runtime"' in out.stderr


def test_volumes_from_a_container_that_binds_dev_is_denied():
    """--volumes-from copies binds: one of /dev (made before gpu-alloc) must not spread."""
    require_engine()
    s = engine.Stack(gpus=2)
    pre = engine.Dockerd(s.engine_dir).start()
    try:
        engine.import_busybox(pre.sock)
        for name, bind in (("devbox", "/dev:/hostdev"), ("databox", "/srv:/data")):
            made = engine.docker_cli(pre.sock, "create", "--name", name, "-v", bind, IMAGE, "true")
            assert made.returncode == 0, made.stderr
    finally:
        pre.stop(remove=False)
    s.start()
    try:
        for sock in (s.shim_sock, s.engine_sock):
            bad = engine.docker_cli(sock, "create", "--volumes-from", "devbox", IMAGE, "true")
            assert bad.returncode != 0
            assert "HostConfig.VolumesFrom[0]: bind mount of /dev exposes /dev" in bad.stderr
            ok = engine.docker_cli(sock, "create", "--volumes-from", "databox", IMAGE, "true")
            assert ok.returncode == 0, ok.stderr
    finally:
        s.stop()
