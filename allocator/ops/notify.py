"""``gpu-alloc notify test [--user U]`` and doctor's notices row.

The test sends one notice through each sink now (not through the outbox), as the
shim's worker would, and says what each answered: the way to check a webhook's URL and
the mail settings before a real notice depends on them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from allocator.host.config import Config
from allocator.host.outbox import Outbox
from allocator.service.wiring import connect

OK, WARN = "ok", "warn"
STUCK = 10  # notices waiting in the outbox before doctor warns


def register(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """The command, on the CLI's subparsers (``add(name, help)``)."""
    n = add("notify", "notices to people (notify: in the config)")
    t = n.add_subparsers(dest="action", required=True).add_parser(
        "test", help="send a test notice through each webhook and the mail now"
    )
    t.add_argument("--user", default="", help="mail it to this user's address")
    n.set_defaults(func=cmd_notify)


def cmd_notify(cfg: Config, args: argparse.Namespace) -> int:
    if not cfg.notify.on:
        print("gpu-alloc notify: no sink is set (notify.webhooks, notify.smtp)", file=sys.stderr)
        return 1
    sent = connect(cfg).notifier.trial(args.user)
    if args.user and not any(sink == "mail" for sink, _ in sent) and cfg.notify.smtp:
        print(f"{args.user}: no address (notify.addresses), so no mail")
    for sink, error in sent:
        print(f"{sink}: " + ("sent" if error is None else f"FAILED: {error}"))
    return 0 if all(error is None for _, error in sent) else 1


def check(cfg: Config) -> tuple[str, str, str]:
    """Doctor's row: the outbox's size and the sinks failing now."""
    if not cfg.notify.on:
        return OK, "notices: off (no notify.webhooks or notify.smtp)", ""
    entries = Outbox(cfg.state_dir).entries()
    failing = sorted({f"{n}: {s.error}" for e in entries for n, s in e.sinks.items() if s.failures})
    what = f"notices: {len(entries)} waiting in the outbox"
    if failing:
        return WARN, f"{what}; failing: {'; '.join(failing[:3])}", "gpu-alloc notify test"
    if len(entries) >= STUCK:
        return WARN, what + " (is the shim running?)", "systemctl status gpu-alloc-shim"
    return OK, what, ""
