"""The Python floor: the least an authorization plugin written in Python can cost.

A keep-alive asyncio responder with no framework that answers every call with
``Allow`` (and ``Plugin.Activate`` with ``authz``).  Registered as the plugin of
a dockerd of its own, it shows what dockerd pays for a plugin round trip plus
the minimum Python adds; gpu-alloc's plugin is judged against it.

Run: ``python -m tests.bench.floor SOCKET``.
"""

from __future__ import annotations

import asyncio
import os
import sys

_ALLOW = b'{"Allow":true}'
_ACTIVATE = b'{"Implements":["authz"]}'


def _answer(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.plugins.v1+json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


ALLOW, ACTIVATE = _answer(_ALLOW), _answer(_ACTIVATE)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            low = head.lower()
            at = low.find(b"\r\ncontent-length:")
            if at >= 0:
                n = int(low[at + 17 : low.index(b"\r\n", at + 2)])
                await reader.readexactly(n)
            writer.write(ACTIVATE if head.startswith(b"POST /Plugin.Activate") else ALLOW)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    server = await asyncio.start_unix_server(_serve, path, limit=4 * 1024 * 1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
