"""``gpu-alloc explain``: would this request be granted now, and if not, why not.

It takes nothing (no lease, no lock held past a read) and answers with the same
decisions the shim makes: the policy's pool and limit, then placement.  The exit
code says which answer it is, so scripts can branch on it.
"""

from __future__ import annotations

import csv
import grp
import os
import pwd
from functools import partial
from typing import Any

from allocator.core.api import labels as gpu_labels
from allocator.core.api import numbers
from allocator.core.grant_plan import LeaseRequest
from allocator.core.judging import verdicts as decide
from allocator.core.leases.holders import ago
from allocator.core.placement import Shortage
from allocator.core.rules import sharing
from allocator.core.rules.policy import Invalid, Owner, Refusal, priority_of, wait_of, wanted
from allocator.core.timing import reservations, timelimits
from allocator.host import ledger
from allocator.service import fair_share
from allocator.service.wiring import Allocator

FITS, FAILED, SHORT, INVALID, REFUSED, WAITS = 0, 1, 2, 3, 4, 5
VERDICT = {FITS: "fits", SHORT: "short", INVALID: "invalid", REFUSED: "refused", WAITS: "waits"}


class BadRequest(ValueError):
    """The request, as written on the command line, cannot be understood."""


def device_request(gpus: str) -> dict[str, Any]:
    """``--gpus`` as the docker CLI reads it: ``all``, ``N``, or CSV ``device=…,count=…``."""
    if gpus == "all":
        return {"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}
    count = numbers.maybe(gpus, numbers.COUNT)
    if count is not None:
        return {"Driver": "", "Count": count, "Capabilities": [["gpu"]]}
    req: dict[str, Any] = {"Driver": "", "Count": 0, "Capabilities": [["gpu"]]}
    try:
        fields = next(csv.reader([gpus]), [])
    except csv.Error as e:
        raise BadRequest(f"--gpus {gpus!r}: {e}") from None
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep:
            raise BadRequest(f"--gpus {gpus!r}: '{field}' is not key=value")
        if key == "device":
            req["DeviceIDs"] = value.split(",")
        elif key == "count":
            req["Count"] = -1 if value == "all" else _int(value, gpus)
        elif key == "capabilities":
            req["Capabilities"] = [value.split(",")]
        elif key == "driver":
            req["Driver"] = value
        else:
            raise BadRequest(f"--gpus {gpus!r}: unknown option '{key}'")
    return req


def _int(value: str, gpus: str) -> int:
    try:
        return int(numbers.read(value, numbers.COUNT))
    except numbers.BadNumber as e:
        raise BadRequest(f"--gpus {gpus!r}: count: {e}, or 'all'") from None


def owner(name: str | None) -> Owner:
    """The named user, or whoever runs the command, with their groups."""
    try:
        pw = pwd.getpwnam(name) if name else pwd.getpwuid(os.getuid())
    except KeyError:
        raise BadRequest(f"--user {name}: no such user on this host") from None
    groups = [grp.getgrgid(g).gr_name for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if _has(g)]
    return Owner(pw.pw_uid, pw.pw_name, tuple(groups))


def _has(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def labels_of(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadRequest(f"--label {pair!r}: expected KEY=VALUE")
        out[key] = value
    unknown = gpu_labels.unknown(out)  # refused as the shim and the plugin refuse it
    if unknown:
        raise BadRequest(f"--label {unknown}")
    return out


def explain(
    alloc: Allocator, user: str | None, gpus: str, pairs: list[str], who: Owner | None = None
) -> dict[str, Any]:
    """The answer as data: ``code`` (the exit code), ``verdict``, ``message``, ``gpus``.
    ``who``: the asker as the shim knows them (its peer), instead of ``user``."""
    try:
        who = who or owner(user)
        given = labels_of(pairs)
        spec = {"HostConfig": {"DeviceRequests": [device_request(gpus)]}, "Labels": given}
    except BadRequest as e:
        return _answer(INVALID, str(e))
    base = {"user": who.user, "request": {"gpus": gpus, "labels": given}}
    fair = fair_share.table(alloc.fair_share, alloc.gather.rules.fair_share_half_life)
    if fair is not None:
        mine = [o for o in fair["owners"] if o["owner"] == who.user]
        base["fair_share"] = fair | {"owners": mine or [_no_use(who.user)]}
    want = wanted(given)
    if isinstance(want, Invalid):
        return base | _answer(INVALID, want.msg)
    resources = gpu_labels.resources(given)  # refused as the shim refuses them
    if isinstance(resources, str):
        return base | _answer(INVALID, f"gpu-alloc refused the container create: {resources}")
    ask = alloc.gather.decide(partial(decide.shim_ask, spec), decide.SHIM_ASK_READS)
    if isinstance(ask, decide.Deny):
        return base | _answer(INVALID, ask.msg)
    share = sharing.share_ask(given)
    if isinstance(share, str):
        return base | _answer(INVALID, share)
    result = alloc.book.plan(LeaseRequest(ask, "", who, want, resources, share=share))
    wait = wait_of(given, alloc.gather.rules)
    if isinstance(wait, Invalid):
        return base | _answer(INVALID, wait.msg)
    if isinstance(result, Shortage | Refusal) and result.waitable and wait:
        rank = priority_of(who, alloc.gather.rules)
        return (
            base
            | _answer(
                WAITS,
                f"would wait in line up to {ago(wait)} (priority {rank}) instead of being "
                f"refused now: {result.msg}",
            )
            | {"wait_s": wait, "priority": rank}
        )
    if isinstance(result, Shortage):
        return base | _answer(SHORT, result.msg)
    if isinstance(result, Refusal):
        return base | _answer(REFUSED, result.msg)
    if isinstance(result, Invalid):
        return base | _answer(INVALID, result.msg)
    uuids, pool = list(result.gpus), result.pool
    inventory = alloc.gather.inventory()
    index = {g.uuid: g.index for g in (*inventory.gpus, *inventory.migs)}  # a slice: its GPU's
    shown = ", ".join(f"GPU {index[u]} ({u})" for u in uuids)
    where = f" from pool '{pool}'" if pool else ""
    now = ledger.now()
    later = reservations.later(alloc.reservations.current(now), uuids, who, now, index)
    limit = timelimits.described(alloc.gather.rules, who, pool, want.time)
    notes = "".join(f"; {n}" for n in (limit, later, _share_note(alloc, share, uuids)) if n)
    return (
        base
        | _answer(FITS, f"would be granted now{where}: {shown}" + notes)
        | {
            "gpus": [{"index": index[u], "uuid": u} for u in uuids],
            "pool": pool,
            "time_limit_s": result.time_limit,
        }
    )


def _share_note(alloc: Allocator, share: sharing.ShareAsk | None, uuids: list[str]) -> str:
    """What the share would be: its GPU's rule in words (timeslice: no caps, no isolation)."""
    if share is None:
        return ""
    gpu = next(g for g in alloc.gather.inventory().gpus if g.uuid == uuids[0])
    rule = sharing.rule_for(gpu, alloc.gather.rules.sharing)
    return f"as {share.words()}, one of its {rule.said(gpu)}" if rule else ""


def _no_use(user: str) -> dict[str, Any]:
    return {"owner": user, "usage_gpu_hours": 0.0, "share": 0.0}


def _answer(code: int, message: str) -> dict[str, Any]:
    return {"code": code, "verdict": VERDICT.get(code, "error"), "message": message}
