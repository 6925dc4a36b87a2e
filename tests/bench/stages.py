"""Where a GPU create's time goes: its stages, stamped live in the shim and the plugin.

A gpu-alloc stack runs with `stage_site/sitecustomize.py` on its ``PYTHONPATH``, so its
shim and plugin stamp each stage of a GPU create as they run it (the monotonic clock every
process shares, and the thread's CPU), beside a bare dockerd and a dockerd behind the
floor plugin given the same request; every round visits the three in a fresh random
order, each create on a new connection as the CLI makes them.  The table gives each
stage's wall time (median and quartiles) and, for the work one thread does from start
to end, that thread's CPU: what the share of gpu-alloc above ``bare --gpus 1`` is made
of, process by process.

Run: ``python -m tests.bench.stages ROUNDS [CONTAINERS]`` (``make bench-stages``,
``CONTAINERS=1000`` for a busy host's plain containers on every Engine, made through
the Engine's own socket); the table is printed and written to ``bench-results/stages.md``.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from tests.bench import CUDA
from tests.bench.ab import GPU, PLAIN, create, remove
from tests.support import engine

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent / "stage_site"
OUT = ROOT / "bench-results" / "stages.md"

# The stamps of one GPU create in the order they happen, and who does the work up to
# the next one.  "client sends" and "client has it" are the driver's own.
STAGES = [
    ("client sends", "client connects; the shim's event loop wakes and accepts"),
    ("shim accepts", "shim: the peer's credentials and pidfd; the client sends"),
    ("shim reads the create", "shim, loop: the head parsed by llhttp, the body read whole"),
    ("shim has it whole", "shim, loop: the interceptor's task is scheduled"),
    ("shim's handler runs", "shim, loop: route, body decoded as dockerd does, labels read"),
    ("shim asks at hand", "shim, loop: the ask on the facts at hand"),
    ("shim asks at hand end", "shim: hop to the ledger pool; the loop connects upstream"),
    ("shim leases", "shim, ledger pool: owner, lock, ledger, plan, grant record"),
    ("shim leases end", "shim: hop back; the body rewritten and encoded; written upstream"),
    ("shim forwards", "dockerd reads the create and asks the plugin (AuthZReq)"),
    ("plugin reads AuthZReq", "plugin, loop: envelope, body decoded and judged, lease read"),
    ("plugin answers AuthZReq", "dockerd creates the container: its own work"),
    ("plugin reads AuthZRes", "plugin: the envelope read; the bind on its pool (below)"),
    ("plugin answers AuthZRes", "dockerd answers the shim"),
    ("shim reads the 201", "shim, loop: answer read whole, grant durable awaited, encoded"),
    ("shim answers", "shim writes the answer; the client reads it"),
    ("client has it", ""),
]
# Stages one thread runs from start to end: its CPU is printed beside the wall time.
ONE_THREAD = {
    "shim's handler runs": "shim asks at hand",
    "shim asks at hand": "shim asks at hand end",
    "shim leases": "shim leases end",
    "plugin reads AuthZReq": "plugin answers AuthZReq",
}
# Work handed to a pool inside the stages above: (stamp, what runs).
BESIDE = [
    ("grant durable", "shim, grant pool: the grant's fsync and its audit line, beside dockerd"),
    ("plugin binds", "plugin, pool: the AuthZRes's bind record, inside its stage above"),
]


def _stamps(folder: Path, since: int) -> dict[str, tuple[int, int]]:
    """The first stamp of each tag at or after ``since``: (monotonic ns, thread CPU ns)."""
    seen: list[tuple[int, str, int]] = []
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            tag, mono, cpu = line.split("\t")
            if int(mono) >= since:
                seen.append((int(mono), tag, int(cpu)))
    first: dict[str, tuple[int, int]] = {}
    for mono, tag, cpu in sorted(seen):
        first.setdefault(tag, (mono, cpu))
    return first


def _quartiles(xs: list[float]) -> str:
    s = sorted(xs)
    return f"{s[len(s) // 4]:,.0f}-{s[3 * len(s) // 4]:,.0f}"


def main(rounds: int, containers: int = 0) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="stages-", dir="/tmp"))
    folder = tmp / "stamps"
    folder.mkdir()
    stack = bare = floor = None
    floor_proc = None
    try:
        os.environ["GA_STAGES_DIR"] = str(folder)  # the stack's processes inherit both
        os.environ["PYTHONPATH"] = str(SITE)
        stack = engine.Stack(tmp / "s", gpus=8, cuda=CUDA).start()
        del os.environ["GA_STAGES_DIR"], os.environ["PYTHONPATH"]
        floor_sock = str(tmp / "floor.sock")
        floor_proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.floor", floor_sock], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        engine.wait_until(
            lambda: engine.can_connect(floor_sock), "floor plugin", floor_proc, tmp / "none", 30
        )
        bare = engine.Dockerd(tmp / "b").start()
        floor = engine.Dockerd(tmp / "f", authz_plugin_socket=floor_sock).start()
        for sock in (bare.sock, floor.sock):
            engine.import_busybox(sock)
        targets = {
            "bare --gpus 1": bare.sock,
            "floor --gpus 1": floor.sock,
            "shim --gpus 1": stack.shim_sock,
        }
        for sock in (bare.sock, floor.sock, stack.engine_sock):  # a busy host's containers
            for _ in range(containers):
                create(sock, PLAIN)
        for sock in targets.values():  # warm up
            for _ in range(10):
                remove(sock, create(sock, GPU))
        walls: dict[str, list[float]] = {t: [] for t in targets}
        creates: list[dict[str, tuple[int, int]]] = []
        for _ in range(rounds):
            for target in random.sample(list(targets), len(targets)):
                sock = targets[target]
                t0 = time.monotonic_ns()
                cid = create(sock, GPU)
                t1 = time.monotonic_ns()
                walls[target].append((t1 - t0) / 1e6)
                if target == "shim --gpus 1":
                    time.sleep(0.02)  # the grant's durability and the stamps written
                    got = _stamps(folder, t0)
                    got["client sends"], got["client has it"] = (t0, 0), (t1, 0)
                    creates.append(got)
                remove(stack.engine_sock if target == "shim --gpus 1" else sock, cid)
    finally:
        for thing in (stack, bare, floor):
            if thing is not None:
                thing.stop()
        if floor_proc is not None:
            engine.stop_process(floor_proc)
        shutil.rmtree(tmp, ignore_errors=True)
    _report(rounds, containers, walls, creates)


Stamps = dict[str, tuple[int, int]]


def _report(
    rounds: int, containers: int, walls: dict[str, list[float]], creates: list[Stamps]
) -> None:
    bare = median(walls["bare --gpus 1"])
    share = median(walls["shim --gpus 1"]) - bare
    lines = [
        f"GPU creates on a new connection each, {rounds} rounds, {containers} other containers"
        " on each Engine, medians: "
        + "; ".join(f"{t} {median(xs):.2f} ms" for t, xs in walls.items())
        + f"; the shim's share above bare --gpus 1: {share:+.2f} ms.",
        "",
        "| from | to | what runs | wall, µs (quartiles) | that thread's CPU, µs |",
        "|---|---|---|---|---|",
    ]
    whole = [c for c in creates if all(name in c for name, _ in STAGES)]
    for (name, what), (following, _) in itertools.pairwise(STAGES):
        xs = [(c[following][0] - c[name][0]) / 1000 for c in whole]
        cpu = ""
        if ONE_THREAD.get(name) == following:
            cpu = f"{median([(c[following][1] - c[name][1]) / 1000 for c in whole]):,.0f}"
        wall = f"{median(xs):,.0f} ({_quartiles(xs)})"
        lines.append(f"| {name} | {following} | {what} | {wall} | {cpu} |")
    for start, what in BESIDE:
        end = f"{start} end"
        spans = [c for c in whole if start in c and end in c]
        if not spans:
            continue
        wall = [(c[end][0] - c[start][0]) / 1000 for c in spans]
        cpu = [(c[end][1] - c[start][1]) / 1000 for c in spans]
        ahead = sum(c[end][0] < c["shim reads the 201"][0] for c in spans)
        lines.append(
            f"| {start} | {end} | {what} (ended before the 201 reached the shim: {ahead} of "
            f"{len(spans)}) | {median(wall):,.0f} ({_quartiles(wall)}) | {median(cpu):,.0f} |"
        )
    lines.append(f"\n{len(whole)} of {len(creates)} creates had every stamp.")
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
