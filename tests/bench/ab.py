"""A/B: GPU creates through this checkout and through another revision, interleaved.

On a shared 2-core machine the bare Engine's own create time moves by half between
runs a few minutes apart, so two `make bench` runs cannot tell a 1 ms change from
noise.  This runs both revisions' stacks at once, beside one bare dockerd, and visits
them in a fresh random order every round: the noise hits all alike.  The verdict is the
median of the round-by-round differences, with a 95% interval: a change whose interval
holds 0 is not one this run could see (and, for a change that leaves the plain create
alone, the GPU create's difference less the plain create's, which takes away what two
stacks of the same code differ by in one run).  Two more rows take a GPU create apart: ``bare
--gpus 1`` is dockerd's own GPU work, ``shim plain`` the shim's path for a create
with no GPU (decoded, judged, rewritten, relayed, its creator recorded; no lease), through
both revisions.

Run: ``python -m tests.bench.ab REV [ROUNDS] [run|burst]`` (``make bench-ab REV=...
[ROUNDS=...] [WHAT=run|burst]``).  REV is checked out into a temporary worktree; its shim
and plugin run from there (first on ``PYTHONPATH``), with this checkout's test harness
and venv.  ``run`` times ``docker run --rm`` (``--gpus 1`` through the shims) instead
of API creates; ``burst`` times creates eight in a row, kept until all are made (a busy
host: each GPU create finds the ones before it holding their GPUs).
"""

from __future__ import annotations

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
from tests.bench.client import API, Conn
from tests.bench.report import median_interval
from tests.support import engine

ROOT = Path(__file__).resolve().parents[2]
GPU = {"Image": engine.BUSYBOX_TAG, "Cmd": ["true"],
       "HostConfig": {"DeviceRequests": [{"Driver": "", "Count": 1,
                                          "Capabilities": [["gpu"]]}]}}  # fmt: skip
PLAIN = {"Image": engine.BUSYBOX_TAG, "Cmd": ["true"]}
BURST = 8  # creates in a row for ``burst``: as many as each stack has GPUs


def create(sock: str, spec: dict) -> str:
    conn = Conn(sock)
    try:
        status, body = conn.call("POST", f"{API}/containers/create", spec)
    finally:
        conn.close()
    if status != 201 or not isinstance(body, dict):
        raise RuntimeError(f"create on {sock} answered {status}: {body}")
    return body["Id"]


def remove(sock: str, cid: str) -> None:
    conn = Conn(sock)
    try:
        conn.call("DELETE", f"{API}/containers/{cid}?force=1")
    finally:
        conn.close()


def burst(sock: str, spec: dict) -> float:
    """Mean ms of `BURST` creates in a row, each kept until all are made (a GPU create
    finds the ones before it holding their GPUs, as in a ``compose up``), then removed."""
    made, took = [], 0.0
    for _ in range(BURST):
        t0 = time.perf_counter()
        made.append(create(sock, spec))
        took += time.perf_counter() - t0
    for cid in made:
        remove(sock, cid)
    return took * 1000 / BURST


def docker_run(sock: str, gpus: bool) -> float:
    """Wall time in ms of ``docker run --rm`` (``--gpus 1``) on ``sock``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    args = ["--gpus", "1"] if gpus else []
    t0 = time.perf_counter()
    argv = ["docker", "-H", f"unix://{sock}", "run", "--rm", *args, engine.BUSYBOX_TAG, "true"]
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return (time.perf_counter() - t0) * 1000


def main(rev: str, rounds: int, what: str = "create") -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))
    other = tmp / "rev"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other), rev],
                   check=True, capture_output=True)  # fmt: skip
    stacks: list[engine.Stack] = []
    bare = None
    try:
        os.environ["PYTHONPATH"] = str(other)  # the stack's processes inherit it
        stacks.append(engine.Stack(tmp / "o", gpus=8, cuda=CUDA).start())
        del os.environ["PYTHONPATH"]
        stacks.append(engine.Stack(tmp / "n", gpus=8, cuda=CUDA).start())
        bare = engine.Dockerd(tmp / "b").start()
        engine.import_busybox(bare.sock)
        old, new = stacks
        cases = {
            "bare": (bare.sock, PLAIN),
            "bare --gpus 1": (bare.sock, GPU),
            f"{rev} shim plain": (old.shim_sock, PLAIN),
            "this shim plain": (new.shim_sock, PLAIN),
            f"{rev} shim --gpus 1": (old.shim_sock, GPU),
            "this shim --gpus 1": (new.shim_sock, GPU),
            f"{rev} plugin": (old.engine_sock, PLAIN),
            "this plugin": (new.engine_sock, PLAIN),
        }
        ms: dict[str, list[float]] = {name: [] for name in cases}
        for sock, spec in cases.values():  # warm up
            for _ in range(5):
                remove(sock, create(sock, spec))
        for _ in range(rounds):
            for name in random.sample(list(cases), len(cases)):
                sock, spec = cases[name]
                if what == "run":
                    ms[name].append(docker_run(sock, spec is GPU))
                    continue
                if what == "burst":
                    ms[name].append(burst(sock, spec))
                    continue
                t0 = time.perf_counter()
                cid = create(sock, spec)
                ms[name].append((time.perf_counter() - t0) * 1000)
                remove(sock, cid)
    finally:
        for stack in stacks:
            stack.stop()
        if bare is not None:
            bare.stop()
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)],
                       check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)  # the stacks' state directories
    base = median(ms["bare"])
    title = {"run": "docker run --rm", "burst": f"API create, {BURST} in a row (ms each)"}.get(
        what, "API create"
    )
    print(f"{title}, {rounds} rounds, medians (ratio and ms over the bare Engine):")
    for name, xs in ms.items():
        m = median(xs)
        print(f"  {name:32s} {m:7.2f} ms  {m / base:5.2f}x  +{m - base:5.2f} ms")
    print("this checkout minus REV, round by round (median, and its 95% interval):")
    diffs = {
        kind: [a - b for a, b in zip(ms[f"this {kind}"], ms[f"{rev} {kind}"], strict=True)]
        for kind in ("shim --gpus 1", "shim plain", "plugin")
    }
    # Two stacks of the same code differ by a few tenths of a millisecond on some runs
    # (where their processes landed): a change that leaves the plain create alone reads
    # best against it, the GPU create's difference less the plain create's.
    diffs["shim --gpus 1, less plugin's"] = [
        g - p for g, p in zip(diffs["shim --gpus 1"], diffs["plugin"], strict=True)
    ]
    for kind, ds in diffs.items():
        m, (low, high) = median(ds), median_interval(ds)
        print(f"  {kind:32s} {m:+7.2f} ms  [{low:+.2f}, {high:+.2f}]")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 80, *sys.argv[3:4])
