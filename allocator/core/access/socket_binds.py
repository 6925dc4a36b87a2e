"""Who may bind the Engine's own API socket into a container or a service's tasks.

A client given dockerd's socket calls the Engine where the plugin cannot tell who asks,
which turns a user of the shim alone into one of the real socket: such a bind is refused
on both sockets (`mounts.exposure`: the socket is a protected path).  The policy may
name the owners trusted with it (``policy.engine_socket_binds``: `power_grants.Binders`).
Only the shim knows who asks, so only a create the shim forwards can be theirs:

- the shim labels the create with its owner (`LABEL`, after every client label under
  gpu-alloc's prefix is stripped) and marks the request (`HEADER`: an HMAC, under the
  state directory's key, of the method, the URI and the body it forwards, the label
  included).  dockerd hands request headers to the plugin, never to another client, and
  the shim drops any a client sent under gpu-alloc's prefix; a mark is good for that one
  body and URI alone;
- the plugin lets a bind of exactly an Engine socket through when the create carries a
  good mark and the label names an owner the policy names (`allowed`); a create with
  the label and no good mark is refused (only gpu-alloc sets it);
- a start (and adoption) is judged by the owner gpu-alloc recorded for the container
  (its lease's, or its creator's: `host/creators.py`), never by a label a client could
  copy into an image;
- a service is the owner's its marked spec's `labels.OWNER` label names.

A bind of a directory that holds the socket is never let through: it reaches whatever
else the directory holds.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.access.mounts import Mount, MountFacts, exposure
from allocator.core.api.labels import ENGINE_SOCKET

# set by the shim only: the asker, when the policy trusts them with the socket or with a
# power outside the allow-list (core/rules/power_grants.py), which the same label carries
LABEL = ENGINE_SOCKET
HEADER = "X-Gpu-Alloc-Create"  # the shim's mark on a create it labelled so
TODO = (
    "ask your operator to add you to policy.engine_socket_binds, and create through the "
    "gpu-alloc context (docker --context gpu-alloc ...)"
)


def mark(key: bytes, method: str, uri: str, body: bytes) -> str:
    message = method.upper().encode() + b"\0" + uri.encode() + b"\0" + body
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def marked(
    headers: Mapping[str, Any] | None, key: bytes, method: str, uri: str, body: bytes | None
) -> bool:
    """The request carries the shim's mark for exactly this method, URI and body."""
    want = HEADER.lower()
    given = next((str(v) for k, v in (headers or {}).items() if str(k).lower() == want), "")
    if not (key and given and body is not None):
        return False
    return hmac.compare_digest(given, mark(key, method, uri, body))


def labelled(spec: Mapping[str, Any]) -> str:
    """The owner a create's `LABEL` names; empty when none."""
    given = spec.get("Labels")
    return str(given.get(LABEL) or "") if isinstance(given, Mapping) else ""


def labelled_as(spec: Mapping[str, Any], user: str) -> dict[str, Any]:
    """The create, labelled as one ``user`` may bind the Engine's socket in."""
    given = spec.get("Labels") if isinstance(spec.get("Labels"), Mapping) else {}
    return {**spec, "Labels": {**(given or {}), LABEL: user}}


def forged(spec: Mapping[str, Any], is_marked: bool) -> str | None:
    """Why a create's `LABEL` is refused: set by anyone but the shim."""
    if not labelled(spec) or is_marked:
        return None
    return (
        f"gpu-alloc refused the container create: the label {LABEL} is gpu-alloc's own (the "
        "gpu-alloc shim sets it on the creates of the owners the policy lets bind the "
        f"Engine's socket); remove it, or {TODO}"
    )


SOCKET_WORDS = "the Engine's API socket"  # in every refusal of such a bind (`owned`)


def bind_refusal(path: str, real: str) -> str:
    """The words for a bind of the Engine's socket nobody let through."""
    return (
        f"bind mount of {path} exposes {real}, {SOCKET_WORDS}, where gpu-alloc "
        f"cannot tell who asks; {TODO}"
    )


def socket_alone(host: MountFacts, real: str, read_only: bool = False) -> bool:
    """A bind of the resolved ``real`` is exactly one of the Engine's API sockets, and
    reaches nothing else protected (a socket kept inside dockerd's own directories does)."""
    sockets = tuple(getattr(host, "engine_sockets", ()))
    return real in sockets and exposure(_Apart(host, sockets), real, read_only) is None


def may_bind(host: MountFacts, owner: str) -> bool:
    """The policy lets ``owner`` bind the Engine's socket (the host asks NSS for groups)."""
    ask = getattr(host, "may_bind_engine", None)
    return bool(owner) and ask is not None and bool(ask(owner))


@dataclass(frozen=True)
class _Apart:
    """The host's mount facts without the Engine's sockets among the protected paths."""

    host: MountFacts
    sockets: tuple[str, ...]

    @property
    def protected(self) -> tuple[str, ...]:
        return tuple(p for p in self.host.protected if p not in self.sockets)

    def mounts(self) -> Iterable[Mount]:
        return self.host.mounts()
