"""The shim transport's test helpers: an interceptor that records, short socket dirs."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile

from shim import framing


class Recorder:
    """Intercepts POST .../containers/create: adds a label, keeps what happened."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[framing.Request] = []
        self.errors: list[framing.UpstreamError] = []

    def wants(self, method: str, target: str) -> bool:
        return method == "POST" and target.split("?", 1)[0].endswith("/containers/create")

    async def handle(self, request: framing.Request, forward: framing.Forward) -> framing.Response:
        self.seen.append(framing.Request(**vars(request)))  # a copy: the body is rewritten below
        if self.fail:
            raise RuntimeError("boom")
        body = json.loads(request.body or b"{}")
        body["Labels"] = {**(body.get("Labels") or {}), "io.test.proxy": "seen"}
        request.body = json.dumps(body).encode()
        try:
            return await forward(request)
        except framing.UpstreamError as e:
            self.errors.append(e)
            return framing.Response(503, "", [("Content-Type", "application/json")], b"{}")


_made: list[str] = []


def short_dir() -> str:
    """A short /tmp dir (unix socket paths are limited to 108 bytes), removed after the test."""
    _made.append(tempfile.mkdtemp(prefix="gap-", dir="/tmp"))
    return _made[-1]


def remove_short_dirs() -> None:
    """Remove every dir `short_dir` made; a test module's autouse fixture calls it."""
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One Content-Length response: (status line, lower-cased headers, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(
        (k.strip().lower(), v.strip()) for k, v in (x.split(":", 1) for x in lines[1:] if x)
    )
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0].encode(), headers, body
