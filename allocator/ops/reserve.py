"""``gpu-alloc reserve``, ``reserve cancel`` and ``reservations``: argparse and rendering.

Making and cancelling a reservation is root's (as ``doctor``): it changes who may be
placed on a GPU.  Listing them is anyone's: a user who cannot read the state directory
is answered by the shim's socket.  The work is `allocator.service.reserving.Reserving`'s.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import sys
from collections.abc import Callable
from typing import Any

from allocator.core.api import numbers
from allocator.core.leases.events import parse_time
from allocator.core.leases.holders import ago
from allocator.core.timing import reservations as rsv
from allocator.host import ledger
from allocator.host.config import Config
from allocator.service.views import wire
from allocator.service.views.reservations import listing
from allocator.service.wiring import connect

EXIT_FAIL, EXIT_USAGE = 1, 2
Add = Callable[[str, str], argparse.ArgumentParser]


def register(add: Add) -> None:
    """The commands, on the CLI's subparsers (``add(name, help)``)."""
    r = add("reserve", "keep GPUs for a user or group over a window (root)")
    r.add_argument("--gpus", type=_count, metavar="N", help="how many GPUs (picked now)")
    r.add_argument("--pool", help="the pool to pick --gpus N in")
    r.add_argument("--gpu", nargs="+", default=[], metavar="I", help="GPUs by index or UUID")
    r.add_argument("--for", dest="holder", metavar="USER|@GROUP", help="who may use them")
    r.add_argument("--from", dest="start", metavar="T", help="RFC 3339, 'now' or +30m")
    r.add_argument("--to", dest="end", metavar="T", help="RFC 3339 or +2h (from now)")
    r.add_argument("--note", default="", help="a note shown with it")
    c = r.add_subparsers(dest="action").add_parser("cancel", help="cancel a reservation")
    c.add_argument("id", help="its id (or a unique prefix), as 'gpu-alloc reservations' shows")
    r.set_defaults(func=cmd_reserve)
    s = add("reservations", "list the reservations not over yet")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_reservations)


def _count(text: str) -> int:
    """``--gpus N`` through the one number reader: argparse says its error, exit 2."""
    try:
        return int(numbers.read(text, numbers.COUNT))
    except numbers.BadNumber as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fail(text: str, code: int = EXIT_FAIL) -> int:
    print(f"gpu-alloc reserve: {text}", file=sys.stderr)
    return code


def _root(what: str) -> str | None:
    if os.geteuid() == 0:
        return None
    return (
        f"{what} changes who may use which GPU, which is root's: run it as 'sudo gpu-alloc {what}'"
    )


def cmd_reserve(cfg: Config, args: argparse.Namespace) -> int:
    if args.action == "cancel":
        return _cancel(cfg, args.id)
    refused = _root("reserve")
    if refused:
        return _fail(refused)
    if bool(args.gpu) == (args.gpus is not None):
        return _fail("give either --gpus N (with --pool P) or --gpu I…", EXIT_USAGE)
    if args.gpu and args.pool:
        return _fail("--pool goes with --gpus N; --gpu names GPUs itself", EXIT_USAGE)
    missing = [f for f, v in (("--for", args.holder), ("--from", args.start), ("--to", args.end))
               if not v]  # fmt: skip
    if missing:
        return _fail(f"{', '.join(missing)} missing", EXIT_USAGE)
    who = _holder_error(args.holder)
    if who:
        return _fail(who, EXIT_USAGE)
    now = ledger.now()
    try:
        window = (rsv.parse_time(args.start, now), rsv.parse_time(args.end, now))
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    alloc = connect(cfg)
    made = alloc.reservations.reserve(
        args.holder,
        window,
        gpus=tuple(args.gpu),
        count=args.gpus or 0,
        pool=args.pool,
        note=args.note,
        by=_me(),
    )
    if isinstance(made, str):
        return _fail(made)
    index = {g.uuid: g.index for g in alloc.gather.inventory().gpus}
    gpus = ",".join(str(index.get(u, u)) for u in made.gpus)
    what = f"GPU{'s' * (len(made.gpus) > 1)} {gpus}"
    print(
        f"{what} {rsv.held_text(made, ledger.now())}; 'gpu-alloc reserve cancel {made.id}' ends it"
    )
    return 0


def _cancel(cfg: Config, ident: str) -> int:
    refused = _root("reserve cancel")
    if refused:
        return _fail(refused)
    gone = connect(cfg).reservations.cancel(ident, by=_me())
    if isinstance(gone, str):
        return _fail(gone)
    print(f"reservation {gone.id} cancelled (was {rsv.held_text(gone, ledger.now())})")
    return 0


def cmd_reservations(cfg: Config, args: argparse.Namespace) -> int:
    now = ledger.now()
    if os.access(cfg.state_dir, os.R_OK | os.X_OK):
        found = listing(connect(cfg), now)
    else:  # not root (a refusal sends every user here): ask the shim, as status does
        found = wire.reservations(cfg.shim.socket)
    print(json.dumps(found, indent=1) if args.json else render_table(found, now))
    return 0


def render_table(found: list[dict[str, Any]], now: float) -> str:
    if not found:
        return "no reservations"
    lines = []
    for r in found:
        start, end = parse_time(r["from"]), parse_time(r["to"])
        gpus = ",".join(str(i) for i in r["gpus"])
        span = (
            f"until {rsv.when(end, now)} ({ago(end - now)} left)"
            if r["state"] == "active"
            else f"{rsv.when(start, now)} to {rsv.when(end, now)} (in {ago(start - now)})"
        )
        what = f"GPU{'s' * (len(r['gpus']) > 1)} {gpus}"
        if r["count"]:
            what += f" ({r['count']} picked{' in pool ' + r['pool'] if r['pool'] else ''})"
        note = f"  {r['note']}" if r["note"] else ""
        lines.append(f"{r['id']}  {r['state']:<8}  {r['for']:<12}  {what}  {span}{note}")
    return "\n".join(lines)


def _holder_error(holder: str) -> str | None:
    """A user or @group this host's NSS knows (a typo would reserve for nobody)."""
    try:
        if holder.startswith("@"):
            grp.getgrnam(holder[1:])
        else:
            pwd.getpwnam(holder)
    except KeyError:
        kind = "group" if holder.startswith("@") else "user"
        return f"--for {holder}: no such {kind} on this host (a group is written @NAME)"
    return None


def _me() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
