"""The Engine client's own HTTP: the event stream (taken only when the Engine answers 200,
read line by line), the words of a call the Engine refused, and the POSTs (an update's
JSON body, a stop already done, a kill's signal)."""

from __future__ import annotations

import re
import socket
import threading

import pytest

from allocator.host.engine import Engine, EngineError


def read_request(conn: socket.socket) -> bytes:
    """One request, its head and as much body as its Content-Length says (a client may
    send the two in separate writes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    while length and len(body) < int(length.group(1)):
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def serve_recording(tmp_path, answer: bytes) -> tuple[str, list[bytes]]:
    """A unix socket that answers one request with ``answer`` and closes; the request it
    was sent, once it came, in the list returned."""
    path = str(tmp_path / "engine.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    got: list[bytes] = []

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            got.append(read_request(conn))
            conn.sendall(answer)
        server.close()

    threading.Thread(target=run, daemon=True).start()
    return path, got


def serve_once(tmp_path, answer: bytes) -> str:
    """A unix socket that answers one request with ``answer`` and closes."""
    return serve_recording(tmp_path, answer)[0]


def test_a_refused_stream_is_an_error_with_the_engines_words(tmp_path):
    body = b'{"message":"authorization denied by plugin x: no"}'
    head = b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(body)
    sock = serve_once(tmp_path, head + body)
    with pytest.raises(EngineError, match=r"GET /events failed: 403 .*authorization denied"):
        Engine(sock).events({"type": ["image"]})


def test_events_come_one_per_line_until_the_engine_goes_away(tmp_path):
    chunks = [b'{"Type":"image","Action":"tag"}\n', b"\n", b'{"Type":"image","Action":"untag"}\n']
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sock = serve_once(tmp_path, head + framed)
    got = Engine(sock).events({"type": ["image"]}, since=5)
    assert [e["Action"] for e in got] == ["tag", "untag"]


def test_a_get_answered_in_plain_text_says_that_text(tmp_path):
    body = b"Internal Server Error: the daemon is shutting down"
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % len(body)
    sock = serve_once(tmp_path, head + body)
    with pytest.raises(EngineError) as refused:
        Engine(sock).inspect("abc")
    assert str(refused.value).endswith(
        "failed: 500 Internal Server Error: the daemon is shutting down"
    )


# A destroy event as each Engine writes it: 29 (API 1.52 on) dropped the top-level id.
DESTROY_28 = (
    b'{"status":"destroy","id":"aa11","from":"busybox","Type":"container",'
    b'"Action":"destroy","Actor":{"ID":"aa11","Attributes":{"name":"x"}},"time":1}\n'
)
DESTROY_29 = (
    b'{"Type":"container","Action":"destroy","Actor":{"ID":"bb22",'
    b'"Attributes":{"image":"busybox","name":"y"}},"scope":"local","time":1}\n'
)


@pytest.mark.parametrize(("line", "cid"), [(DESTROY_28, "aa11"), (DESTROY_29, "bb22")])
def test_destroyed_containers_are_named_as_every_engine_writes_them(tmp_path, line, cid):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    sock = serve_once(tmp_path, head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
    assert list(Engine(sock).destroyed()) == [cid]


def test_a_quiet_stream_ends_at_once_when_aborted_from_another_thread(tmp_path):
    """How the shim's departures and image-event workers stop: dockerd keeps the stream
    open with nothing to say, and `abort` ends the reader blocked on it."""
    path = str(tmp_path / "engine.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    held: list[socket.socket] = []

    def run() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        held.append(conn)  # open, silent

    threading.Thread(target=run, daemon=True).start()
    stream = Engine(path).destroyed()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(stream))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive()  # blocked on the silent stream
    stream.abort()
    reader.join(5)
    assert not reader.is_alive() and got == []
    for conn in held:
        conn.close()
    server.close()


def test_an_update_posts_the_restart_policy_as_json(tmp_path):
    body = b'{"Warnings":[]}'
    sock, got = serve_recording(tmp_path, b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n" + body)
    Engine(sock).update("abc", {"RestartPolicy": {"Name": "no"}})
    head, _, sent = got[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /containers/abc/update HTTP/1.1")
    assert b"Content-Type: application/json" in head
    assert sent == b'{"RestartPolicy": {"Name": "no"}}'


def test_a_stop_of_a_container_already_stopped_is_no_error(tmp_path):
    sock, got = serve_recording(tmp_path, b"HTTP/1.1 304 Not Modified\r\n\r\n")
    Engine(sock).stop("abc", grace=3)
    assert got[0].startswith(b"POST /containers/abc/stop?t=3 HTTP/1.1")


def test_a_refused_stop_is_an_error_with_the_engines_words(tmp_path):
    body = b'{"message":"cannot stop container: permission denied"}'
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % len(body)
    sock, _ = serve_recording(tmp_path, head + body)
    with pytest.raises(EngineError, match=r"stop abc failed: 500 cannot stop container"):
        Engine(sock).stop("abc")


def test_a_kill_names_its_signal_quoted_and_one_to_a_stopped_container_is_an_error(tmp_path):
    sock, got = serve_recording(tmp_path, b"HTTP/1.1 204 No Content\r\n\r\n")
    Engine(sock).kill("abc", "SIGRTMIN+3")
    assert got[0].startswith(b"POST /containers/abc/kill?signal=SIGRTMIN%2B3 HTTP/1.1")
    body = b'{"message":"Container abc is not running"}'
    head = b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n" % len(body)
    (tmp_path / "again").mkdir()
    sock, _ = serve_recording(tmp_path / "again", head + body)
    with pytest.raises(EngineError, match=r"kill abc failed: 409 Container abc is not running"):
        Engine(sock).kill("abc", "SIGUSR1")
