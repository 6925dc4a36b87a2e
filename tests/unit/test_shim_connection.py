"""One shim connection with no socket (shim/connection.py): bytes and socket events in,
the actions the transport must take out, in order.

Each case is a script of what happens (the client's bytes, the Engine's, an EOF, an
upstream connection opened, the interceptor's answer) and the actions it must produce."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shim.actions import Action, Do
from shim.collect import Intercepted
from shim.connection import CONTINUE, Connection
from shim.framing import READ_AHEAD, Response
from shim.headlimit import MAX_REQUEST_HEAD
from shim.states import Req, Resp

GET = b"GET /v1.41/containers/json HTTP/1.1\r\nHost: d\r\n\r\n"
PING = b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"
CHUNKED_OK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n0\r\n\r\n"
PUT = b"PUT /containers/x/archive?path=/ HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n"
CREATE = b"POST /v1.41/containers/create?name=a HTTP/1.1\r\nHost: d\r\n"
ATTACH = (
    b"POST /containers/x/attach?stream=1&stdin=1 HTTP/1.1\r\nHost: d\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)
UPGRADED = (
    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class Status:
    """An answer in the Engine's error format with this status, closing the connection."""

    def __init__(self, code: int) -> None:
        self.code = code

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, bytes)
            and other.startswith(b"HTTP/1.1 %d " % self.code)
            and b"Connection: close\r\n" in other
            and b'{"message":' in other
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<error {self.code}>"


def creates(method: str, target: str) -> bool:
    return method == "POST" and target.split("?")[0].endswith("/containers/create")


def shown(action: Action) -> tuple[Any, ...]:
    """An action as the tables below write it."""
    do, arg = action
    if do in (Do.TO_ENGINE, Do.TO_CLIENT):
        return ("engine" if do is Do.TO_ENGINE else "client", bytes(arg))
    if do in (Do.PAUSE, Do.RESUME):
        return (do.value, arg.name)
    if isinstance(arg, Intercepted):
        return ("intercept", f"{arg.method} {arg.target}", arg.body, arg.keep)
    if isinstance(arg, Response):
        return ("settle", arg.status, arg.body)
    if isinstance(arg, Exception):
        return ("settle", type(arg).__name__)
    return (do.value,)


def run(
    script: list[tuple[Any, ...]],
    *,
    live: bool = True,
    max_body: int = 1 << 20,
    wants: Callable[[str, str], bool] = creates,
) -> tuple[Connection, list[tuple[Any, ...]]]:
    """Play `script` on a new connection (with an upstream open when `live`): the
    connection and its actions, a step's consecutive writes to one side joined."""
    conn = Connection(wants, max_body)
    if live:
        conn.engine_opened()
    out: list[tuple[Any, ...]] = []
    for step, *args in script:
        first = len(out)
        for action in getattr(conn, step)(*args):
            got = shown(action)
            if len(out) > first and got[0] in ("engine", "client") and out[-1][0] == got[0]:
                out[-1] = (got[0], out[-1][1] + got[1])
            else:
                out.append(got)
    return conn, out


def client(data: bytes) -> tuple[str, bytes]:
    return ("receive_client", data)


def engine(data: bytes) -> tuple[str, bytes]:
    return ("receive_engine", data)


CLIENT_EOF, ENGINE_EOF, OPENED = (
    ("receive_client_eof",),
    ("receive_engine_eof",),
    ("engine_opened",),
)

SPLICED = [
    pytest.param(
        [client(GET), engine(OK)],
        [("engine", GET), ("client", OK)],
        id="a request and its answer pass unchanged",
    ),
    pytest.param(
        [client(GET + PING), engine(OK), engine(CHUNKED_OK)],
        [("engine", GET), ("client", OK), ("engine", PING), ("client", CHUNKED_OK)],
        id="a pipelined request goes up once the answer before it ended",
    ),
    pytest.param(
        [client(GET[:10]), client(GET[10:]), engine(OK[:20]), engine(OK[20:-1]), engine(b"K")],
        [("engine", GET), ("client", OK[:-1]), ("client", b"K")],
        id="a head goes up whole, an answer streams as it comes",
    ),
    pytest.param(
        [client(PUT + b"5\r\nhello\r\n"), client(b"0\r\n\r"), client(b"\n" + PING), engine(OK)],
        [
            ("engine", PUT + b"5\r\nhello\r\n"),
            ("engine", b"0\r\n\r"),
            ("engine", b"\n"),
            ("client", OK),
            ("engine", PING),
        ],
        id="a chunked body streams up to its last chunk and no further",
    ),
    pytest.param(
        [client(GET), engine(CHUNKED_OK[:-3]), engine(CHUNKED_OK[-3:] + b"junk")],
        [("engine", GET), ("client", CHUNKED_OK[:-3]), ("client", CHUNKED_OK[-3:]), ("close",)],
        id="bytes after an answer end the connection",
    ),
    pytest.param(
        [
            client(b"HEAD /_ping HTTP/1.1\r\n\r\n"),
            engine(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"),
            client(PING),
            engine(OK),
        ],
        [
            ("engine", b"HEAD /_ping HTTP/1.1\r\n\r\n"),
            ("client", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"),
            ("engine", PING),
            ("client", OK),
        ],
        id="an answer to HEAD has no body whatever its length says",
    ),
    pytest.param(
        [
            client(b"HEAD /containers/c/archive?path=%2Ftmp HTTP/1.1\r\n\r\n"),
            engine(b"HTTP/1.1 200 OK\r\nX-Docker-Container-Path-Stat: e30=\r\n\r\n"),
            client(PUT + b"0\r\n\r\n"),
            engine(OK),
        ],
        [
            ("engine", b"HEAD /containers/c/archive?path=%2Ftmp HTTP/1.1\r\n\r\n"),
            ("client", b"HTTP/1.1 200 OK\r\nX-Docker-Container-Path-Stat: e30=\r\n\r\n"),
            ("engine", PUT + b"0\r\n\r\n"),
            ("client", OK),
        ],
        id="an answer to HEAD with no length keeps the connection, as docker cp reuses it",
    ),
    pytest.param(
        [
            client(b"HEAD /_ping HTTP/1.1\r\n\r\n"),
            engine(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"),
        ],
        [
            ("engine", b"HEAD /_ping HTTP/1.1\r\n\r\n"),
            ("client", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"),
            ("close",),
        ],
        id="an answer to HEAD that says close ends the connection",
    ),
    pytest.param(
        [client(GET), engine(b"HTTP/1.1 100 Continue\r\n\r\n"), engine(OK)],
        [("engine", GET), ("client", b"HTTP/1.1 100 Continue\r\n\r\n"), ("client", OK)],
        id="an interim answer is passed on and the final one follows",
    ),
    pytest.param(
        [client(GET), engine(b"HTTP/1.1 200 OK\r\n\r\nlog"), engine(b" lines"), ENGINE_EOF],
        [
            ("engine", GET),
            ("client", b"HTTP/1.1 200 OK\r\n\r\nlog"),
            ("client", b" lines"),
            ("close",),
        ],
        id="a body until close ends when the Engine closes",
    ),
    pytest.param(
        [client(b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"), engine(OK)],
        [("engine", b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"), ("client", OK), ("close",)],
        id="a client that does not keep the connection gets its answer, then the end",
    ),
    pytest.param(
        [client(GET), CLIENT_EOF, engine(OK)],
        [("engine", GET), ("eof to engine",), ("client", OK), ("close",)],
        id="a client half-close goes upstream and the answer still comes",
    ),
    pytest.param(
        [client(GET), ENGINE_EOF],
        [("engine", GET), ("client", Status(502)), ("close",)],
        id="an Engine that closes before answering is a 502",
    ),
    pytest.param(
        [client(GET), engine(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"), ENGINE_EOF],
        [
            ("engine", GET),
            ("client", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"),
            ("close",),
        ],
        id="an answer cut short ends the connection",
    ),
    pytest.param(
        [client(GET), engine(OK), ENGINE_EOF, client(PING), OPENED],
        [
            ("engine", GET),
            ("client", OK),
            ("drop",),
            ("pause", "CONNECT"),
            ("connect",),
            ("engine", PING),
            ("resume", "CONNECT"),
        ],
        id="an idle upstream the Engine closed is reopened for the next request",
    ),
    pytest.param(
        [engine(OK)],
        [("abort",)],
        id="bytes the Engine sends unasked end the connection",
    ),
    pytest.param(
        [client(GET), CLIENT_EOF, engine(OK), CLIENT_EOF],
        [("engine", GET), ("eof to engine",), ("client", OK), ("close",)],
        id="an idle client that half-closed is closed",
    ),
]


@pytest.mark.parametrize(("script", "actions"), SPLICED)
def test_a_spliced_exchange(script: list[tuple[Any, ...]], actions: list[tuple[Any, ...]]) -> None:
    assert run(script)[1] == actions


HIJACKS = [
    pytest.param(
        [
            client(ATTACH),
            engine(UPGRADED + b"hello "),
            client(b"GET / HTTP/1.1\r\n\r\nraw"),
            CLIENT_EOF,
            engine(b"bye"),
            ENGINE_EOF,
        ],
        [
            ("engine", ATTACH),
            ("client", UPGRADED + b"hello "),
            ("pipe",),
            ("engine", b"GET / HTTP/1.1\r\n\r\nraw"),
            ("eof to engine",),
            ("client", b"bye"),
            ("eof to client",),
            ("close",),
        ],
        id="an upgrade makes two raw pipes, half-closes passed on",
    ),
    pytest.param(
        [
            client(b"POST /containers/x/attach?stream=1 HTTP/1.1\r\n\r\n" + b"stdin"),
            engine(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\nout"
            ),
        ],
        [
            ("engine", b"POST /containers/x/attach?stream=1 HTTP/1.1\r\n\r\n"),
            (
                "client",
                b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\nout",
            ),
            ("pipe",),
            ("engine", b"stdin"),
        ],
        id="the legacy raw stream is a hijack and the held bytes go up raw",
    ),
    pytest.param(
        [client(ATTACH), engine(UPGRADED), ENGINE_EOF, CLIENT_EOF],
        [
            ("engine", ATTACH),
            ("client", UPGRADED),
            ("pipe",),
            ("eof to client",),
            ("eof to engine",),
            ("close",),
        ],
        id="a hijack ends once both sides have half-closed",
    ),
]


@pytest.mark.parametrize(("script", "actions"), HIJACKS)
def test_a_hijack(script: list[tuple[Any, ...]], actions: list[tuple[Any, ...]]) -> None:
    assert run(script)[1] == actions


def body(text: bytes, *, chunked: bool = False, expect: bool = False) -> bytes:
    head = CREATE + (b"Expect: 100-continue\r\n" if expect else b"")
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(text), text)
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(text), text)


WHOLE = ("intercept", "POST /v1.41/containers/create?name=a", b'{"Image":"x"}', True)
ANSWER = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"

INTERCEPTED = [
    pytest.param(
        [
            client(body(b'{"Image":"x"}', chunked=True)[:-9]),
            client(body(b'{"Image":"x"}', chunked=True)[-9:]),
        ],
        [WHOLE],
        id="a create is read whole, its chunks undone, and handed over",
    ),
    pytest.param(
        [client(body(b'{"Image":"x"}', expect=True))],
        [("client", CONTINUE), WHOLE],
        id="a create that expects 100-continue is told to go on",
    ),
    pytest.param(
        [client(body(b'{"Image":"x"}') + PING), ("answered", ANSWER, True), engine(OK)],
        [WHOLE, ("client", ANSWER), ("engine", PING), ("client", OK)],
        id="the requests after it wait for its answer",
    ),
    pytest.param(
        [client(body(b'{"Image":"x"}')), ("answered", ANSWER, False)],
        [WHOLE, ("client", ANSWER), ("close",)],
        id="an answer that ends the connection ends it",
    ),
    pytest.param(
        [client(body(b"x" * 101))],
        [("client", Status(413)), ("close",)],
        id="a body over the cap by its length is refused unread",
    ),
    pytest.param(
        [client(body(b"x" * 101, chunked=True))],
        [("client", Status(413)), ("close",)],
        id="a chunked body over the cap is refused",
    ),
    pytest.param(
        [client(body(b"{}")), CLIENT_EOF, ("answered", ANSWER, True)],
        [
            ("intercept", "POST /v1.41/containers/create?name=a", b"{}", True),
            ("gone",),
            ("client", ANSWER),
            ("close",),
        ],
        id="a client that leaves while its create is handled is told gone",
    ),
]


@pytest.mark.parametrize(("script", "actions"), INTERCEPTED)
def test_an_intercepted_request(
    script: list[tuple[Any, ...]], actions: list[tuple[Any, ...]]
) -> None:
    assert run(script, max_body=100)[1] == actions


def attaches(method: str, target: str) -> bool:
    return "/attach" in target


MARKED = ATTACH.replace(b"Upgrade: tcp\r\n", b"Upgrade: tcp\r\nX-Gpu-Alloc-Asker: ann 0f\r\n")
HELD = ("intercept", "POST /containers/x/attach?stream=1&stdin=1", b"", True)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"

PASSED_ON = [
    pytest.param(
        [client(ATTACH + b"typed"), ("passed_on", MARKED, False, True), engine(UPGRADED + b"out")],
        [HELD, ("engine", MARKED), ("client", UPGRADED + b"out"), ("pipe",), ("engine", b"typed")],
        id="a request passed on is hijacked as a spliced one, the bytes held sent after it",
    ),
    pytest.param(
        [
            client(ATTACH),
            ("passed_on", MARKED, False, True),
            engine(UPGRADED),
            client(b"in"),
            engine(b"out"),
        ],
        [
            HELD,
            ("engine", MARKED),
            ("client", UPGRADED),
            ("pipe",),
            ("engine", b"in"),
            ("client", b"out"),
        ],
        id="then both sides are raw pipes",
    ),
    pytest.param(
        [client(ATTACH + PING), ("passed_on", MARKED, False, True), engine(NOT_FOUND), engine(OK)],
        [HELD, ("engine", MARKED), ("client", NOT_FOUND), ("engine", PING), ("client", OK)],
        id="an answer that is no hijack ends the exchange and the next request goes up",
    ),
    pytest.param(
        [client(ATTACH), CLIENT_EOF, ("passed_on", MARKED, False, True), engine(UPGRADED)],
        [HELD, ("gone",), ("engine", MARKED), ("client", UPGRADED), ("pipe",), ("eof to engine",)],
        id="a client that half-closed meanwhile has its EOF passed on once hijacked",
    ),
]


@pytest.mark.parametrize(("script", "actions"), PASSED_ON)
def test_a_request_the_interceptor_passes_on(
    script: list[tuple[Any, ...]], actions: list[tuple[Any, ...]]
) -> None:
    assert run(script, wants=attaches)[1] == actions


def test_a_request_passed_on_once_the_client_is_gone_sends_nothing() -> None:
    conn, _ = run([client(ATTACH)], wants=attaches)
    conn.close()
    assert conn.passed_on(MARKED, False, True) == []


REFUSED = [
    pytest.param(H2_PREFACE, 400, id="HTTP/2 prior knowledge"),
    pytest.param(
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, id="two lengths"
    ),
    pytest.param(PUT + b"zz\r\nhello\r\n", 400, id="a bad chunk size"),
    pytest.param(
        b"GET /" + b"a" * MAX_REQUEST_HEAD + b" HTTP/1.1\r\n\r\n",
        431,
        id="a head over dockerd's limit",
    ),
]


@pytest.mark.parametrize(("data", "status"), REFUSED)
def test_what_is_not_http_1_1_is_answered_in_the_engines_format_and_never_reaches_it(
    data: bytes, status: int
) -> None:
    _, out = run([client(data)])
    assert out == [("client", Status(status)), ("close",)]


def test_a_request_with_no_upstream_waits_for_one_and_reading_pauses() -> None:
    conn, out = run([client(GET)], live=False)
    assert out == [("pause", "CONNECT"), ("connect",)]
    assert conn.req.state is Req.CONNECTING
    assert [shown(a) for a in conn.engine_opened()] == [("engine", GET), ("resume", "CONNECT")]
    conn, _ = run([client(GET)], live=False)
    assert [shown(a) for a in conn.engine_failed("no Engine")] == [
        ("client", Status(502)),
        ("close",),
    ]


def test_an_interceptor_that_cannot_say_what_it_wants_is_a_500() -> None:
    def broken(method: str, target: str) -> bool:
        raise RuntimeError("boom")

    conn = Connection(broken)
    assert [shown(a) for a in conn.receive_client(GET)] == [("client", Status(500)), ("close",)]


def test_bytes_held_past_read_ahead_pause_reading_until_the_answer() -> None:
    conn, out = run([client(GET), client(PING * (READ_AHEAD // len(PING) + 1))])
    assert out == [("engine", GET), ("pause", "AHEAD")]
    after = [shown(a) for a in conn.receive_engine(OK)]
    assert after[:2] == [("client", OK), ("resume", "AHEAD")]
    assert after[2] == ("engine", PING)


FORWARDED = [
    pytest.param(
        [
            engine(b'HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"I"\r\n'),
            engine(b"0\r\n\r\n"),
        ],
        [("engine", b"RAW"), ("settle", 201, b'{"I"')],
        id="an answer read whole",
    ),
    pytest.param(
        [engine(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")],
        [("engine", b"RAW"), ("drop",), ("settle", 201, b"{}")],
        id="an answer that ends the connection drops it",
    ),
    pytest.param(
        [engine(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")],
        [("engine", b"RAW"), ("settle", 204, b"")],
        id="an interim answer is skipped",
    ),
    pytest.param(
        [engine(b"HTTP/1.1 201 Created\r\n"), ENGINE_EOF],
        [("engine", b"RAW"), ("settle", "Closed")],
        id="the Engine closing before answering",
    ),
    pytest.param(
        [engine(b"HTTP/1.1 500 Oops\r\n\r\nuntil"), engine(b" close"), ENGINE_EOF],
        [("engine", b"RAW"), ("drop",), ("settle", 500, b"until close")],
        id="an answer until close",
    ),
    pytest.param(
        [engine(UPGRADED)],
        [("engine", b"RAW"), ("settle", "BadMessage")],
        id="an upgrade is refused",
    ),
]


@pytest.mark.parametrize(("script", "actions"), FORWARDED)
def test_forwards_answer(script: list[tuple[Any, ...]], actions: list[tuple[Any, ...]]) -> None:
    conn, out = run([client(body(b"{}")), ("forward", b"RAW", False), *script])
    assert out[1:] == actions
    assert conn.resp.state is Resp.COLLECTING
    assert [shown(a) for a in conn.forward_ended(failed=False)] == []
    assert conn.resp.state is Resp.IDLE
    assert [shown(a) for a in conn.forward_ended(failed=True)] == [("drop",)]


ANSWERS = [
    OK,
    CHUNKED_OK,
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([GET, PING, PUT + b"3\r\nabc\r\n0\r\n\r\n"]), min_size=1, max_size=4),
    st.data(),
)
def test_whatever_the_reads_the_bytes_pass_unchanged(
    requests: list[bytes], data: st.DataObject
) -> None:
    """Pipelined requests and their answers, cut into arbitrary reads: the Engine gets the
    requests' bytes and the client the answers', each unchanged and in order."""
    answers = [data.draw(st.sampled_from(ANSWERS)) for _ in requests]
    conn = Connection(creates)
    conn.engine_opened()
    sent, heard = b"", b""
    wire = b"".join(requests)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(wire) - 1), max_size=5)))
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        sent += b"".join(bytes(x) for do, x in conn.receive_client(wire[a:b]) if do is Do.TO_ENGINE)
    for one in answers:
        cut = data.draw(st.integers(1, len(one)))
        for part in (one[:cut], one[cut:]):
            for do, x in conn.receive_engine(part):
                if do is Do.TO_ENGINE:
                    sent += bytes(x)
                else:
                    assert do is Do.TO_CLIENT
                    heard += bytes(x)
    assert (sent, heard) == (wire, b"".join(answers))
    assert (conn.req.state, conn.resp.state) == (Req.IDLE, Resp.IDLE)
