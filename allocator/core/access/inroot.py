"""A path resolved as a process with another root and working directory resolves it.

dockerd resolves bind sources and device paths in its own mount namespace, which may
not be gpu-alloc's (a unit's private /tmp, an Engine in a chroot).  Seen through
``/proc/<pid>/root`` its tree is reachable, but the kernel follows an absolute link there
from gpu-alloc's root, not dockerd's: so every component is walked here, each link read
and spliced in by hand, as ``openat2(RESOLVE_IN_ROOT)`` and Go's securejoin do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from allocator.core.access.facts import Unresolvable

MAX_HOPS = 40  # Linux's MAXSYMLINKS: more links than this fail with ELOOP in dockerd too
# procfs's links (a process's root, cwd, exe, fd/N, map_files) are "magic": the kernel
# does not follow the text readlink gives (``/`` for a container's root) but the object
# itself, in another mount namespace.  Text walked by hand cannot say where they lead.
MAGIC = "/proc"

# A path inside the root -> the link's target, or None when it is no link (or missing).
ReadLink = Callable[[str], str | None]


def resolve(path: str, readlink: ReadLink, cwd: str = "/", max_hops: int = MAX_HOPS) -> str:
    """``path`` with every link followed inside the root: an absolute target starts again
    at the root, ``..`` never climbs above it, a relative path starts at ``cwd``.  What
    does not exist is kept as spelled, as ``realpath`` keeps it.  A link under `MAGIC`
    is `Unresolvable`."""
    start = path if path.startswith("/") else f"{cwd}/{path}"
    todo = deque(start.split("/"))
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = "/" + "/".join([*done, part])
        target = readlink(here)
        if target is None:
            done.append(part)
            continue
        if here.startswith(MAGIC + "/"):
            raise Unresolvable(
                f"{path} passes {here}, a link in {MAGIC} (a process's root, working "
                "directory or open file), whose target its text does not say; name the "
                "path itself"
            )
        hops += 1
        if hops > max_hops:
            raise Unresolvable(f"{path} passes more than {max_hops} links")
        if target.startswith("/"):
            done = []
        todo.extendleft(reversed(target.split("/")))
    return "/" + "/".join(done)
