"""This host's key for the shim's mark on the service writes it forwards (``service.key``).

`core.judging.service_marks` says why: the plugin tells a service write the shim made from one
made on dockerd's own socket by an HMAC only gpu-alloc's processes here can make.  The
key is 32 random bytes in the state directory (0600, root's), made by whichever process
needs it first (``O_EXCL``: never two), and read once per process.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger("gpu-alloc")
FILE = "service.key"
SIZE = 32


def load(state_dir: str | os.PathLike[str]) -> bytes:
    """The key, made now when there is none; empty when it can be neither read nor made
    (then nothing is marked, and dockerd's rules for its own socket hold for every service
    write: fail closed)."""
    path = Path(state_dir) / FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        log.warning("%s: cannot make the service key: %s", path, e.strerror)
        return b""
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(SIZE))
            f.flush()
            os.fsync(f.fileno())
    try:
        key = path.read_bytes()
    except OSError as e:
        log.warning("%s: cannot read the service key: %s", path, e.strerror)
        return b""
    return key if len(key) == SIZE else b""
