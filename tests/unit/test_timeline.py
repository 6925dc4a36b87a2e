"""The dashboard's timeline (allocator/service/views/timeline.py) and ``/api/timeline``: held
intervals per GPU, reservations ahead and GPU-hours per owner, from audit lines,
utilisation samples and reservations written as fixtures."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from allocator.core.leases import events
from allocator.core.timing.reservations import Reservation
from allocator.host.samples import _day
from allocator.service.views import gpus, report
from allocator.service.views.timeline import Timeline, build
from allocator.service.wiring import Allocator
from shim import metrics_server
from tests.unit.test_observe import UUIDS, free_port, world

__all__ = ["world"]
A, B, C = UUIDS
HOUR, DAY = 3600.0, 86400.0
NOW = 1_800_000_000.0
INDEX = {A: 0, B: 1, C: 2}
AHEAD = Reservation("r-soon", "dave", (B,), NOW + 2 * HOUR, NOW + 4 * HOUR, note="deadline")
LATER = Reservation("r-later", "@ml", (C,), NOW + 3 * DAY, NOW + 4 * DAY)


def write_trail(state: Path) -> None:
    """alice held GPU 0 for 2 h ten hours ago (half used), eve GPU 2 across the 24 h
    edge, bob GPU 1 for a day three days ago, carol holds GPU 0 since an hour ago."""
    trail = [
        events.record("grant", NOW - 3 * DAY, gpus=[B], indices={B: 1}, lease="Lb", owner="bob"),
        events.record("release", NOW - 2 * DAY, gpus=[B], lease="Lb", owner="bob", name="sweep"),
        events.record("grant", NOW - 30 * HOUR, gpus=[C], indices={C: 2}, lease="Le", owner="eve"),
        events.record("release", NOW - 20 * HOUR, gpus=[C], lease="Le", owner="eve"),
        events.record("grant", NOW - 10 * HOUR, gpus=[A], indices={A: 0}, lease="La",
                      owner="alice"),
        events.record("release", NOW - 8 * HOUR, gpus=[A], lease="La", owner="alice",
                      name="train"),
        events.record("refusal", NOW - 5 * HOUR, owner="bob", reason="not enough free GPUs"),
        events.record("grant", NOW - HOUR, gpus=[A], indices={A: 0}, lease="Lc", owner="carol",
                      container="c" * 64),
    ]  # fmt: skip
    (state / "audit.jsonl").write_text("".join(json.dumps(e) + "\n" for e in trail))
    (state / "samples").mkdir()
    start = NOW - 10 * HOUR
    line = {"t": start, "s": 2 * HOUR, "g": {A: [0.5, 1.0]}}
    (state / "samples" / f"{_day(start)}.jsonl").write_text(json.dumps(line) + "\n")


def test_each_gpu_gets_its_holders_clipped_to_the_last_24_hours(tmp_path: Path) -> None:
    write_trail(tmp_path)
    got = build(str(tmp_path), [AHEAD, LATER], INDEX, NOW, "24h")
    assert (got["since"], got["now"], got["until"]) == (NOW - DAY, NOW, NOW + 6 * HOUR)
    rows = {g["index"]: g["held"] for g in got["gpus"]}
    assert rows[0] == [
        {"owner": "alice", "name": "train", "from": NOW - 10 * HOUR, "to": NOW - 8 * HOUR,
         "open": False},
        {"owner": "carol", "name": "c" * 12, "from": NOW - HOUR, "to": NOW, "open": True},
    ]  # fmt: skip
    assert rows[1] == []  # bob's day was three days ago; the GPU still gets its row
    assert rows[2] == [
        {"owner": "eve", "name": "", "from": NOW - DAY, "to": NOW - 20 * HOUR, "open": False}
    ]
    assert [g["index"] for g in got["gpus"]] == [0, 1, 2]


def test_reservations_are_drawn_up_to_the_horizon_ahead(tmp_path: Path) -> None:
    write_trail(tmp_path)
    day = build(str(tmp_path), [AHEAD, LATER], INDEX, NOW, "24h")
    assert day["reservations"] == [
        {"id": "r-soon", "for": "dave", "from": NOW + 2 * HOUR, "to": NOW + 4 * HOUR,
         "gpus": [B], "note": "deadline"}
    ]  # fmt: skip
    week = build(str(tmp_path), [AHEAD, LATER], INDEX, NOW, "7d")
    assert week["until"] == NOW + DAY
    assert [r["id"] for r in week["reservations"]] == ["r-soon"]  # r-later starts past a day


def test_gpu_hours_per_owner_are_the_reports_for_the_same_period(tmp_path: Path) -> None:
    write_trail(tmp_path)
    day = build(str(tmp_path), [], INDEX, NOW, "24h")
    assert day["owners"] == [
        {"owner": "eve", "gpu_hours_held": 4.0, "gpu_hours_used": 0.0},
        {"owner": "alice", "gpu_hours_held": 2.0, "gpu_hours_used": 1.0},
        {"owner": "carol", "gpu_hours_held": 1.0, "gpu_hours_used": 0.0},
    ]  # bob's refusal is no GPU-hour, so he has no row
    same = report.build(str(tmp_path), NOW, NOW - DAY, None, "user")["rows"]
    assert [(r["user"], r["gpu_hours_held"], r["gpu_hours_used"]) for r in same][:3] == [
        (o["owner"], o["gpu_hours_held"], o["gpu_hours_used"]) for o in day["owners"]
    ]
    week = build(str(tmp_path), [], INDEX, NOW, "7d")
    assert {o["owner"]: o["gpu_hours_held"] for o in week["owners"]} == {
        "bob": 24.0, "eve": 10.0, "alice": 2.0, "carol": 1.0}  # fmt: skip
    assert {g["index"]: len(g["held"]) for g in week["gpus"]} == {0: 2, 1: 1, 2: 1}


def test_a_gpu_the_host_no_longer_has_keeps_its_row_by_its_recorded_index(tmp_path: Path) -> None:
    write_trail(tmp_path)
    got = build(str(tmp_path), [], {A: 0, B: 1}, NOW, "24h")
    assert [(g["uuid"], g["index"]) for g in got["gpus"]] == [(A, 0), (B, 1), (C, 2)]


def test_an_unknown_period_is_refused() -> None:
    with pytest.raises(ValueError, match="period '1y': expected one of 24h, 7d"):
        build("/nonexistent", [], {}, NOW, "1y")


def test_the_answer_is_kept_a_few_seconds_and_read_again_after(
    world: tuple[Allocator, Path],
) -> None:
    alloc, _ = world
    timeline = Timeline(alloc, keep=3600)
    first = timeline.get("24h")
    assert [len(g["held"]) for g in first["gpus"]] == [1, 0, 0]  # the fixture's lease
    audit = Path(alloc.config.state_dir, "audit.jsonl")
    with audit.open("a") as f:
        grant = events.record("grant", time.time(), gpus=[B], lease="Lz", owner="zoe")
        f.write(json.dumps(grant) + "\n")
    assert timeline.get("24h") is first  # kept: the audit trail is not read again
    timeline.keep = 0  # its answer has aged out
    again = timeline.get("24h")
    assert [h["owner"] for h in again["gpus"][1]["held"]] == ["zoe"]


def test_the_endpoint_serves_the_timeline_and_refuses_an_unknown_period(
    world: tuple[Allocator, Path],
) -> None:
    alloc, _ = world
    made = alloc.reservations.reserve("dave", (time.time() + HOUR, time.time() + 2 * HOUR),
                                      gpus=("2",))  # fmt: skip
    assert isinstance(made, Reservation), made
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    base = f"http://127.0.0.1:{port}/api/timeline"
    try:
        got = json.loads(urllib.request.urlopen(f"{base}?period=7d", timeout=10).read())
        default = json.loads(urllib.request.urlopen(base, timeout=10).read())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}?period=1y", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert got["period"] == "7d" and default["period"] == "24h"
    assert [(g["index"], [h["owner"] for h in g["held"]]) for g in got["gpus"]] == [
        (0, ["unknown"]),
        (1, []),
        (2, []),
    ]  # fmt: skip  (the fixture's lease names none)
    assert got["gpus"][0]["held"][0]["open"] is True
    assert [(r["id"], r["for"], r["gpus"]) for r in got["reservations"]] == [(made.id, "dave", [C])]
    assert [o["owner"] for o in got["owners"]] == ["unknown"]
    assert refused.value.code == 400
    assert b"period '1y': expected one of 24h, 7d" in refused.value.read()
