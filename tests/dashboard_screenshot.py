"""Regenerate docs/dashboard.png: `.venv/bin/python -m tests.dashboard_screenshot`
(``OUT.png [7d]``: the page at 7 days instead of 24 hours).

Six simulated H100s in two pools: alice computes with 30 minutes of her time limit
left, bob's notebook has idled for hours, carol's sweep started ten minutes ago, one
GPU took an Xid 79 and one is free; dave waits in line.  Below, the last 24 hours
from a scripted audit trail and utilisation samples, with erin's reservation of two
GPUs drawn ahead (their tiles say so).  The page is the real dashboard
served by the real listener; only the GPUs, the Engine and the line are stand-ins.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from allocator.core.judging.ask import Ask
from allocator.core.leases import events
from allocator.core.machine.health import XID, GpuEvent, HealthPolicy, observe
from allocator.core.rules.policy import Pool, Rules
from allocator.host import usage
from allocator.host.config import Config
from allocator.host.samples import _day
from allocator.service.placer import LeaseRequest
from allocator.service.views import gpus
from allocator.service.wiring import Allocator
from shim import metrics_server
from tests.support.fake_engine import FakeEngine
from tests.unit.test_observe import free_port

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(6)]
USE = [
    {"utilization": 0.92, "memory_used_mib": 61440, "temperature_c": 71, "power_w": 612,
     "processes": [{"pid": 11}]},
    {"utilization": 0.0, "memory_used_mib": 0, "temperature_c": 34, "power_w": 71},
    {"utilization": 0.35, "memory_used_mib": 20480, "temperature_c": 52, "power_w": 280,
     "processes": [{"pid": 12}]},
    {"utilization": 0.0, "memory_used_mib": 0, "temperature_c": 31, "power_w": 62},
    {"utilization": 0.0, "memory_used_mib": 0, "temperature_c": 33, "power_w": 64},
    {"utilization": 0.0, "memory_used_mib": 0, "temperature_c": 30, "power_w": 60},
]  # fmt: skip
SICK = 3  # the GPU an Xid 79 took out
POOLS = {"training": Pool((0, 1, 2, 3)), "interactive": Pool((4, 5))}
LINE = [{"position": 1, "owner": "dave", "name": "pretrain", "gpus": 4, "all": False,
         "pool": "training", "priority": 0, "since": 0, "waited_s": 1260,
         "held_back_by": None}]  # fmt: skip
HOUR = 3600.0
PAST = [  # (GPU, owner, container, from hours ago, to hours ago), before today's holders
    (0, "alice", "llm-pretrain", 23, 9), (1, "carol", "eval-sweep", 20, 14),
    (2, "carol", "eval-sweep", 20, 14), (1, "dave", "ablation", 12, 5),
    (4, "bob", "notebook", 22, 18), (5, "frank", "jupyter", 16, 7),
    (3, "dave", "ablation", 12, 2), (2, "alice", "eval", 8, 3),
]  # fmt: skip
UTIL = {"alice": 0.85, "carol": 0.6, "dave": 0.7, "bob": 0.05, "frank": 0.2}
HOLDERS = [("a" * 64, "alice", "llm-finetune", 7200), ("b" * 64, "bob", "notebook", 3 * 3600),
           ("c" * 64, "carol", "eval-sweep", 600)]  # fmt: skip


def main(out: str, period: str = "24h") -> None:
    d = Path(tempfile.mkdtemp(prefix="ga-shot-"))
    (d / "state").mkdir()
    entries = [{"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                "usage": USE[i]} for i, u in enumerate(UUIDS)]  # fmt: skip
    (d / "gpus.yaml").write_text(yaml.safe_dump(entries))
    alloc = Allocator(Config(state_dir=str(d / "state"), gpus=str(d / "gpus.yaml")))
    alloc.gather._policy = replace(alloc.gather._policy, rules=Rules(pools=POOLS))
    with alloc.health.transaction() as box:
        xid = GpuEvent(UUIDS[SICK], XID, time.time() - 1800, 79)
        box[0] = observe(box[0], [xid], HealthPolicy())
    now = time.time()
    held = []
    for n, ((cid, owner, name, age), uuid) in enumerate(zip(HOLDERS, UUIDS, strict=False)):
        lease, _ = alloc.book.lease(LeaseRequest(Ask((uuid,), 0, False, ("gpu",)), name))
        alloc.book.bind(lease.id, cid)
        limited = {"time_limit": 7200.0, "started": now - 5400} if owner == "alice" else {}
        with alloc.ledger.transaction() as state:
            state.leases[lease.id] = replace(state.leases[lease.id], created=now - age, **limited)
        held.append((now - age, events.record("grant", now - age, gpus=[uuid], indices={uuid: n},
                                              lease=lease.id, owner=owner, name=name)))  # fmt: skip
    engine = FakeEngine()
    for cid, owner, name, _ in HOLDERS:
        engine.add(
            name,
            cid=cid,
            labels_={"io.gpu-alloc.owner": owner, "com.docker.compose.project": "lab"},
        )
    alloc = Allocator(alloc.config, engine)  # type: ignore[arg-type]
    alloc.gather._policy = replace(alloc.gather._policy, rules=Rules(pools=POOLS))
    write_past(d / "state", now, held)
    erin = alloc.reservations.reserve("erin", (now + 1.5 * HOUR, now + 5 * HOUR),
                                      gpus=("4", "5"), note="paper deadline")  # fmt: skip
    assert not isinstance(erin, str), erin
    usage.container_of = lambda pid, proc="/proc": {11: "a" * 64, 12: "c" * 64}.get(pid)
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc), lambda: LINE)
    try:
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--virtual-time-budget=4000", "--window-size=1180,1110", f"--screenshot={out}",
             f"http://127.0.0.1:{port}/#{period}"],
            check=True, capture_output=True,
        )  # fmt: skip
    finally:
        server.shutdown()


def write_past(state: Path, now: float, held: list[tuple[float, dict[str, Any]]]) -> None:
    """The audit trail of `PAST` and of today's holders (``held``: as granted), instead of
    the one the set-up wrote; hourly utilisation samples of `PAST`."""
    trail, days = list(held), {}
    for n, (gpu, owner, name, since, until) in enumerate(PAST):
        uuid, lease = UUIDS[gpu], f"past-{n}"
        trail.append(
            (
                now - since * HOUR,
                events.record(
                    "grant",
                    now - since * HOUR,
                    gpus=[uuid],
                    indices={uuid: gpu},
                    lease=lease,
                    owner=owner,
                ),
            )
        )
        trail.append(
            (
                now - until * HOUR,
                events.record(
                    "release", now - until * HOUR, gpus=[uuid], lease=lease, owner=owner, name=name
                ),
            )
        )
        for hour in range(until, since):
            start = now - (hour + 1) * HOUR
            line = {"t": start, "s": HOUR, "g": {uuid: [UTIL[owner], 1.0]}}
            days.setdefault(_day(start), []).append(line)
    trail.sort(key=lambda te: te[0])
    (state / "audit.jsonl").write_text("".join(json.dumps(e) + "\n" for _, e in trail))
    (state / "samples").mkdir(exist_ok=True)
    for day, lines in days.items():
        lines.sort(key=lambda line: line["t"])
        (state / "samples" / f"{day}.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines)
        )


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) > 1 else ["docs/dashboard.png"]))
