"""``gpu-alloc``: serve the plugin or the shim, show and repair the ledger.

The servers live in plugin/ and shim/; this module only wires a config into
them, so the library stays free of sockets.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from allocator.core.inventory import InventoryError
from allocator.core.leases import StateError
from allocator.host import config as configmod
from allocator.host.config import Config, ConfigError
from allocator.host.engine import Engine, EngineError
from allocator.service import Allocator

EXIT_FAIL = 1
EXIT_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "plugin":
        # gunicorn's gevent workers patch the stdlib; do it before anything imports ssl.
        from gevent import monkey

        monkey.patch_all()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        cfg = configmod.load(args.config)
        return int(args.func(cfg, args) or 0)
    except ConfigError as e:
        print(f"gpu-alloc: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except (StateError, EngineError, InventoryError, StartupError, OSError) as e:
        print(f"gpu-alloc: {e}", file=sys.stderr)  # e.g. a socket path that cannot be bound
        return EXIT_FAIL


class StartupError(Exception):
    """The host is configured so that gpu-alloc could not keep its promise."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-alloc",
        description="Exclusive GPUs for docker run, Compose and the Docker SDK on one host.",
    )
    p.add_argument(
        "--config",
        help=f"config file (default: ${configmod.ENV_VAR}, else {configmod.DEFAULT_PATH})",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("plugin", help="serve the Docker authorization plugin").set_defaults(
        func=cmd_plugin
    )
    sub.add_parser("shim", help="serve the rewriting Engine API socket").set_defaults(func=cmd_shim)
    s = sub.add_parser("status", help="show which GPUs are free and who holds the rest")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument(
        "--no-reconcile",
        action="store_true",
        help="show the ledger as it is, without asking the Engine",
    )
    s.set_defaults(func=cmd_status)
    r = sub.add_parser("repair", help="re-read the Engine and rebuild or clean the ledger")
    r.add_argument(
        "--reset",
        action="store_true",
        help="start from an empty ledger (after moving a corrupt one aside)",
    )
    r.set_defaults(func=cmd_repair)
    h = sub.add_parser("health", help="show GPU health, or clear a GPU an operator fixed")
    hs = h.add_subparsers(dest="action")
    c = hs.add_parser("clear", help="mark a GPU healthy again (index, UUID or UUID prefix)")
    c.add_argument("gpu")
    h.set_defaults(func=cmd_health)
    sub.add_parser("doctor", help="check the host end to end and say what to fix").set_defaults(
        func=cmd_doctor
    )
    return p


def _allocator(cfg: Config) -> Allocator:
    return Allocator(cfg, Engine(cfg.engine.socket, cfg.engine.timeout))


def check_default_runtime(cfg: Config, info: dict[str, Any] | None = None) -> None:
    """Refuse to run where every container would get the toolkit (and so the image's ENV)."""
    default = None
    if info is not None:
        default = info.get("DefaultRuntime")
    else:
        try:
            with open(cfg.engine.daemon_json) as f:
                default = json.load(f).get("default-runtime")
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise StartupError(f"{cfg.engine.daemon_json}: cannot read: {e}") from None
    if default and "nvidia" in str(default).lower():
        raise StartupError(
            f"the Engine's default runtime is '{default}': every container would run the "
            "NVIDIA hook and an image's own NVIDIA_VISIBLE_DEVICES could grant GPUs. Remove "
            f'"default-runtime" from {cfg.engine.daemon_json}, restart Docker, and request '
            "GPUs with --gpus instead"
        )


def cmd_plugin(cfg: Config, args: argparse.Namespace) -> int:
    check_default_runtime(cfg)
    from plugin.serve import serve

    serve(cfg)
    return 0


def cmd_shim(cfg: Config, args: argparse.Namespace) -> int:
    alloc = _allocator(cfg)
    assert alloc.engine is not None
    check_default_runtime(cfg, alloc.engine.info())
    if not cfg.health.disabled:
        from allocator.host.watcher import watch

        watch(alloc)
    report = alloc.reconcile(adopt=True)
    if report:
        logging.getLogger("gpu-alloc.shim").info("reconciled at start: %s", report)
    from shim.serve import serve

    serve(cfg, alloc)
    return 0


def cmd_status(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops.status import from_shim, render_json, render_table, snapshot

    alloc = _allocator(cfg)
    warning = None
    try:
        if not args.no_reconcile:
            try:
                alloc.reconcile(adopt=True)
            except EngineError as e:
                warning = f"showing the ledger only: {e}"
        snap = snapshot(alloc)
    except StateError as e:
        if os.access(cfg.state_dir, os.R_OK | os.X_OK):
            raise
        snap = from_shim(cfg.shim.socket, why=str(e))  # not root: ask the shim instead
    if warning:
        snap["warning"] = warning
    print(render_json(snap) if args.json else render_table(snap))
    return 0


def cmd_repair(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops.repair import repair

    print(repair(_allocator(cfg), reset=args.reset))
    return 0


def cmd_health(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.core import health

    alloc = Allocator(cfg)
    inventory = alloc.inventory()
    if args.action == "clear":
        try:
            gpu = inventory.resolve(args.gpu)
        except LookupError as e:
            print(f"gpu-alloc: {e}", file=sys.stderr)
            return EXIT_FAIL
        with alloc.health.transaction() as box:
            was = box[0].of(gpu.uuid)
            box[0] = health.clear(box[0], gpu.uuid)
        print(
            f"GPU {gpu.index} ({gpu.uuid}) cleared (was: {was.reason()})"
            if not was.healthy
            else f"GPU {gpu.index} ({gpu.uuid}) was already healthy"
        )
        return 0
    current = alloc.health.read()
    for g in inventory.gpus:
        h = current.of(g.uuid)
        state = "healthy" if h.healthy else f"unhealthy: {h.reason()}"
        print(f"GPU {g.index} {g.uuid}: {state}; {h.single_bit} single-bit ECC errors")
    return 0


def cmd_doctor(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops import doctor

    lines, healthy = doctor.run(cfg)
    for line in lines:
        print(line.render())
    print("healthy" if healthy else "problems found: apply the fixes above, then run doctor again")
    return 0 if healthy else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
