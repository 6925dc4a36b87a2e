"""The Engine's known security advisories that bear on gpu-alloc, by version.

A table: each advisory names the version ranges it affects (a range per release line,
from its first affected version to the release that fixed it) and how it bears on a
GPU host.  `affecting` is all `gpu-alloc doctor` asks; `denied_routes` is what the
plugin refuses on an affected Engine while it is not upgraded.

A distribution may backport a fix without changing the upstream version (Debian's
26.1.5+dfsg1 and 28.5.2+dfsg1 refuse bodies over 4 MiB to plugins, CVE-2026-34040):
the version cannot tell, so doctor says so beside the advisory.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.api.routes import Check

Version = tuple[int, int, int]
ZERO: Version = (0, 0, 0)


@dataclass(frozen=True)
class Advisory:
    cve: str
    what: str  # the flaw, in a line
    ranges: tuple[tuple[Version, Version], ...]  # [first affected, fixed in) per line
    bearing: str  # what it means on a gpu-alloc host, and what gpu-alloc does about it
    severe: bool  # True: a user can get a GPU (or the host) past gpu-alloc until upgraded
    denies: Check | None = None  # the route the plugin refuses on an affected Engine

    def affects(self, version: Version) -> bool:
        return any(first <= version < fixed for first, fixed in self.ranges)

    @property
    def fixed_in(self) -> str:
        return " / ".join(".".join(map(str, fixed)) for _, fixed in self.ranges)


ADVISORIES: tuple[Advisory, ...] = (
    Advisory(
        "CVE-2024-41110",
        "an API request with Content-Length 0 reaches authorization plugins without its "
        "body, and dockerd executes it with the body",
        (
            (ZERO, (23, 0, 15)),
            ((24, 0, 0), (25, 0, 6)),
            ((26, 0, 0), (26, 1, 5)),
            ((27, 0, 0), (27, 1, 1)),
        ),
        "gpu-alloc refuses every call whose verdict needs a body the Engine did not pass "
        "(a create, a start with a body, an exec, a plugin's privileges), so no GPU is "
        "given this way; other authorization plugins on the host may be bypassed",
        severe=False,
    ),
    Advisory(
        "CVE-2026-34040",
        "request bodies over 1 MiB reach authorization plugins without the body, and "
        "dockerd executes them",
        ((ZERO, (29, 3, 1)),),
        "gpu-alloc refuses every call whose verdict needs a body it was not passed; "
        "Debian's 26.1.5 and 28.5.2 packages carry the fix (bodies over 4 MiB refused)",
        severe=False,
    ),
    Advisory(
        "CVE-2026-33997",
        "an off-by-one in the check of a managed plugin's privileges",
        ((ZERO, (29, 3, 1)),),
        "gpu-alloc judges a plugin's privileges itself (devices, mounts, capabilities) "
        "before dockerd installs or upgrades it",
        severe=False,
    ),
    Advisory(
        "CVE-2026-41567",
        "PUT /containers/{id}/archive (docker cp into a container) runs the container's "
        "own decompressor as root on the host",
        (((29, 0, 0), (29, 5, 1)),),
        "any user who may copy a file into their own container gets root on the host, "
        "every GPU included: gpu-alloc's plugin refuses PUT /containers/{id}/archive on "
        "this Engine until it is upgraded (copy files in with a bind mount or an image)",
        severe=True,
        denies=Check.ARCHIVE,
    ),
)


def affecting(version: Version | None) -> tuple[Advisory, ...]:
    """The advisories this Engine version is affected by; an unknown version: none can
    be named (doctor says the version could not be read)."""
    if version is None:
        return ()
    return tuple(a for a in ADVISORIES if a.affects(version))


def denying(version: Version | None, check: Check) -> Advisory | None:
    """The advisory for which the plugin refuses a call of ``check`` on this Engine."""
    return next((a for a in affecting(version) if a.denies is check), None)
