"""Does the host's driver run the image's CUDA?  nvidia-docker v1's check, at create time.

The toolkit's prestart hook checks ``NVIDIA_REQUIRE_CUDA`` too, but only when
the container starts, and its error is hard to read.  Checking at create means
the lease is never taken and the user reads one line: what the image needs,
what the driver offers, and what to do.  Images say what they need through the
``com.nvidia.cuda.version`` label (nvidia-docker v1), ``NVIDIA_REQUIRE_CUDA``
(``cuda>=12.4``) or ``CUDA_VERSION``; ``NVIDIA_DISABLE_REQUIRE`` turns it off,
as it does in the toolkit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

Version = tuple[int, int]
_REQUIRE = re.compile(r"cuda>=(\d+)\.(\d+)")
_VERSION = re.compile(r"(\d+)\.(\d+)")


def required(image_config: Mapping[str, Any], create_env: Iterable[str] = ()) -> Version | None:
    """The lowest CUDA version the image needs, or None if it does not say."""
    env = _env(image_config.get("Env") or ()) | _env(create_env)
    if env.get("NVIDIA_DISABLE_REQUIRE", "").lower() in ("1", "true", "yes"):
        return None
    label = (image_config.get("Labels") or {}).get("com.nvidia.cuda.version", "")
    for text, pattern in (
        (env.get("NVIDIA_REQUIRE_CUDA", ""), _REQUIRE),
        (label, _VERSION),
        (env.get("CUDA_VERSION", ""), _VERSION),
    ):
        m = pattern.search(text)
        if m:
            return int(m[1]), int(m[2])
    return None


def refusal(driver: Version | None, need: Version | None, image: str) -> str | None:
    if driver is None or need is None or driver >= need:
        return None
    return (
        f"gpu-alloc refused the container create: unsupported CUDA version: the driver "
        f"supports CUDA {driver[0]}.{driver[1]} but image {image} needs {need[0]}.{need[1]}; "
        "use an image built for an older CUDA, or upgrade the NVIDIA driver "
        "(NVIDIA_DISABLE_REQUIRE=1 skips this check)"
    )


def _env(entries: Iterable[str]) -> dict[str, str]:
    return dict(str(e).split("=", 1) for e in entries if "=" in str(e))
