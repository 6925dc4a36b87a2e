"""Notices: what gpu-alloc tells the people whose containers it acts on, as plain data.

A notice is made from an audit record (allocator/core/leases/events.py), so whatever is
audited can be told, and told the same way: a grant after a wait (``granted``), the
checkpoint signal before a stop (``warning``), a stop at the time limit or by idle
reclaim (``stopped``), and a GPU turning unhealthy (``unhealthy``, to the owner of each
lease on it and to ``notify.operators``).  Made from the clock instead: a time limit's
80 % and 90 % for a container without a checkpoint signal (`time_warning`), 80 % of
idle reclaim's time for one idle (`idle_warning`), and a
reservation about to begin and begun (`reservation`: to its holder, and to whoever's
lease is on its GPUs then).  Each says what happened, to which container,
and what the owner can do.  Its id is a hash of the record it came from (`notice_id`):
the outbox keeps one notice per id, and the sinks are given it as their idempotency key.

Who gets which: ``notify.events.users.NAME`` lists the kinds a user wants, else
``notify.events.default`` (unset: every kind); an address is the user's own in
``notify.addresses.users``, else the ``notify.addresses.template`` with ``{user}``
filled in, else none (the webhooks still say it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.core.leases.events import rfc3339
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import Lease
from allocator.core.timing.reservations import Reservation

KINDS = ("granted", "warning", "stopped", "unhealthy", "reservation", "test")
FORMATS = ("slack", "teams", "json")  # slack: Slack's and Mattermost's {"text": ...}
RETRY_FIRST, RETRY_MAX = 5.0, 3600.0  # seconds: a sink's backoff, doubling
SOON = 900.0  # seconds before a reservation begins that its holder is told


@dataclass(frozen=True)
class Choices:
    """``notify.events`` and ``notify.addresses``: who wants which notices, where."""

    default: frozenset[str] = frozenset(KINDS)
    users: Mapping[str, frozenset[str]] = field(default_factory=dict)
    addresses: Mapping[str, str] = field(default_factory=dict)
    template: str | None = None  # "{user}@lab.example"
    operators: tuple[str, ...] = ()  # told of every GPU turning unhealthy

    def wants(self, user: str, kind: str) -> bool:
        return kind == "test" or kind in self.users.get(user, self.default)

    def address(self, user: str) -> str | None:
        if user in self.addresses:
            return self.addresses[user]
        if self.template is None or not user or user == "unknown":
            return None
        return self.template.replace("{user}", user)


@dataclass(frozen=True)
class Notice:
    """One notice to one user (``user`` "" for the operators): ``to``, the addresses it is
    mailed to (none: the webhooks alone say it)."""

    id: str
    kind: str
    at: str  # the audit record's time, RFC 3339
    user: str
    to: tuple[str, ...]
    subject: str
    text: str
    container: str | None = None
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "to": list(self.to)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Notice:
        return cls(**{**data, "to": tuple(data.get("to") or ())})


def notice_id(record: Mapping[str, Any], user: str) -> str:
    """The same record told to the same user always has the same id."""
    key = json.dumps([record.get(k) for k in ("time", "event", "lease", "container")] + [user])
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def from_record(
    record: Mapping[str, Any], choices: Choices, holders: Mapping[str, Iterable[str]] | None = None
) -> list[Notice]:
    """The notices an audit ``record`` makes; ``holders``: GPU UUID -> the owners of the
    leases on it (for ``health``)."""
    event = record.get("event")
    owner = str(record.get("owner") or "")
    what = _what(record)
    reason = str(record.get("reason") or "")
    if event == "grant" and record.get("waited_s") is not None:
        waited = ago(float(record["waited_s"]))
        return _to(record, choices, "granted", [owner], f"{what} was granted its GPUs",
                   f"{what} waited {waited} in line and was granted {_gpus(record)}; "
                   "dockerd creates it now, nothing more to do.")  # fmt: skip
    if event == "signal":
        return _to(record, choices, "warning", [owner], f"{what} will be stopped soon",
                   f"{what} was {reason}. Save your work now: it will be stopped (its stop "
                   "signal, then SIGKILL), and keeps its GPUs until it is removed or "
                   "policy.release_stopped_after.")  # fmt: skip
    if event in ("time-limit", "idle-reclaim"):
        again = (
            "It may not start again: 'docker rm' it and create it again for a new limit."
            if event == "time-limit"
            else "'docker start' it to go on, or 'docker rm' it to give its GPUs back."
        )
        return _to(record, choices, "stopped", [owner], f"{what} was stopped",
                   f"gpu-alloc stopped {what}: {reason}. {again}")  # fmt: skip
    if event == "health" and reason.startswith("GPU unhealthy"):
        on = holders or {}
        users = sorted({u for g in record.get("gpus") or () for u in on.get(g, ())})
        gpu = _gpus(record)
        text = (
            f"{gpu} is {reason.removeprefix('GPU ')} until it recovers. A container on it "
            "may fail: 'gpu-alloc status' names it; remove it and create it again for "
            "another GPU."
        )
        return _to(record, choices, "unhealthy", users, f"{gpu} turned unhealthy", text) + (
            _operators(record, choices, f"{gpu} turned unhealthy", text, users)
        )
    return []


def time_warning(lease: Lease, share: float, choices: Choices) -> list[Notice]:
    """The notice to ``lease``'s owner that its container has run ``share`` of its time
    limit (a lease without a checkpoint signal): the same lease and share always make the
    same notice, whenever it is made."""
    limit = lease.time_limit or 0.0
    at = (lease.started or 0.0) + share * limit
    end = rfc3339((lease.started or 0.0) + limit)
    record = {"time": rfc3339(at), "event": f"time-{share:.0%}", "lease": lease.id,
              "container": lease.container, "name": lease.name}  # fmt: skip
    what = _what(record)
    text = (
        f"{what} has run {share:.0%} of its time limit of {ago(limit)}: gpu-alloc stops it "
        f"at {end[:19]}Z ({ago(round((1 - share) * limit))} from the warning). Save your work "
        "now; ask for a checkpoint signal next time with --label io.gpu-alloc.signal=USR1@10m."
    )
    return _to(record, choices, "warning", [lease.owner], f"{what} will be stopped soon", text)


def idle_warning(lease: Lease, since: float, after: float, choices: Choices) -> list[Notice]:
    """The notice to ``lease``'s owner that its container's GPUs sat unused since ``since``,
    most of ``policy.reclaim_idle_after`` (``after``): one per stretch of idleness."""
    record = {"time": rfc3339(since), "event": "idle-warning", "lease": lease.id,
              "container": lease.container, "name": lease.name}  # fmt: skip
    what = _what(record)
    text = (
        f"The GPUs of {what} have run no process since {rfc3339(since)[:19]}Z: gpu-alloc "
        f"stops it at {rfc3339(since + after)[:19]}Z (policy.reclaim_idle_after, "
        f"{ago(after)}) unless they are used again. Use them, or 'docker rm' it to give "
        "them back."
    )
    return _to(record, choices, "warning", [lease.owner], f"{what} is idle", text)


def reservations_due(
    reservations: Iterable[Reservation], now: float
) -> list[tuple[Reservation, bool]]:
    """(reservation, begun) for each about to begin (within `SOON`) or begun, not over."""
    return [(r, r.start <= now) for r in reservations if r.start - SOON <= now < r.end]


def reservation(
    r: Reservation,
    begun: bool,
    choices: Choices,
    indices: Mapping[str, int],
    holders: Mapping[str, Iterable[str]],
) -> list[Notice]:
    """The notices of ``r`` about to begin (``begun`` False) or begun: to its holder (a
    user: a group has no address) and to the owners of the leases on its GPUs, who are
    kept from starting into it.  ``indices``: GPU UUID -> index; ``holders``: GPU UUID ->
    the owners of the leases on it."""
    shown = sorted(str(indices[u]) for u in r.gpus if u in indices)
    gpus = f"GPU {','.join(shown)}" if shown else f"{len(r.gpus)} GPU(s)"
    window = f"from {rfc3339(r.start)[:16]}Z to {rfc3339(r.end)[:16]}Z"
    note = f", {r.note}" if r.note else ""
    phase = "began" if begun else "begins soon"
    record = {"time": rfc3339(r.start - (0 if begun else SOON)), "event": f"reservation-{phase}",
              "lease": r.id, "container": None}  # fmt: skip
    found = []
    if not r.holder.startswith("@"):
        found += _to(record, choices, "reservation", [r.holder],
                     f"your reservation of {gpus} {phase}",
                     f"{gpus} is reserved for you {window} (reservation {r.id}{note}). "
                     "Create with --gpus N to be placed on it.")  # fmt: skip
    others = sorted({u for g in r.gpus for u in holders.get(g, ())} - {r.holder})
    found += _to(record, choices, "reservation", others,
                 f"{gpus} is reserved for {r.holder} {window}",
                 f"A container of yours holds {gpus}, reserved for {r.holder} {window} "
                 f"(reservation {r.id}{note}). It keeps running, but may not start again into "
                 "that window: save your work, and create it again for other GPUs.")  # fmt: skip
    return found


def trial(user: str, at: str, choices: Choices) -> Notice:
    """The notice ``gpu-alloc notify test`` sends: to ``user``'s address, or with no user
    to the operators'."""
    text = f"A test notice from gpu-alloc for {user or 'the operators'}: notices reach you."
    address = choices.address(user) if user else None
    to = (address,) if address else () if user else choices.operators
    key = hashlib.sha256(f"test {at} {user}".encode()).hexdigest()[:24]
    return Notice(key, "test", at, user, tuple(a for a in to if a), "gpu-alloc: test", text)


def payload(notice: Notice, fmt: str) -> dict[str, Any]:
    """The webhook body: Slack's and Mattermost's ``{"text"}``, a Teams message card, or
    the notice itself as a JSON event."""
    line = f"*{notice.subject}*" + (f" ({notice.user})" if notice.user else "")
    if fmt == "slack":
        return {"text": f"{line}\n{notice.text}"}
    if fmt == "teams":
        return {
            "@type": "MessageCard",
            "@context": "https://schema.org/extensions",
            "summary": notice.subject,
            "title": notice.subject,
            "text": notice.text,
        }
    return {"gpu_alloc_notice": notice.to_json()}


def retry_after(failures: int) -> float:
    """Seconds before a sink that failed ``failures`` times in a row is tried again."""
    return min(RETRY_MAX, RETRY_FIRST * 2.0 ** max(0, failures - 1))


def _to(
    record: Mapping[str, Any],
    choices: Choices,
    kind: str,
    users: Iterable[str],
    subject: str,
    text: str,
) -> list[Notice]:
    found = []
    for user in users:
        if not choices.wants(user, kind):
            continue
        address = choices.address(user)
        found.append(
            Notice(
                notice_id(record, user),
                kind,
                str(record.get("time") or ""),
                user,
                (address,) if address else (),
                f"gpu-alloc: {subject}",
                text,
                record.get("container"),
                str(record.get("name") or ""),
            )
        )
    return found


def _operators(
    record: Mapping[str, Any], choices: Choices, subject: str, text: str, users: list[str]
) -> list[Notice]:
    if not choices.operators:
        return []
    held = f" Its leases' owners: {', '.join(users)}." if users else " It held no lease."
    return [
        Notice(
            notice_id(record, ""),
            "unhealthy",
            str(record.get("time") or ""),
            "",
            choices.operators,
            f"gpu-alloc: {subject}",
            text + held,
        )
    ]


def _what(record: Mapping[str, Any]) -> str:
    name = str(record.get("name") or "") or str(record.get("container") or "")[:12]
    return f"container {name}" if name else "a GPU container"


def _gpus(record: Mapping[str, Any]) -> str:
    shown = [str(i) for i in record.get("indices") or () if i is not None]
    return f"GPU {','.join(shown)}" if shown else "its GPUs"
