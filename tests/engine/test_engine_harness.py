"""The private-Engine harness works, and shows the Engine behaviour gpu-alloc exists to fix."""

from __future__ import annotations

import base64
import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from tests.support import engine


def run(dockerd: engine.Dockerd, *args: str) -> str:
    result = engine.docker_cli(dockerd.sock, "run", "--rm", *args)
    assert result.returncode == 0, f"docker run {args}: {result.stderr}\n{dockerd.log_tail()}"
    return result.stdout


def test_busybox_container_runs_and_prints(bare_engine: engine.Dockerd) -> None:
    assert run(bare_engine, engine.BUSYBOX_TAG, "echo", "hello from busybox") == (
        "hello from busybox\n"
    )


def test_printenv_stand_in_reports_set_and_unset(bare_engine: engine.Dockerd) -> None:
    out = engine.docker_cli(
        bare_engine.sock, "run", "--rm", "-e", "A=1 2", engine.BUSYBOX_TAG,
        "sh", "-c", "printenv A; printenv NOPE; echo rc=$?",
    )  # fmt: skip
    assert out.stdout == "1 2\nrc=1\n", out.stderr


def test_gpus_count_is_always_index_zero(bare_engine: engine.Dockerd) -> None:
    # The fake hook makes dockerd register its nvidia driver; `Count: N` becomes 0..N-1,
    # so every `--gpus 1` container lands on GPU 0.
    assert (
        run(bare_engine, "--gpus", "1", engine.BUSYBOX_TAG, "printenv", "NVIDIA_VISIBLE_DEVICES")
        == "0\n"
    )
    assert (
        run(bare_engine, "--gpus", "2", engine.BUSYBOX_TAG, "printenv", "NVIDIA_VISIBLE_DEVICES")
        == "0,1\n"
    )


def test_nvidia_runtime_is_registered(bare_engine: engine.Dockerd) -> None:
    assert run(bare_engine, "--runtime", "nvidia", engine.BUSYBOX_TAG, "echo", "ok") == "ok\n"
    api = engine.engine_api(bare_engine.sock)
    try:
        assert "nvidia" in api.info()["Runtimes"]
    finally:
        api.close()


def test_device_request_visible_through_the_api(bare_engine: engine.Dockerd) -> None:
    api = engine.engine_api(bare_engine.sock)
    try:
        host_config = api.create_host_config(
            device_requests=[{"Driver": "", "Count": 1, "Capabilities": [["gpu"]]}]
        )
        cid = api.create_container(
            engine.BUSYBOX_TAG, ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"],
            host_config=host_config,
        )["Id"]  # fmt: skip
        try:
            api.start(cid)
            assert api.wait(cid, timeout=60)["StatusCode"] == 0
            assert api.logs(cid) == b"0\n"
            requests = api.inspect_container(cid)["HostConfig"]["DeviceRequests"]
            assert [r["Count"] for r in requests] == [1]
        finally:
            api.remove_container(cid, force=True)
    finally:
        api.close()


def test_two_engines_coexist(bare_engine: engine.Dockerd) -> None:
    with engine.Dockerd() as second:
        assert second.sock != bare_engine.sock
        assert engine.ping(second.sock) and engine.ping(bare_engine.sock)
        # Separate data-roots: the second engine has no images of its own.
        assert engine.docker_cli(second.sock, "images", "-q").stdout == ""
    assert engine.ping(bare_engine.sock)
    assert not second.dir.exists()


def test_compose_up_runs_a_service(bare_engine: engine.Dockerd, tmp_path) -> None:
    (tmp_path / "docker-compose.yml").write_text(
        "version: '3.8'\n"
        "services:\n"
        "  hello:\n"
        f"    image: {engine.BUSYBOX_TAG}\n"
        "    command: ['echo', 'composed']\n"
        "    network_mode: none\n"
    )
    try:
        up = engine.docker_compose(bare_engine.sock, tmp_path, "up", project_name="gahello")
        assert up.returncode == 0, up.stderr
        assert "composed" in up.stdout
    finally:
        engine.docker_compose(bare_engine.sock, tmp_path, "down", project_name="gahello")


class _AuthzHandler(BaseHTTPRequestHandler):
    """Allow everything except creates of containers labelled deny=yes."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/Plugin.Activate":
            answer = {"Implements": ["authz"]}
        else:
            request = base64.b64decode(body.get("RequestBody") or b"")
            denied = body.get("RequestUri", "").endswith("/containers/create") and (
                json.loads(request or b"{}").get("Labels", {}).get("deny") == "yes"
            )
            answer = {"Allow": not denied, "Msg": "denied by test plugin" if denied else ""}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:  # a unix socket has no client address
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def test_authz_plugin_spec_is_registered_and_consulted(tmp_path) -> None:
    server = _UnixHTTPServer(str(tmp_path / "p.sock"), _AuthzHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with engine.Dockerd(authz_plugin_socket=tmp_path / "p.sock") as dockerd:
            assert dockerd.spec_path.read_text() == f"unix://{tmp_path / 'p.sock'}\n"
            engine.import_busybox(dockerd.sock)
            assert run(dockerd, engine.BUSYBOX_TAG, "echo", "allowed") == "allowed\n"
            denied = engine.docker_cli(
                dockerd.sock, "run", "--rm", "--label", "deny=yes", engine.BUSYBOX_TAG, "true"
            )
            assert denied.returncode != 0
            assert "denied by test plugin" in denied.stderr
        assert not dockerd.spec_path.exists()
    finally:
        server.shutdown()
        server.server_close()


def test_dockerd_refuses_a_plugin_that_is_not_listening(tmp_path) -> None:
    dockerd = engine.Dockerd(authz_plugin_socket=tmp_path / "absent.sock")
    with pytest.raises(engine.EngineError, match="not listening"):
        dockerd.start()
    assert not dockerd.dir.exists()
    assert not dockerd.spec_path.exists()
