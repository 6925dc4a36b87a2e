"""The Engine facts gpu-alloc relies on (docs: engine-facts.md), pinned on each Engine.

Run on every Engine of `make test` (20.10, 26, 28, 29).  The body-size rows are the ones
that matter most: the plugin can only judge a create whose body dockerd forwards to
it, so a create the plugin never sees must be denied (20.10, over 1 MiB) or never
executed (Debian's 26.1 and 28.5, and 29 from 29.3.1, over 4 MiB: CVE-2026-34040's fix).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading

import pytest

from tests.support import engine, engine_root

IMAGE = engine.BUSYBOX_TAG
MIB = 1 << 20
GPU_REQ = [{"Driver": "", "Count": 1, "Capabilities": [["gpu"]]}]

# The largest body each Engine forwards to an authorization plugin, and what it does
# with a larger one: "execute" (run it if allowed, body unseen) or "refuse" (500).
FORWARDS_UP_TO = {"20.10": 1 * MIB, "26": 4 * MIB, "28": 4 * MIB, "29": 4 * MIB}
LARGER = {"20.10": "execute", "26": "refuse", "28": "refuse", "29": "refuse"}
NO_BODY = "the Engine passed no request body to the authorization plugin"
TOO_LARGE = "request body too large for authorization plugin"


def this_engine() -> str:
    return engine_root.selected().name


def post(sock: str, target: str, body: bytes, content_type: str = "application/json"):
    """POST on a unix socket, raw; (status, parsed body).  A large body may be answered
    (and the connection closed) before it is all sent: the answer still counts."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(sock)
        # Send from a thread and read meanwhile: dockerd may answer and close before it
        # has read the whole body, and an unread answer would be lost to the reset.
        sender = threading.Thread(target=_send, args=(s, head + body), daemon=True)
        sender.start()
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
        sender.join(30)
    status_line, _, rest = data.partition(b"\r\n")
    payload = rest.partition(b"\r\n\r\n")[2]
    try:
        answer = json.loads(payload) if payload.strip() else {}
    except ValueError:
        answer = {"message": payload.decode(errors="replace")}
    return int(status_line.split()[1]), answer


def _send(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(data)


def create_body(size: int, gpus: bool) -> bytes:
    """A create body of about `size` bytes (a big label), asking for a GPU or not."""
    host_config = {"DeviceRequests": GPU_REQ} if gpus else {}
    spec = {"Image": IMAGE, "Cmd": ["true"], "HostConfig": host_config, "Labels": {"pad": ""}}
    base = len(json.dumps(spec))
    spec["Labels"]["pad"] = "x" * max(0, size - base)
    return json.dumps(spec).encode()


def names(sock: str) -> list[str]:
    api = engine.engine_api(sock)
    try:
        return [c["Id"] for c in api.containers(all=True)]
    finally:
        api.close()


def test_a_gpu_create_between_1_and_4_mib_without_a_lease_is_denied(stack):
    status, answer = post(stack.engine_sock, "/containers/create", create_body(2 * MIB, True))
    assert status == 403, answer
    assert "authorization denied by plugin" in answer["message"]
    if FORWARDS_UP_TO[this_engine()] > 2 * MIB:
        # The plugin saw the body and judged the GPU request itself.
        assert NO_BODY not in answer["message"] and "lease" in answer["message"], answer
    else:
        assert NO_BODY in answer["message"], answer
    assert names(stack.engine_sock) == []


def test_a_harmless_create_between_1_and_4_mib_is_judged_on_its_body(stack):
    status, answer = post(stack.engine_sock, "/containers/create", create_body(2 * MIB, False))
    if FORWARDS_UP_TO[this_engine()] > 2 * MIB:
        assert status == 201, answer
        assert names(stack.engine_sock) == [answer["Id"]]
    else:  # unseen, so denied: the plugin cannot judge a create it never saw
        assert status == 403 and NO_BODY in answer["message"], answer
        assert names(stack.engine_sock) == []


@pytest.mark.parametrize("gpus", [True, False], ids=["gpu", "no-gpu"])
def test_a_create_over_4_mib_never_creates_a_container(stack, gpus):
    status, answer = post(stack.engine_sock, "/containers/create", create_body(5 * MIB, gpus))
    if LARGER[this_engine()] == "refuse":
        assert status == 500 and TOO_LARGE in answer["message"], answer
    else:
        assert status == 403 and NO_BODY in answer["message"], answer
    assert names(stack.engine_sock) == []


def test_a_text_plain_create_is_a_400_on_the_bare_engine(bare_engine):
    body = json.dumps({"Image": IMAGE, "Cmd": ["true"]}).encode()
    status, answer = post(bare_engine.sock, "/containers/create", body, "text/plain")
    assert status == 400, answer
    assert names(bare_engine.sock) == []


def test_a_text_plain_gpu_create_is_denied_with_the_plugin(stack):
    body = create_body(1000, True)
    status, answer = post(stack.engine_sock, "/containers/create", body, "text/plain")
    assert status == 403 and NO_BODY in answer["message"], answer
    assert names(stack.engine_sock) == []


def test_a_json_charset_body_reaches_the_plugin(stack):
    body = create_body(1000, True)
    ctype = "application/json; charset=utf-8"
    status, answer = post(stack.engine_sock, "/containers/create", body, ctype)
    assert status == 403 and NO_BODY not in answer["message"], answer
    assert names(stack.engine_sock) == []


def test_a_cdi_gpu_device_on_the_real_socket_is_denied(stack):
    """What a CLI from 25 on sends for `--device nvidia.com/gpu=0` (a `cdi` device request):
    denied without a lease, whether or not the Engine would resolve it."""
    request = {"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0"]}
    spec = {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {"DeviceRequests": [request]}}
    status, answer = post(stack.engine_sock, "/containers/create", json.dumps(spec).encode())
    assert status == 403 and "authorization denied by plugin" in answer["message"], answer
    assert names(stack.engine_sock) == []
