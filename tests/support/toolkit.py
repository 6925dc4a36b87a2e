"""Which GPUs the NVIDIA Container Toolkit gives a container: the test harness's stand-in.

The fake hook (tests/support/engine.py) and the swarm lab's fake runtime
(tests/support/swarm.py) only record the OCI spec a container is created with; this
module alone decides, from that spec and the toolkit's config, which devices the real
hook (``nvidia-container-runtime-hook``, legacy mode) would hand ``nvidia-container-cli``.
It follows the toolkit's own rules, read in NVIDIA/nvidia-container-toolkit:

- ``internal/config/image/cuda_image.go``: ``VisibleDevices`` (CDI annotations first,
  then the ``/var/run/nvidia-container-devices`` volume mounts when accepted, then the
  env: kept for a privileged container or when unprivileged env requests are accepted),
  ``visibleEnvVars`` (the ``swarm-resource`` variables that are present replace
  ``NVIDIA_VISIBLE_DEVICES``; only when configured), ``devicesFromEnvvars`` (their lists
  joined, blanks dropped; unset on a legacy CUDA image is ``all``; nothing, or ``void``
  anywhere, is no GPU container), ``requestsFromMounts`` and ``IsLegacy``;
- ``internal/config/image/devices.go``: ``NewVisibleDevices`` (``all`` or ``none``
  anywhere decide alone, in list order; ``none`` is a GPU container with no device);
- ``internal/config/image/privileged.go``: privileged means CAP_SYS_ADMIN in the bounding
  set;
- ``internal/config/image/builder.go``: the env read as a map (a variable set twice is
  its last value; an entry without ``=`` is an error), ``swarm-resource`` split at commas;
- ``api/config/v1/config.go`` and ``toml.go``: the defaults (``swarm-resource`` unset,
  env requests accepted unprivileged, volume mounts not accepted).

Pure: data in, devices out.  The answer is the toolkit's list: ``[]`` is no GPU container
(the hook does nothing), ``[""]`` a GPU container with no device (``none``), ``["all"]``
every GPU, else the ids as given (indices, UUIDs, MIG ids, CDI names).
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"  # the runtime's CDI mode's default; the hook has none
_CDI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*=[A-Za-z0-9_.:-]+$")


class SpecError(ValueError):
    """The toolkit refuses the spec (the hook panics, the container does not start)."""


@dataclass(frozen=True)
class Config:
    """The toolkit settings that decide devices, with the toolkit's defaults."""

    swarm_resource: tuple[str, ...] = ()  # `swarm-resource`, split at commas
    accept_envvar_unprivileged: bool = True
    accept_volume_mounts: bool = False
    annotation_prefixes: tuple[str, ...] = ()  # the hook (legacy mode) reads none

    @classmethod
    def from_toml(cls, text: str) -> Config:
        """The settings of a toolkit config.toml (top-level keys, as the toolkit reads)."""
        raw = tomllib.loads(text)
        names = str(raw.get("swarm-resource") or "")
        return cls(
            swarm_resource=tuple(n.strip() for n in names.split(",") if n.strip()),
            accept_envvar_unprivileged=bool(
                raw.get("accept-nvidia-visible-devices-envvar-when-unprivileged", True)
            ),
            accept_volume_mounts=bool(raw.get("accept-nvidia-visible-devices-as-volume-mounts")),
        )


def devices(
    env: Iterable[str],
    mounts: Iterable[tuple[str, str]] = (),
    annotations: Mapping[str, str] | None = None,
    privileged: bool = False,
    config: Config = Config(),
) -> list[str]:
    """The devices the toolkit gives a container with this env, these (source,
    destination) mounts and annotations (cuda_image.go ``VisibleDevices``)."""
    by_annotation = _from_annotations(annotations or {}, config.annotation_prefixes)
    if by_annotation:
        return by_annotation
    if config.accept_volume_mounts:
        by_mount = _from_mounts(mounts)
        if by_mount:
            return by_mount
    by_env = _from_env(_env_map(env), config.swarm_resource)
    if by_env and (privileged or config.accept_envvar_unprivileged):
        return by_env
    return []


def of_spec(spec: Mapping[str, Any], config: Config = Config()) -> list[str]:
    """The devices for an OCI runtime spec (a bundle's config.json)."""
    process = spec.get("process") or {}
    bounding = (process.get("capabilities") or {}).get("bounding") or ()
    return devices(
        process.get("env") or (),
        [
            (str(m.get("source", "")), str(m.get("destination", "")))
            for m in spec.get("mounts") or ()
        ],
        spec.get("annotations") or {},
        "CAP_SYS_ADMIN" in bounding,
        config,
    )


def gpus(chosen: Sequence[str], uuids: Sequence[str]) -> set[str]:
    """The GPUs (UUIDs) the toolkit's devices are on a host whose GPUs are ``uuids`` in
    index order: ``all`` every one, an index its GPU, a UUID itself, ``""`` none."""
    out: set[str] = set()
    for ident in chosen:
        if ident == "all":
            out |= set(uuids)
        elif ident.isdigit():
            out.add(uuids[int(ident)])
        elif ident:
            out.add(ident)
    return out


def _env_map(env: Iterable[str]) -> dict[str, str]:
    """builder.go ``WithEnv``: the last value of each name wins."""
    out: dict[str, str] = {}
    for entry in env:
        name, eq, value = str(entry).partition("=")
        if not eq:
            raise SpecError(f"invalid environment variable: {entry}")
        out[name] = value
    return out


def _is_legacy(env: Mapping[str, str]) -> bool:
    """cuda_image.go ``IsLegacy``: a non-empty CUDA_VERSION, an empty or unset
    NVIDIA_REQUIRE_CUDA."""
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def _from_env(env: Mapping[str, str], preferred: Sequence[str]) -> list[str]:
    """cuda_image.go ``visibleEnvVars`` then ``devicesFromEnvvars``, devices.go
    ``NewVisibleDevices``."""
    names = [n for n in preferred if n in env] or [VISIBLE]
    present = any(n in env for n in names)
    asked = [d.strip() for n in names if n in env for d in env[n].split(",") if d.strip()]
    if not present and _is_legacy(env):
        asked = ["all"]
    if not asked or "void" in asked:
        return []
    for ident in asked:
        if ident == "all":
            return ["all"]
        if ident == "none":
            return [""]
    # The toolkit keeps each id once (its lookup map); here in first-seen order.
    return list(dict.fromkeys(asked))


def _from_annotations(annotations: Mapping[str, str], prefixes: Sequence[str]) -> list[str]:
    """cuda_image.go ``cdiDeviceRequestsFromAnnotations``: keys in sorted order, each
    value split at commas, as they are."""
    keys = sorted(k for k in annotations if any(k.startswith(p) for p in prefixes))
    return [d for k in keys for d in annotations[k].split(",")]


def _clean(path: str) -> str:
    """Go's filepath.Clean for absolute paths (posixpath keeps a leading '//')."""
    cleaned = posixpath.normpath(path) if path else "."
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def _from_mounts(mounts: Iterable[tuple[str, str]]) -> list[str]:
    """cuda_image.go ``requestsFromMounts`` and ``visibleDevicesFromMounts``: /dev/null
    mounted under the root names a device (``imex/`` ones are channels, ``cdi/`` ones CDI
    devices as vendor/class/name)."""
    seen: set[str] = set()
    out: list[str] = []
    for source, destination in mounts:
        if _clean(source) != "/dev/null":
            continue
        dest = _clean(destination)
        if dest in seen:
            continue
        seen.add(dest)
        if not dest.startswith(MOUNTS_ROOT):
            continue
        device = dest[len(MOUNTS_ROOT) :].strip("/")
        if not device or device.startswith("imex/"):
            continue
        if device.startswith("cdi/"):
            name = _cdi_mount_name(device[len("cdi/") :])
            if name is not None:
                out.append(name)
            continue
        out.append(device)
    return out


def _cdi_mount_name(requested: str) -> str | None:
    """``cdiDeviceMountRequest.qualifiedName``: a qualified vendor/class=name as it is,
    else vendor/class/name made one (unchecked, as there)."""
    if _CDI_NAME.match(requested):
        return requested
    parts = requested.split("/", 2)
    return f"{parts[0]}/{parts[1]}={parts[2]}" if len(parts) == 3 else None
