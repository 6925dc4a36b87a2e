"""The test image: a static busybox with applet links, made with `docker import`.

No registry, no network: the tests must run on a machine that reaches only package
mirrors, against any Engine (the tar is built on the host and imported through the API).
"""

from __future__ import annotations

import io
import os
import tarfile

import docker

from tests.support.clients import which

BUSYBOX_TAG = "gpu-alloc-test/busybox:latest"

# Debian's busybox-static has no `printenv` applet; the image gets a tiny script instead.
BUSYBOX_APPLETS = (
    "sh", "ash", "echo", "cat", "env", "sleep", "true", "false", "ls", "id", "test", "[",
    "grep", "sed", "head", "tail", "wc", "touch", "mkdir", "rm", "ps", "kill", "hostname",
    "printf", "uname", "date", "seq", "tr", "cut", "sort", "timeout", "wget", "nc",
)  # fmt: skip
PRINTENV_SCRIPT = """#!/bin/sh
# printenv for a busybox image whose busybox lacks the applet.
[ $# -eq 0 ] && exec env
rc=0
for name in "$@"; do
    if eval "[ \\"\\${$name+set}\\" = set ]"; then
        eval "printf '%s\\n' \\"\\$$name\\""
    else
        rc=1
    fi
done
exit $rc
"""


def busybox_rootfs_tar(busybox: str | None = None) -> bytes:
    """A minimal root filesystem: static busybox plus applet links, as an uncompressed tar."""
    busybox = busybox or which("busybox")
    if busybox is None:
        raise RuntimeError("busybox not found; install busybox-static (make deps)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            tar.addfile(info)
        for name, text, mode in (
            ("bin/printenv", PRINTENV_SCRIPT, 0o755),
            ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644),
            ("etc/group", "root:x:0:\n", 0o644),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def import_busybox(docker_sock: str | os.PathLike[str], tag: str = BUSYBOX_TAG) -> str:
    """Import the busybox rootfs as image `tag` (CMD ["sh"]); return the image id."""
    repo, _, version = tag.rpartition(":")
    if not repo or "/" in version:
        repo, version = tag, "latest"
    api = docker.APIClient(base_url="unix://" + os.fspath(docker_sock), version="auto", timeout=60)
    try:
        api.import_image_from_data(
            busybox_rootfs_tar(), repository=repo, tag=version, changes=['CMD ["sh"]']
        )
        return api.inspect_image(f"{repo}:{version}")["Id"]
    finally:
        api.close()
