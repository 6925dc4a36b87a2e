"""``gpu-alloc``: serve the plugin or the shim, show and repair the ledger.

The servers live in plugin/ and shim/; this module only wires a config into
them, so the library stays free of sockets.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import sys
from typing import Any

from allocator.core.access.facts import EngineView
from allocator.core.api import numbers
from allocator.core.leases.leases import StateError
from allocator.core.machine.inventory import InventoryError
from allocator.host import config as configmod
from allocator.host.config import Config, ConfigError
from allocator.host.devices import source_for
from allocator.host.engine import EngineError
from allocator.ops import notify, report, reserve
from allocator.service import gather
from allocator.service.wiring import Allocator, connect

EXIT_FAIL = 1
EXIT_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    cfg: Config | None = None
    try:
        cfg = configmod.load(args.config)
        if cfg.metrics.listen and args.command in ("plugin", "shim"):
            from allocator.host import metrics

            metrics.enable(cfg.state_dir)  # before the servers fork their workers
        return int(args.func(cfg, args) or 0)
    except BrokenPipeError:  # `gpu-alloc status --json | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        return 0
    except ConfigError as e:
        print(f"gpu-alloc: config error: {e}", file=sys.stderr)
        return EXIT_FAIL if args.command == "explain" else EXIT_CONFIG  # 2 means "short" there
    except (StateError, EngineError, InventoryError, StartupError, OSError) as e:
        print(f"gpu-alloc: {e}{_unreadable_hint(cfg, e, args.command)}", file=sys.stderr)
        return EXIT_FAIL


def _unreadable_hint(cfg: Config | None, e: Exception, command: str) -> str:
    """A user in the docker group may run every command, but only status, gpus, explain,
    report and reservations ask the shim: the others read the root-only state directory."""
    if cfg is None or not isinstance(e, StateError | PermissionError):
        return ""
    if command in _ASK_THE_SHIM:
        return ""  # it did ask, and its message says how that went
    if os.access(cfg.state_dir, os.R_OK | os.X_OK):
        return ""
    return (
        f"; this command reads gpu-alloc's state directory ({cfg.state_dir}), which is "
        "root's: run it with sudo, or use 'gpu-alloc status', 'gpus' or 'explain', which ask "
        "the gpu-alloc socket instead"
    )


_ASK_THE_SHIM = ("status", "gpus", "explain", "report", "reservations")


class StartupError(Exception):
    """The host is configured so that gpu-alloc could not keep its promise."""


def _common(suppress: bool) -> argparse.ArgumentParser:
    """Options accepted before the subcommand and after it (``status --config x``).

    After it they default to SUPPRESS, so they never undo what was given before it.
    """
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument(
        "--config",
        default=argparse.SUPPRESS if suppress else None,
        help=f"config file (default: ${configmod.ENV_VAR}, else {configmod.DEFAULT_PATH})",
    )
    c.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS if suppress else False
    )
    return c


def _version() -> str:
    try:
        return importlib.metadata.version("gpu-alloc")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-alloc",
        description="Exclusive GPUs for docker run, Compose and the Docker SDK on one host.",
        parents=[_common(suppress=False)],
    )
    p.add_argument("--version", action="version", version=f"gpu-alloc {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    common = [_common(suppress=True)]

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=common)

    add("plugin", "serve the Docker authorization plugin").set_defaults(func=cmd_plugin)
    add("shim", "serve the rewriting Engine API socket").set_defaults(func=cmd_shim)
    s = add("status", "show which GPUs are free and who holds the rest")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument(
        "--no-reconcile",
        action="store_true",
        help="show the ledger as it is, without asking the Engine",
    )
    s.set_defaults(func=cmd_status)
    e = add("explain", "say whether a GPU request would be granted now, and why not")
    e.add_argument("--user", help="as this user (default: you)")
    e.add_argument("--gpus", default="1", help="as docker run --gpus: N, all, device=0,1")
    e.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="a request label (repeat)"
    )
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.set_defaults(func=cmd_explain)
    r = add("repair", "re-read the Engine and rebuild or clean the ledger")
    r.add_argument(
        "--reset",
        action="store_true",
        help="start from an empty ledger (after moving a corrupt one aside)",
    )
    r.set_defaults(func=cmd_repair)
    h = add("history", "who used which GPU when (from the audit trail)")
    h.add_argument("--gpu", help="a GPU index (as recorded) or UUID prefix")
    h.add_argument("--user", help="only this owner's events")
    h.add_argument("--since", help="a duration (7d, 12h, 30m) or an RFC 3339 time")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.set_defaults(func=cmd_history)
    report.arguments(
        add("report", "GPU-hours held, used and idle, waits and refusals, per user or more")
    ).set_defaults(func=report.command)
    g = add("gpus", "live GPU use: utilisation, memory, processes, owners")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.set_defaults(func=cmd_gpus)
    hl = add("health", "show GPU health, or clear a GPU an operator fixed")
    hs = hl.add_subparsers(dest="action")
    c = hs.add_parser("clear", help="mark a GPU healthy again (index, UUID or UUID prefix)")
    c.add_argument("gpu")
    hl.set_defaults(func=cmd_health)
    reserve.register(add)
    notify.register(add)
    add("doctor", "check the host end to end and say what to fix").set_defaults(func=cmd_doctor)
    sw = add("swarm", "give this node's swarm.gpus to Docker Swarm").add_subparsers(
        dest="action", required=True
    )
    sc = sw.add_parser("configure", help="write daemon.json's and the toolkit's swarm settings")
    sc.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    sc.set_defaults(func=cmd_swarm)
    w = add("ready", "wait until the plugin's or the shim's socket (from the config) answers")
    w.add_argument("role", choices=("plugin", "shim"))
    w.add_argument("--timeout", type=_seconds, default=30.0, help="seconds (default 30)")
    w.set_defaults(func=cmd_ready)
    return p


def _seconds(text: str) -> float:
    """``--timeout``, through the one number reader: argparse says its error, exit 2."""
    try:
        return float(numbers.read(text, SECONDS))
    except numbers.BadNumber as e:
        raise argparse.ArgumentTypeError(str(e)) from None


SECONDS = numbers.Kind("a number of seconds such as 30", fraction=True, high=86400)


def check_pools(cfg: Config) -> None:
    """A pool naming a GPU the host lacks stops the service at start, as a config error.
    An unreadable inventory leaves nothing to check against: GPU creates are refused then,
    with that reason, and the rest goes on."""
    try:
        inventory = source_for(cfg.gpus).inventory()
    except InventoryError:
        return
    gather.check_pools(cfg.source, cfg.policy.rules, inventory)


def check_default_runtime(cfg: Config, info: dict[str, Any] | None = None) -> None:
    """Refuse to run where every container would get the toolkit (and so the image's ENV),
    but on a node that gives GPUs to swarm (whose tasks get no runtime of their own): there
    every create is judged as under the nvidia runtime, and needs a lease or the void pin."""
    if cfg.swarm.configured:
        return
    if info is not None:
        view = EngineView.from_info(info)
    else:
        try:
            with open(cfg.engine.daemon_json) as f:
                view = EngineView.from_daemon_json(json.load(f))
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError) as e:
            raise StartupError(f"{cfg.engine.daemon_json}: cannot read: {e}") from None
    if view.default_is_nvidia:
        raise StartupError(
            f"the Engine's default runtime is '{view.default_runtime}': every container "
            "would run the NVIDIA hook and an image's own NVIDIA_VISIBLE_DEVICES could grant "
            f'GPUs. Remove "default-runtime" from {cfg.engine.daemon_json}, restart Docker, '
            "and request GPUs with --gpus instead (or, on a Docker Swarm node, give it GPUs "
            "in the swarm: section, which makes every create pin NVIDIA_VISIBLE_DEVICES=void)"
        )


def cmd_plugin(cfg: Config, args: argparse.Namespace) -> int:
    check_pools(cfg)
    check_default_runtime(cfg)
    from plugin.serve import serve

    serve(cfg)
    return 0


def cmd_shim(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.host import listener

    check_pools(cfg)
    claim = listener.claim(cfg.shim.socket, "gpu-alloc shim")  # before touching the ledger
    try:
        alloc = connect(cfg)
        assert alloc.engine is not None
        check_default_runtime(cfg, alloc.engine.info())
        if not cfg.health.disabled:
            from allocator.host.watcher import watch

            watch(alloc)
        log = logging.getLogger("gpu-alloc.shim")
        try:
            report = alloc.reconciler.reconcile(adopt=True)
        except InventoryError as e:
            # Work that touches no GPU goes on; GPU creates are refused with this reason.
            log.warning("not reconciled at start: %s", e)
        else:
            if report:
                log.info("reconciled at start: %s", report)
        alloc.restarts.check_restarts()  # what a dockerd restart would start must be leased
        from shim.serve import serve

        serve(cfg, alloc, claim)
    finally:
        claim.close()
    return 0


def cmd_status(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops.status import render_json, render_table
    from allocator.service.views import wire
    from allocator.service.views.status import snapshot

    alloc = connect(cfg)
    warning = None
    try:
        if not args.no_reconcile:
            try:
                alloc.reconciler.reconcile(adopt=True)
            except EngineError as e:
                warning = f"showing the ledger only: {e}"
        snap = snapshot(alloc)
        snap["queue"] = wire.queue(cfg.shim.socket)
    except StateError as e:
        if os.access(cfg.state_dir, os.R_OK | os.X_OK):
            raise
        snap = wire.status(cfg.shim.socket, why=str(e))  # not root: ask the shim instead
    if warning:
        snap["warning"] = warning
    print(render_json(snap) if args.json else render_table(snap))
    return 0


def cmd_history(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.host import ledger
    from allocator.host.audit import AuditLog
    from allocator.ops.history import render_json, render_table
    from allocator.service.views import history

    try:
        since = None if args.since is None else history.since_epoch(args.since, ledger.now())
    except ValueError as e:
        print(f"gpu-alloc history: {e}", file=sys.stderr)
        return EXIT_CONFIG
    audit = AuditLog(cfg.state_dir)
    if not os.access(cfg.state_dir, os.R_OK | os.X_OK):
        raise StateError(f"{audit.path}: cannot read the audit trail (run as root)")
    rows = history.select(history.uses(audit.read()), args.gpu, args.user, since)
    history.with_gpu_hours(rows, ledger.now())
    print(render_json(rows) if args.json else render_table(rows))
    return 0


def cmd_gpus(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops.gpus import render_json, render_table
    from allocator.service.views import wire
    from allocator.service.views.gpus import LiveView

    if os.access(cfg.state_dir, os.R_OK | os.X_OK):
        snap = LiveView(connect(cfg)).snapshot()
    else:  # not root: ask the shim, as status does
        snap = wire.gpus(cfg.shim.socket)
    print(render_json(snap) if args.json else render_table(snap))
    return 0


def cmd_repair(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops.repair import repair

    print(repair(connect(cfg), reset=args.reset))
    return 0


def cmd_explain(cfg: Config, args: argparse.Namespace) -> int:
    """Exit 0 fits, 2 short of GPUs, 3 invalid request, 4 refused by policy, 5 would wait
    in line (short or at the limit, with io.gpu-alloc.wait or policy.wait.default), 1 no
    answer."""
    from allocator.ops.explain import render
    from allocator.service.views import wire
    from allocator.service.views.explain import explain

    alloc = connect(cfg)
    try:
        try:
            # frees what removed containers left, so "short" is current
            alloc.reconciler.reconcile()
        except EngineError as e:
            logging.getLogger("gpu-alloc").warning("answering from the ledger only: %s", e)
        answer = explain(alloc, args.user, args.gpus, args.label)
    except StateError as e:
        if os.access(cfg.state_dir, os.R_OK | os.X_OK) or args.user:
            raise
        # not root: the shim answers for whoever asks it (it knows them by their socket)
        answer = wire.explain(cfg.shim.socket, args.gpus, args.label, why=str(e))
    print(render(answer, args.json))
    return int(answer["code"])


def cmd_health(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.core.machine import health

    alloc = Allocator(cfg)
    inventory = alloc.gather.inventory()
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

    if os.geteuid() != 0:
        print(
            "gpu-alloc doctor reads the state dir, the Engine socket and daemon.json, which "
            "need root: run it as 'sudo gpu-alloc doctor'",
            file=sys.stderr,
        )
        return EXIT_FAIL

    lines, healthy = doctor.run(cfg)
    for line in lines:
        print(line.render(args.verbose))
    print("healthy" if healthy else "problems found: apply the fixes above, then run doctor again")
    return 0 if healthy else EXIT_FAIL


def cmd_swarm(cfg: Config, args: argparse.Namespace) -> int:
    from allocator.ops import swarm

    return swarm.configure(cfg, args.dry_run)


def cmd_ready(cfg: Config, args: argparse.Namespace) -> int:
    """systemd's ExecStartPost: a unit counts as started once its socket, wherever the
    config puts it, answers (a stale socket file exists but does not)."""
    from allocator.host import listener

    path = cfg.plugin.socket if args.role == "plugin" else cfg.shim.socket
    if listener.wait_until_answers(path, args.timeout):
        return 0
    print(
        f"gpu-alloc {args.role}: {path} did not answer within {args.timeout:g} s", file=sys.stderr
    )
    return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
