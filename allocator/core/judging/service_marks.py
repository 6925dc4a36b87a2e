"""Which service writes the shim made, and what one made on dockerd's own socket may set.

A service's GPUs count for the owner its spec's label names (`service_limits`), and the
shim sets that label for the person behind its connection.  On dockerd's own socket the
plugin cannot tell who asks, so a spec from there could name anyone, or no one, and run
GPUs past every limit.  So the shim marks each service write it forwards: an HMAC of
the body it sends, under a key only gpu-alloc's processes on this host can read, in its
own request header (`HEADER`; dockerd hands request headers to the plugin, and the shim
drops any a client sent under gpu-alloc's prefix).  A write without a valid mark came from
elsewhere: gpu-alloc's labels anywhere in its spec are refused, and so is a GPU service,
unless ``swarm.engine_socket_services: trusted`` says root's services are trusted (then
they count for nobody, as before gpu-alloc kept swarm limits), or ``{charge: <owner>}``
names the owner they count for (`ChargeCheck`: within that owner's limit, or refused).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.api import labels
from allocator.core.judging import service_limits

HEADER = "X-Gpu-Alloc-Service"  # the shim's mark on a service write it forwards
TRUSTED = "trusted"
CHARGE = "charge"  # with an owner: they count for that owner (`ChargeCheck`)


@dataclass(frozen=True)
class Signing:
    """This host's key for the mark, and ``swarm.engine_socket_services``."""

    key: bytes = b""  # empty: none could be read, so nothing is marked
    engine_socket: str = "refuse"
    charge: str = ""  # with engine_socket "charge": whom such a service counts for


@dataclass(frozen=True)
class ChargeCheck:
    """Allow a GPU service made on dockerd's own socket only within the swarm limit of
    ``owner``, whom ``swarm.engine_socket_services: {charge: <owner>}`` names (the
    service ``ref`` names is replaced by ``spec``; None: a create)."""

    owner: str
    ref: str | None
    spec: Mapping[str, Any]


def mark(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def marked(headers: Mapping[str, Any] | None, key: bytes, body: bytes | None) -> bool:
    """The request carries the shim's mark for exactly this body."""
    want = HEADER.lower()
    given = next((str(v) for k, v in (headers or {}).items() if str(k).lower() == want), "")
    return bool(key and given and body is not None) and hmac.compare_digest(
        given, mark(key, body or b"")
    )


def labelled(spec: Any, where: str = "") -> Iterator[str]:
    """Where the spec sets a label under gpu-alloc's prefix, at any depth: the service's
    own, its containers', its mounts' volumes', any ``Labels`` map (keys matched as Go's
    JSON matches them, without case)."""
    if isinstance(spec, Mapping):
        for key, value in spec.items():
            here = f"{where}.{key}" if where else str(key)
            if str(key).lower() == "labels" and isinstance(value, Mapping):
                yield from (f"{here}[{k}]" for k in value if str(k).startswith(labels.PREFIX))
            else:
                yield from labelled(value, here)
    elif isinstance(spec, list):
        for i, item in enumerate(spec):
            yield from labelled(item, f"{where}[{i}]")


def stripped(spec: Any) -> Any:
    """The spec without a label under gpu-alloc's prefix at any depth (the shim's rewrite,
    before it labels the service as its asker's)."""
    if isinstance(spec, Mapping):
        return {
            k: labels.strip(v)
            if str(k).lower() == "labels" and isinstance(v, Mapping)
            else stripped(v)
            for k, v in spec.items()
        }
    if isinstance(spec, list):
        return [stripped(item) for item in spec]
    return spec


def unmarked_refusal(spec: Mapping[str, Any], kind: str, engine_socket: str) -> str | None:
    """Why a service write the shim did not mark is refused; None when it may go on."""
    found = next(labelled(spec), None)
    if found is not None:
        return (
            f"{found} is a label under {labels.PREFIX}, which only gpu-alloc sets (it names "
            "whom a service's GPUs count for); remove it, or create the service through the "
            "gpu-alloc socket, which labels it as yours"
        )
    if engine_socket not in (TRUSTED, CHARGE) and service_limits.per_task(spec, kind):
        return (
            "a service that reserves GPUs, made on dockerd's own socket, counts for no owner "
            "gpu-alloc can tell (so for no limit): create it through the gpu-alloc socket "
            "(docker --context gpu-alloc service create ...), or have the operator set "
            "swarm.engine_socket_services: trusted (or {charge: <owner>})"
        )
    return None
