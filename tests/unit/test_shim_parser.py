"""The shim's one parser (llhttp, shim/parser.py): where each message ends, whatever the
reads, and what it refuses.

The splice forwards raw bytes, so the parser must stop each feed exactly where llhttp ends
a message: a head at its blank line, a body after its length or after the CRLF CRLF that
ends its last chunk.  These tests frame streams of messages the way shim/connection.py does,
once whole and once cut into arbitrary reads, and hold the two to the same answer."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shim.framing import MAX_HEAD, BadMessage
from shim.headlimit import HeadTooLarge, request_head_end, response_head_end
from shim.parser import Parser

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
CHUNKED_PUT = (
    b"PUT /containers/x/archive?path=/ HTTP/1.1\r\nHost: d\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
)

Framed = tuple[bytes, int, int, bytes]  # method or status, where the message ended, body


def frame(data: bytes, cuts: list[int], *, response: bool = False) -> list[Framed] | str:
    """Every whole message in `data` as the splice frames it, the bytes arriving in reads
    split at `cuts`: (method or status, offset just past its end, its body); or why the
    parser refused the stream."""
    parser = Parser(response=response)
    reads = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    buf, done, out, in_body = b"", 0, [], False
    try:
        for read in reads:
            buf += read
            while buf:
                if not in_body:
                    end = _head_end(buf, response)
                    if not end:
                        break
                    if not parser.head(buf, end):
                        buf, done = buf[end:], done + end
                        continue
                    if parser.upgraded:
                        return [*out, (_name(parser), done + end, 0, b"")]  # then raw bytes
                    parser.parts = []
                    buf, done, in_body = buf[end:], done + end, True
                pos = parser.body(buf, 0)
                buf, done = buf[pos:], done + pos
                if not parser.done:
                    break
                assert parser.parts is not None
                out.append((_name(parser), done, parser.status, b"".join(parser.parts)))
                in_body = False
    except (BadMessage, HeadTooLarge) as e:
        return f"refused: {e}"
    return out


def _head_end(buf: bytes, response: bool) -> int:
    if not response:
        return request_head_end(buf)
    end = buf.find(b"\r\n\r\n")
    return end + 4 if end >= 0 else 0


def _name(parser: Parser) -> bytes:
    return parser.method if not parser.response else b"%d" % parser.status


# --- requests ------------------------------------------------------------------------------

NAMES = [
    "Host", "User-Agent", "Content-Type", "Content-Length", "content-LENGTH",
    "Transfer-Encoding", "Connection", "Expect", "Upgrade", "X Bad", "Bad:", "", "Accept",
]  # fmt: skip
HEADER_VALUES = [
    "docker", "0", "5", "chunked", "close", "keep-alive", "Upgrade", "100-continue", "tcp",
    " x ", "a\tb", "é", "\x7f", "a\rb", "", "gzip, chunked", "+5",
]  # fmt: skip
METHODS = st.sampled_from(["GET", "HEAD", "POST", "DELETE", "get", "G ET", "PUT", ""])
TARGETS = st.sampled_from(["/v1.41/_ping", "/containers/json?all=1", "*", "/a b", "/é"])
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1"])
BODIES = st.sampled_from([b"", b"hello", b"0\r\n\r\n", b"\r\n\r\nGET / HTTP/1.1\r\n\r\n"])


def chunked(body: bytes, cut: int, ext: bytes, ending: bytes) -> bytes:
    parts = [p for p in (body[:cut], body[cut:]) if p]
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in parts) + ending


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    eol = draw(st.sampled_from(["\r\n", "\n"]))
    lines = [f"{draw(METHODS)} {draw(TARGETS)} {draw(VERSIONS)}"]
    values = st.sampled_from(HEADER_VALUES)
    for name, value in draw(st.lists(st.tuples(st.sampled_from(NAMES), values), max_size=4)):
        lines.append(f"{name}:{draw(st.sampled_from(['', ' ']))}{value}")
    body = draw(BODIES)
    kind = draw(st.sampled_from(["none", "length", "wrong length", "chunked"]))
    if kind in ("length", "wrong length"):
        lines.append(f"Content-Length: {len(body) + (kind == 'wrong length')}")
    if kind == "chunked":
        lines.append("Transfer-Encoding: chunked")
        ext = draw(st.sampled_from([b"", b";x=1"]))
        end = draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0\r\n\r\r\n"]))
        body = chunked(body, draw(st.integers(0, len(body))), ext, end)
    return (eol.join(lines) + eol + eol).encode() + body


@st.composite
def request_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    data = b"".join(draw(st.lists(requests(), min_size=1, max_size=3)))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=6))))
    return data, [c for c in cuts if c < len(data)]


@settings(max_examples=600)
@given(request_streams())
@example((CLI_GET + CHUNKED_PUT + CLI_GET, [1, 60, 150, 151, 152]))
def test_requests_end_where_they_end_however_the_bytes_are_read(
    stream: tuple[bytes, list[int]],
) -> None:
    data, cuts = stream
    whole = frame(data, [])
    assert frame(data, cuts) == whole
    assert frame(data, list(range(1, len(data)))) == whole  # one byte a read


def test_a_chunked_body_ends_after_its_last_chunk_not_at_a_blank_line_inside_it() -> None:
    body = b"a\r\n\r\n\r\nb"
    put = CHUNKED_PUT.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n" + chunked(body, 3, b"", b"0\r\n\r\n")
    framed = frame(put + CLI_GET, [])
    assert framed == [(b"PUT", len(put), 0, body), (b"GET", len(put) + len(CLI_GET), 0, b"")]


def test_pipelined_requests_are_framed_one_by_one_with_their_bodies() -> None:
    data = CLI_GET + CHUNKED_PUT + CLI_GET
    put_end = len(CLI_GET) + len(CHUNKED_PUT)
    for cut in range(put_end - 4, put_end + 1):  # the last CRLF CRLF split across two reads
        assert frame(data, [cut]) == frame(data, []), cut
    assert frame(data, []) == [
        (b"GET", len(CLI_GET), 0, b""),
        (b"PUT", len(CLI_GET) + len(CHUNKED_PUT), 0, b"hello world"),
        (b"GET", len(data), 0, b""),
    ]


def test_an_upgrade_request_stops_the_parser_at_its_head() -> None:
    attach = (
        b"POST /containers/x/attach?stdin=1 HTTP/1.1\r\nHost: d\r\n"
        b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
    )
    assert frame(attach + b"GET / HTTP/1.1\r\n\r\n not http", []) == [
        (b"POST", len(attach), 0, b"")
    ]


SMUGGLING = {
    "Content-Length and Transfer-Encoding": b"Content-Length: 4\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n0\r\n\r\n",
    "two Content-Lengths": b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x",
    "a signed Content-Length": b"Content-Length: +2\r\n\r\n{}",
    "a chunk size that is not hex": b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "a space after a chunk size": b"Transfer-Encoding: chunked\r\n\r\n2 \r\n{}\r\n0\r\n\r\n",
    "bare LFs in a chunked body": b"Transfer-Encoding: chunked\r\n\r\n2\n{}\n0\n\n",
    "a coding that does not end in chunked": b"Transfer-Encoding: chunked, gzip\r\n\r\n",
    "a folded header line": b"X-A: a\r\n b\r\n\r\n",
}


def test_ambiguous_framing_is_refused_before_anything_is_forwarded() -> None:
    for what, rest in SMUGGLING.items():
        data = b"POST /v1.41/containers/prune HTTP/1.1\r\nHost: d\r\n" + rest
        framed = frame(data, [])
        assert isinstance(framed, str) and framed.startswith("refused"), what


def test_a_head_over_dockerds_limit_is_refused_however_it_is_read() -> None:
    long_get = b"GET /x?" + b"a" * ((1 << 20) + 4096) + b" HTTP/1.1\r\n\r\n"
    assert frame(long_get, []) == frame(long_get, [4096, 8192]) != []
    assert "Go's MaxHeaderBytes" in str(frame(long_get, [4096]))


# --- responses -----------------------------------------------------------------------------


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    status = draw(st.sampled_from([100, 200, 201, 204, 304, 404, 500]))
    body = draw(st.sampled_from([b"", b"OK", b"{}\n", b"0\r\n\r\n", b"x" * 300]))
    headers = [b"Api-Version: 1.41", b"Content-Type: application/json"]
    kind = draw(st.sampled_from(["length", "wrong length", "chunked", "both"]))
    if kind in ("length", "both"):
        headers.append(b"Content-Length: %d" % len(body))
    if kind == "wrong length":
        headers.append(b"Content-Length: %d" % (len(body) + 1))
    if kind in ("chunked", "both"):
        headers.append(b"Transfer-Encoding: chunked")
        ext = draw(st.sampled_from([b"", b";x=1"]))
        end = draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0\r\n"]))
        body = chunked(body, draw(st.integers(0, len(body))), ext, end)
    if status in (100, 204, 304):
        body = b""
    if draw(st.booleans()):
        headers.append(draw(st.sampled_from([b"Connection: close", b"Connection: keep-alive"])))
    return b"HTTP/1.1 %d X\r\n" % status + b"\r\n".join(headers) + b"\r\n\r\n" + body


@settings(max_examples=400)
@given(st.lists(responses(), min_size=1, max_size=3), st.lists(st.integers(1, 900), max_size=5))
@example([PING, INSPECT, PING], [1, 300, 301])
def test_responses_end_where_they_end_however_the_bytes_are_read(
    answers: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(answers)
    whole = frame(data, [], response=True)
    cuts = sorted({c for c in cuts if c < len(data)})
    assert frame(data, cuts, response=True) == whole


def test_the_engines_everyday_answers_are_framed_with_their_bodies() -> None:
    assert frame(PING + INSPECT, [], response=True) == [
        (b"200", len(PING), 200, b"OK"),
        (b"200", len(PING) + len(INSPECT), 200, b'{"Id":"abc"}\n'),
    ]


def test_an_upgrade_request_the_engine_did_not_upgrade_leaves_the_next_request_readable() -> None:
    # `docker attach` to a missing container: a 404, and the connection stays HTTP
    parser = Parser()
    attach = b"POST /containers/gone/attach HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
    assert parser.head(attach, len(attach)) and parser.upgraded and parser.done
    post = b"POST /containers/x/wait HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    assert parser.head(post, len(post) - 2) and not parser.upgraded and not parser.done
    assert parser.body(post, len(post) - 2) == len(post) and parser.done
    assert (parser.method, parser.url) == (b"POST", b"/containers/x/wait")


def test_an_answer_head_ends_after_its_blank_line_and_is_bounded():
    assert response_head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody") == 25
    assert response_head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n") == 0
    assert response_head_end(b"x" * MAX_HEAD) == 0
    with pytest.raises(BadMessage, match="response header section too large"):
        response_head_end(b"x" * (MAX_HEAD + 1))
