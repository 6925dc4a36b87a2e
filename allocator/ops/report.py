"""``gpu-alloc report``: its options, and the report as a table, JSON or CSV.

Root reads the state directory; a user in the docker group asks the shim, which
answers with their own rows only (`allocator.service.views.report`).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from typing import Any

from allocator.core.leases.events import rfc3339
from allocator.core.timing.report import BY
from allocator.host import ledger
from allocator.host.config import Config
from allocator.service.views import history, wire
from allocator.service.views import report as view

EXIT_CONFIG = 2
COLUMNS = (
    ("gpu_hours_held", "HELD GPU-h"),
    ("gpu_hours_used", "USED GPU-h"),
    ("gpu_hours_idle", "IDLE GPU-h"),
    ("gpu_hours_unsampled", "UNSAMPLED GPU-h"),  # neither used nor idle: not sampled
    ("grants", "GRANTS"),
    ("waits", "WAITS"),
    ("wait_seconds_total", "WAITED s"),
    ("wait_seconds_longest", "LONGEST s"),
)


def arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--since", default="30d", help="a duration back (30d, 12h) or an RFC 3339 time (30d)"
    )
    p.add_argument("--until", help="a duration back or an RFC 3339 time (default: now)")
    p.add_argument("--by", choices=BY, default="user", help="one row per (default: user)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--csv", action="store_true", help="comma-separated, with a header")
    return p


def command(cfg: Config, args: argparse.Namespace) -> int:
    now = ledger.now()
    try:
        since = history.since_epoch(args.since, now)
        until = None if args.until is None else history.since_epoch(args.until, now, "--until")
        if os.access(cfg.state_dir, os.R_OK | os.X_OK):
            got = view.build(cfg.state_dir, now, since, until, args.by)
        else:  # not root: the shim answers with the asker's own rows
            got = wire.report(cfg.shim.socket, since, until, args.by)
    except ValueError as e:
        print(f"gpu-alloc report: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(wire.encode(got) if args.json else render_csv(got) if args.csv else render_table(got))
    return 0


def _refusals(r: dict[str, Any]) -> str:
    return "; ".join(f"{k}: {n}" for k, n in sorted(r["refusals"].items())) or "-"


def _cells(r: dict[str, Any]) -> list[str]:
    return [f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k, _ in COLUMNS]


def render_table(got: dict[str, Any]) -> str:
    by = got["by"]
    if not got["rows"]:
        return f"no GPU use from {_when(got['since'])} to {_when(got['until'])}"
    table = [(by.upper(), *(title for _, title in COLUMNS), "REFUSALS")]
    for r in got["rows"]:
        table.append((r[by], *_cells(r), _refusals(r)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = [f"GPU time from {_when(got['since'])} to {_when(got['until'])}, by {by}"]
    for row in table:
        numbers = zip(row[1:-1], widths[1:], strict=True)
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in numbers)]
        lines.append("  ".join(cells) + "  " + row[-1])
    return "\n".join(lines)


def render_csv(got: dict[str, Any]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([got["by"], *(k for k, _ in COLUMNS), "refusals"])
    for r in got["rows"]:
        w.writerow([r[got["by"]], *(r[k] for k, _ in COLUMNS), _refusals(r)])
    return out.getvalue().rstrip("\n")


def _when(epoch: float) -> str:
    return rfc3339(epoch)[:19].replace("T", " ") + " UTC"
