"""Stamps for `tests.bench.stages`: where a GPU create's time goes, in the running shim and
plugin.

Put on ``PYTHONPATH`` with ``GA_STAGES_DIR`` set, this wraps the functions `POINTS` names
in the gpu-alloc process it starts in (the shim, or the plugin and its workers) so each
writes a line ``<tag> <CLOCK_MONOTONIC ns> <thread CPU ns>`` to
``$GA_STAGES_DIR/<pid>.txt`` as it runs: the monotonic clock is the one every process on
the host shares, so the driver lines the shim's stamps up with the plugin's and the
client's.  A name in `POINTS` that no longer resolves stops the process with the name,
rather than leave a stage silently unstamped.  Never on a product path: only the stages
driver sets the variable.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# (role, module, attribute, how, tag).  how: "before" stamps as the call begins, "span"
# as it begins and ends (tag, tag + " end"); the other hows are the predicates below.
POINTS = [
    ("shim", "shim.splice", "Splice.connection_made", "before", "shim accepts"),
    ("shim", "shim.splice", "Splice.data_received", "create_bytes", "shim reads the create"),
    ("shim", "shim.splice", "Splice._intercept", "before", "shim has it whole"),
    ("shim", "shim.intercept", "answer", "coroutine", "shim's handler runs"),
    ("shim", "allocator.service.creates", "Creates.at_hand", "span", "shim asks at hand"),
    ("shim", "allocator.service.creates", "Creates.lease_for", "span", "shim leases"),
    ("shim", "shim.connection", "Connection.forward", "before", "shim forwards"),
    ("shim", "shim.connection", "Connection.receive_engine", "created_bytes", "shim reads the 201"),
    ("shim", "shim.connection", "Connection.answered", "before", "shim answers"),
    ("shim", "allocator.service.leasebook", "LeaseBook.finish_grant", "span", "grant durable"),
    ("plugin", "plugin.worker", "_Connection.on_message_complete", "authz_in", "plugin reads"),
    ("plugin", "plugin.worker", "_Connection._send", "authz_out", "plugin answers"),
    ("plugin", "plugin.app", "Dispatcher._settle", "span", "plugin binds"),
]

_fd: int | None = None


def stamp(tag: str) -> None:
    global _fd
    if _fd is None:
        path = f"{os.environ['GA_STAGES_DIR']}/{os.getpid()}.txt"
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_fd, f"{tag}\t{time.monotonic_ns()}\t{time.thread_time_ns()}\n".encode())


def _before(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stamp(tag)
        return fn(*args, **kwargs)

    return wrapper


def _span(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stamp(tag)
        try:
            return fn(*args, **kwargs)
        finally:
            stamp(tag + " end")

    return wrapper


def _coroutine(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        stamp(tag)
        return await fn(*args, **kwargs)

    return wrapper


def _bytes(starts: bytes, within: bytes = b"") -> Callable[[Callable[..., Any], str], Any]:
    """Stamp a ``(self, data)`` call whose bytes start with ``starts`` (and hold
    ``within`` in their first 256): a create's request, or its 201."""

    def how(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(self: Any, data: bytes) -> Any:
            if data.startswith(starts) and within in data[:256]:
                stamp(tag)
            return fn(self, data)

        return wrapper

    return how


def _authz_in(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """An AuthZReq or AuthZRes about a create (the envelope names the URI; its body is
    base64): its answer is stamped by `_authz_out`."""

    @functools.wraps(fn)
    def wrapper(self: Any) -> Any:
        about = b"containers/create" in b"".join(self.body)[:800]
        self.ga_stage = self.url.decode().rsplit(".", 1)[-1] if about else ""
        if about:
            stamp(f"{tag} {self.ga_stage}")
        return fn(self)

    return wrapper


def _authz_out(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Any, data: bytes) -> Any:
        done = fn(self, data)
        if getattr(self, "ga_stage", ""):
            stamp(f"{tag} {self.ga_stage}")
            self.ga_stage = ""
        return done

    return wrapper


HOWS: dict[str, Callable[[Callable[..., Any], str], Callable[..., Any]]] = {
    "before": _before,
    "span": _span,
    "coroutine": _coroutine,
    "create_bytes": _bytes(b"POST", b"/containers/create"),
    "created_bytes": _bytes(b"HTTP/1.1 201"),
    "authz_in": _authz_in,
    "authz_out": _authz_out,
}


def resolve(module: str, attribute: str) -> tuple[Any, str, Any]:
    """(the object holding it, its last name, the function) for ``module:attribute``."""
    holder: Any = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        holder = getattr(holder, part)
    return holder, name, getattr(holder, name)


def install(role: str) -> None:
    for where, module, attribute, how, tag in POINTS:
        if where != role:
            continue
        holder, name, fn = resolve(module, attribute)
        setattr(holder, name, HOWS[how](fn, tag))


def _role(argv: list[str]) -> str | None:
    """The gpu-alloc role this process runs (``gpu-alloc --config C shim``), if any."""
    if not argv or not os.path.basename(argv[0]).startswith("gpu-alloc"):
        return None
    return argv[-1] if argv[-1] in ("shim", "plugin") else None


if os.environ.get("GA_STAGES_DIR"):
    _my_role = _role(sys.argv)
    if _my_role is not None:
        install(_my_role)
