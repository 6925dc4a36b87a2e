"""An attach's ``stdin`` as dockerd reads it is what gpu-alloc read: a differential test.

gpu-alloc keeps an owned container's input to its owner, and judges whether an attach
may feed stdin with `goform.bool_value` (Go's ``httputils.BoolValue`` over
``r.FormValue``).  Each spelling below attaches to a running ``cat`` on the real dockerd
and types a line of its own: the line comes back only where dockerd attached stdin.
Wherever dockerd did, gpu-alloc must have said the attach may feed it; and it says so
nowhere else but where the module documents that it reads more than Go does.
"""

from __future__ import annotations

import select
import socket
import time

from allocator.core.api import goform
from tests.support.faults import IMAGE, real

FORM = "application/x-www-form-urlencoded"
# name: (query, (Content-Type, body) or None)
SPELLINGS = {
    "1": ("stdin=1", None),
    "true": ("stdin=true", None),
    "a word": ("stdin=yes", None),
    "spaced On": ("stdin=%20On%20", None),
    "absent": ("", None),
    "0": ("stdin=0", None),
    "FALSE": ("stdin=FALSE", None),
    "no": ("stdin=no", None),
    "none, spaced as Go trims": ("stdin=+none%09", None),
    "empty": ("stdin=", None),
    "no-break space is Go's space": ("stdin=%C2%A00", None),
    "\\x1c is not Go's space": ("stdin=%1C0", None),
    "an encoded key": ("%73tdin=1", None),
    "another case is another key": ("STDIN=1", None),
    "a form body over the query": ("stdin=0", (FORM, "stdin=1")),
    "a form type Go lower-cases from \u0130": (
        "",
        ("appl\u0130cation/x-www-form-urlencoded", "stdin=1"),
    ),
    "first of two values": ("stdin=0&stdin=1", None),
}
# Where gpu-alloc says "may feed stdin" and dockerd does not (goform's rule 3, and a form
# body it cannot see): refusing more, never less.
READS_MORE = {"first of two values"}


def _attach(sock: str, cid: str, query: str, form: tuple[str, str] | None) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(sock)
    body = form[1].encode() if form else b""
    sep = "&" if query else ""
    head = (
        f"POST /containers/{cid}/attach?stream=1&stdout=1&{query}{sep}x=1 HTTP/1.1\r\n"
        "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
        + (f"Content-Type: {form[0]}\r\n" if form else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    )
    conn.sendall(head.encode() + body)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = conn.recv(4096)
        assert chunk, f"dockerd closed the attach ?{query}: {got!r}"
        got += chunk
    assert got.startswith((b"HTTP/1.1 101", b"HTTP/1.1 200")), got
    return conn


def test_dockerd_attaches_stdin_only_where_gpu_alloc_says_an_attach_may_feed_it(stack):
    made = real(stack, "run", "-d", "-i", IMAGE, "cat")
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    said = {
        name: goform.bool_value(
            f"/containers/{cid}/attach?{query}",
            {"Content-Type": form[0]} if form else {},
            "stdin",
        )
        for name, (query, form) in SPELLINGS.items()
    }
    conns = {name: _attach(stack.engine_sock, cid, *spelt) for name, spelt in SPELLINGS.items()}
    markers = {name: f"<typed {i:02d}>".encode() for i, name in enumerate(SPELLINGS)}
    try:
        for name, conn in conns.items():
            conn.sendall(markers[name] + b"\n")
        # every attach has stdout: each sees each line cat echoes, whoever typed it
        heard = b""
        expected = {markers[n] for n, says in said.items() if says and n not in READS_MORE}
        grace, deadline = None, time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select(list(conns.values()), [], [], 0.2)
            for conn in ready:
                heard += conn.recv(65536)
            if all(m in heard for m in expected) and grace is None:
                grace = time.monotonic() + 2  # what else would come has had its time
            if grace is not None and time.monotonic() > grace:
                break
    finally:
        for conn in conns.values():
            conn.close()
    read = {name: markers[name] in heard for name in SPELLINGS}
    assert {n for n, r in read.items() if r} == {n for n, s in said.items() if s} - READS_MORE
    assert read["1"] and not read["0"]  # never vacuous
