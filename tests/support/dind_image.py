"""A Docker-in-Docker image made from the host's own Engine: busybox, the host's dockerd,
containerd, its runc shim, runc and the docker CLI, with the shared libraries they load.

No registry reaches ``docker:dind``; the binaries the tests already run are the same
Engine, and `docker import` takes them as any other root filesystem.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile

import docker

from tests.support.busybox_image import busybox_rootfs_tar
from tests.support.clients import which

DIND_TAG = "gpu-alloc-test/dind:latest"
# The image's command: its own dockerd, and a container of that dockerd's, whose output
# ("nested") is the container's; the dockerd's log instead when it never answers.
NESTED_RUN = """
dockerd --bridge none --iptables=false --ip6tables=false --storage-driver vfs \
    >/var/log/dockerd.log 2>&1 &
tries=0
until docker version >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ $tries -lt 240 ] || { cat /var/log/dockerd.log; exit 3; }
    sleep 0.5
done
docker import /busybox.tar inner/busybox >/dev/null && \
    docker run --rm --network none inner/busybox /bin/echo nested
"""
ENGINE_BINARIES = ("dockerd", "containerd", "containerd-shim-runc-v2", "runc")
# What dockerd wants to find on a fresh host besides its binaries.
DIRS = ("usr/local/bin", "var/lib", "var/log", "var/run", "run", "etc/docker")


def _libraries(binary: str) -> set[str]:
    """The shared objects ``binary`` loads, as ldd finds them (none for a static one)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return {m for m in re.findall(r"(/\S+\.so[.\d]*)", out) if os.path.exists(m)}


def dind_rootfs_tar() -> bytes:
    """busybox's root filesystem with the host's Engine added under /usr/local/bin, and
    busybox's again as /busybox.tar for the inner dockerd to import."""
    binaries = [(which(b), b) for b in (*ENGINE_BINARIES, "docker")]
    missing = [name for path, name in binaries if path is None]
    if missing:
        raise RuntimeError(f"not on this host: {', '.join(missing)} (make deps installs them)")
    libs = set().union(*(_libraries(str(path)) for path, _ in binaries))
    out = io.BytesIO()
    base_tar = io.BytesIO(busybox_rootfs_tar())
    with tarfile.open(fileobj=base_tar) as base, tarfile.open(fileobj=out, mode="w") as tar:
        for member in base.getmembers():
            tar.addfile(member, base.extractfile(member) if member.isfile() else None)
        for name in DIRS:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, name in binaries:
            tar.add(str(path), arcname=f"usr/local/bin/{name}")
        for lib in sorted(libs):
            tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
        for name, data, mode in (
            ("busybox.tar", base_tar.getvalue(), 0o644),
            ("usr/local/bin/nested-run", NESTED_RUN.encode(), 0o755),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def import_dind(docker_sock: str | os.PathLike[str], tag: str = DIND_TAG) -> str:
    """Import the image as ``tag`` (its command `nested-run`); return its id."""
    repo, _, version = tag.rpartition(":")
    api = docker.APIClient(base_url="unix://" + os.fspath(docker_sock), version="auto", timeout=120)
    try:
        changes = ["ENV PATH=/usr/local/bin:/bin", 'CMD ["/bin/sh", "/usr/local/bin/nested-run"]']
        api.import_image_from_data(dind_rootfs_tar(), repository=repo, tag=version, changes=changes)
        return api.inspect_image(tag)["Id"]
    finally:
        api.close()
