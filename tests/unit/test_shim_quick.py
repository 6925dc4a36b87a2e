"""The shim's quick path: a request or response it frames with a few scans must be framed
the same by the full parse (llhttp and the chunk scanner), and whatever it is unsure of
goes to the full parse."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from shim import framing

CLI_GET = (
    b"GET /v1.41/containers/json HTTP/1.1\r\nHost: api.moby.localhost\r\n"
    b"User-Agent: Docker-Client/20.10.24+dfsg1 (linux)\r\n\r\n"
)
PING = (
    b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nCache-Control: no-cache, no-store, must-revalidate"
    b"\r\nDocker-Experimental: false\r\nOstype: linux\r\nPragma: no-cache\r\n"
    b"Server: Docker/20.10.24+dfsg1 (linux)\r\nDate: Tue, 01 Dec 2026 14:33:46 GMT\r\n"
    b"Content-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"
)
INSPECT = (
    b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\n"
    b"Server: Docker/20.10.24+dfsg1 (linux)\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'd\r\n{"Id":"abc"}\n\r\n0\r\n\r\n'
)


def full_request(data: bytes) -> tuple[str, str, framing._Framing, bool] | None:
    """What the full parse makes of a request head: None where it refuses it."""
    try:
        parser, head = framing._parse_request(data, len(data))
    except framing._BadMessage:
        return None
    if parser is None:
        return None
    return (
        parser.get_method().decode("latin-1"),
        head.url.decode("latin-1"),
        framing._Framing(head.headers),
        parser.should_keep_alive(),
    )


def full_response_ends_at_end(data: bytes) -> bool:
    """Whether the full parse frames `data` as one keep-alive response ending where it does."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    end += 4
    try:
        parser, head = framing._parse_response(data, end)
        if parser is None or parser.get_status_code() in framing._NO_BODY_STATUS:
            return False
        fr = framing._Framing(head.headers)
        if fr.length is None and not fr.chunked:
            return False
        body = framing._Body(parser, head, fr)
        pos = body.take(data, end)
    except (framing._BadMessage, ValueError):
        return False
    return body.done and pos == len(data) and framing._keep_alive(data, fr)


# --- requests ------------------------------------------------------------------------------

NAMES = [
    "Host", "User-Agent", "Content-Type", "X-Registry-Auth", "Content-Length",
    "content-LENGTH", "Transfer-Encoding", "Connection", "Expect", "Upgrade", "X Bad",
    "Bad:", "", "Accept",
]  # fmt: skip
HEADER_VALUES = [
    "docker", "0", "5", "chunked", "close", "keep-alive", "Upgrade", "100-continue", "tcp",
    " x ", "a\tb", "é", "\x7f", "a\rb", "a\nb", "",
]  # fmt: skip
VALUES = st.sampled_from(HEADER_VALUES)
METHODS = st.sampled_from(["GET", "HEAD", "POST", "DELETE", "get", "G ET", "PUT", ""])
REQUEST_TARGETS = [
    "/v1.41/_ping", "/containers/json?all=1", "/containers/a%2Fb/json", "*", "/a b", "/x\x00",
    "/é", "http://h/containers/json",
]  # fmt: skip
TARGETS = st.sampled_from(REQUEST_TARGETS)
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1"])
ENDINGS = st.sampled_from(["\r\n", "\n"])


@st.composite
def request_heads(draw: st.DrawFn) -> bytes:
    eol = draw(ENDINGS)
    lines = [f"{draw(METHODS)} {draw(TARGETS)} {draw(VERSIONS)}"]
    for name, value in draw(st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=5)):
        lines.append(f"{name}:{draw(st.sampled_from(['', ' ', ' ']))}{value}")
    return (eol.join(lines) + eol + eol).encode("utf-8")


@settings(max_examples=1000)
@given(request_heads())
@example(CLI_GET)
def test_a_quick_request_is_what_the_full_parse_reads_with_no_body(data: bytes) -> None:
    quick = framing.quick_request(data)
    if quick is None:
        return
    full = full_request(data)
    assert full is not None, "the quick path took a head the full parse refuses"
    method, target, fr, keep = full
    assert (method, target) == quick
    assert fr.length is None and not fr.chunked and not fr.close and not fr.upgrade
    assert keep


def test_the_docker_clients_everyday_get_takes_the_quick_path() -> None:
    assert framing.quick_request(CLI_GET) == ("GET", "/v1.41/containers/json")


def test_heads_that_may_carry_a_body_close_or_upgrade_take_the_full_parse() -> None:
    for header in (
        b"Content-Length: 0",
        b"transfer-encoding: chunked",
        b"Connection: close",
        b"Connection: Upgrade\r\nUpgrade: tcp",
        b"Expect: 100-continue",
    ):
        head = b"POST /v1.41/containers/x/attach HTTP/1.1\r\nHost: docker\r\n" + header
        assert framing.quick_request(head + b"\r\n\r\n") is None, header


def test_two_pipelined_heads_take_the_full_parse() -> None:
    assert framing.quick_request(CLI_GET + CLI_GET) is None
    assert framing.quick_request(CLI_GET[:-2]) is None


# --- responses -----------------------------------------------------------------------------


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    status = draw(st.sampled_from([200, 201, 204, 101, 304, 404, 500]))
    body = draw(st.sampled_from([b"", b"OK", b"{}\n", b"0\r\n\r\n", b"x" * 300]))
    headers = [b"Api-Version: 1.41", b"Content-Type: application/json"]
    framing_kind = draw(st.sampled_from(["length", "wrong length", "chunked", "both", "none"]))
    if framing_kind in ("length", "both"):
        headers.append(b"Content-Length: %d" % len(body))
    if framing_kind == "wrong length":
        headers.append(b"Content-Length: %d" % (len(body) + 1))
    if framing_kind in ("chunked", "both"):
        headers.append(b"Transfer-Encoding: chunked")
        cut = draw(st.integers(0, len(body)))
        parts = [p for p in (body[:cut], body[cut:]) if p]
        ext = draw(st.sampled_from([b"", b";x=1"]))
        body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in parts)
        body += draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0\r\n"]))
    if draw(st.booleans()):
        headers.append(draw(st.sampled_from([b"Connection: close", b"Connection: keep-alive"])))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
    data = b"%s %d X\r\n" % (version, status) + b"\r\n".join(headers) + b"\r\n\r\n" + body
    cut = draw(st.sampled_from([0, 0, 1, 5]))
    return data[: len(data) - cut] + draw(st.sampled_from([b"", b"", b"HTTP/1.1"]))


@settings(max_examples=500)
@given(responses())
@example(PING)
@example(INSPECT)
def test_a_quick_response_ends_exactly_where_the_full_parse_ends_it(data: bytes) -> None:
    if framing.quick_response(data):
        assert full_response_ends_at_end(data)


def test_the_engines_everyday_answers_take_the_quick_path() -> None:
    assert framing.quick_response(PING)
    assert framing.quick_response(INSPECT)


def test_a_response_not_whole_in_one_read_takes_the_full_parse() -> None:
    for data in (PING[:-1], INSPECT[:-2], INSPECT[:-7], PING + b"H", INSPECT + b"0"):
        assert not framing.quick_response(data)
    # the terminator's bytes inside a chunk's data do not end the body
    inner = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab\r\n0\r\n\r\n"
    assert not framing.quick_response(inner)
