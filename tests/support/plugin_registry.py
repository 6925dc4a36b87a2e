"""A registry of managed plugins over plain HTTP on 127.0.0.1, for `docker plugin install`.

No network: dockerd treats 127.0.0.0/8 as an insecure registry, so it pulls over HTTP
from this thread.  It serves exactly what dockerd's plugin pull asks for: each plugin's
manifest (by tag and by digest), its config blob and one gzipped rootfs layer.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class PluginRegistry:
    """``plugins``: repository name -> (plugin config.json, rootfs as an uncompressed tar)."""

    def __init__(self, plugins: Mapping[str, tuple[Mapping[str, Any], bytes]]):
        self.files: dict[str, tuple[bytes, str]] = {}  # path -> (body, content type)
        for repo, (config, rootfs) in plugins.items():
            layer = gzip.compress(rootfs, mtime=0)
            with_layers = {**config, "rootfs": {"type": "layers", "diff_ids": [digest(rootfs)]}}
            blob = json.dumps(with_layers).encode()
            manifest = json.dumps({
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {"mediaType": "application/vnd.docker.plugin.v1+json",
                           "size": len(blob), "digest": digest(blob)},
                "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                            "size": len(layer), "digest": digest(layer)}],
            }).encode()  # fmt: skip
            for ref in ("latest", digest(manifest)):
                self.files[f"/v2/{repo}/manifests/{ref}"] = (manifest, MANIFEST)
            for data in (blob, layer):
                self.files[f"/v2/{repo}/blobs/{digest(data)}"] = (data, "application/octet-stream")
        self.files["/v2/"] = (b"{}", "application/json")
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.files))
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(files: Mapping[str, tuple[bytes, str]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def _answer(self, send_body: bool) -> None:
            path = self.path.split("?", 1)[0]
            body, ctype = files.get(path, (b"", ""))
            self.send_response(200 if ctype else 404)
            self.send_header("Content-Length", str(len(body)))
            if ctype:
                self.send_header("Content-Type", ctype)
                self.send_header("Docker-Content-Digest", digest(body))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

    return Handler
