"""The dashboard in a real headless browser (Debian's chromium): tiles, owners, live refresh."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from allocator.core.judging.ask import Ask
from allocator.core.leases import events
from allocator.core.rules.policy import Pool, Rules
from allocator.core.timing.reservations import Reservation
from allocator.service.placer import LeaseRequest
from allocator.service.views import gpus
from allocator.service.wiring import Allocator
from shim import metrics_server
from tests.unit.test_observe import (
    CID,
    UUIDS,
    free_port,
    holders,
    mark_unhealthy,
    world,
    write_gpus,
)

__all__ = ["world"]  # the fixture, shared with the live-view tests
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium missing: run make deps")
OTHER = "beef" + "0" * 60


def chromium(*args: str) -> str:
    """Headless chromium as root: no sandbox, no GPU, and time enough for the page's timers."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--virtual-time-budget=10000", *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class ChangingView(gpus.LiveView):
    """After the page's first refresh, bob's container takes GPU 1: the page must show it."""

    def __init__(self, alloc: Allocator) -> None:
        super().__init__(alloc)
        self.calls = 0

    def snapshot(self, now: float | None = None) -> dict:
        snap = super().snapshot(now)
        self.calls += 1
        if self.calls == 1:
            ask = Ask(("GPU-00000001-0000-0000-0000-000000000000",), 0, False, ("gpu",))
            lease, _ = self.alloc.book.lease(LeaseRequest(ask, "eval"))
            self.alloc.book.bind(lease.id, OTHER)
        return snap


def test_the_page_shows_every_gpu_and_its_holder_and_follows_a_new_lease(world) -> None:
    alloc, gpus_file = world
    alloc = Allocator(alloc.config, holders({CID: "alice", OTHER: "bob"}))
    write_gpus(gpus_file, {0: {"utilization": 0.8, "memory_used_mib": 40960,
                               "processes": [{"pid": 4242}]}})  # fmt: skip
    view = ChangingView(alloc)
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", view)
    try:
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/")
    finally:
        server.shutdown()
        server.server_close()
    assert view.calls >= 2, "the page never refreshed"
    refreshed = re.search(r'data-refreshed="(\d+)"', dom)
    assert refreshed and int(refreshed[1]) >= 2
    for index in range(3):
        assert f'<span class="index">GPU {index}</span>' in dom
    assert dom.count('class="tile ') == 3
    assert "owner: alice" in dom and "container: train" in dom
    assert "owner: bob" in dom  # the lease taken after the first refresh
    assert "80%" in dom and "40.0 / 80.0 GiB" in dom
    assert "1 free, 2 leased" in dom


def test_an_unhealthy_gpu_is_marked_on_the_page_with_the_line_and_the_pools(world) -> None:
    alloc, _ = world
    for index in (0, 2):  # GPU 0 is alice's, GPU 2 is free: both turn unhealthy
        mark_unhealthy(alloc, UUIDS[index])
    alloc.gather._policy = replace(
        alloc.gather._policy, rules=Rules(pools={"big": Pool((0, 1)), "small": Pool((2,))})
    )  # as configured
    waiting = [{"position": 1, "owner": "carol", "name": "sweep", "gpus": 2, "all": False,
                "pool": "big", "priority": 0, "since": 0, "waited_s": 95,
                "held_back_by": None}]  # fmt: skip
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc), lambda: waiting)
    try:
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/")
    finally:
        server.shutdown()
        server.server_close()
    tiles = re.findall(r'<div class="tile (\w+)" data-uuid="([^"]+)" data-state="(\w+)"', dom)
    assert tiles == [("unhealthy", UUIDS[0], "unhealthy"), ("free", UUIDS[1], "free"),
                     ("unhealthy", UUIDS[2], "unhealthy")]  # fmt: skip
    assert dom.count("never granted: Xid 79 at") == 2
    assert "owner: alice" in dom  # the holder of an unhealthy GPU stays visible
    assert "3 GPUs: 1 free, 0 leased, 2 unhealthy or gone, 1 waiting" in dom
    assert "<td>carol</td><td>sweep</td><td>2</td><td>big</td><td>95s</td>" in dom
    assert "<td>big</td><td>0,1</td><td>1</td><td>1</td>" in dom
    assert "<td>small</td><td>2</td><td>0</td><td>1</td>" in dom


def test_the_page_says_why_when_the_gpu_list_cannot_be_read(world) -> None:
    alloc, gpus_file = world
    gpus_file.unlink()
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    try:
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/")
    finally:
        server.shutdown()
        server.server_close()
    [shown] = re.findall(r'<div id="error">([^<]*)</div>', dom)
    assert shown.startswith(f"gpu-alloc: {gpus_file}: cannot read simulated GPUs")
    assert 'class="tile' not in dom


def test_a_screenshot_renders(world, tmp_path: Path) -> None:
    alloc, _ = world
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    shot = tmp_path / "dashboard.png"
    try:
        chromium(f"--screenshot={shot}", "--window-size=1100,500", f"http://127.0.0.1:{port}/")
    finally:
        server.shutdown()
        server.server_close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


def write_history(alloc: Allocator) -> Reservation:
    """alice held GPU 1 from 6 h to 2 h ago, bob GPU 2 three days ago; GPU 2 is
    reserved for dave from in an hour."""
    now = time.time()
    trail = [
        events.record("grant", now - 3 * 86400, gpus=[UUIDS[2]], lease="Lb", owner="bob"),
        events.record("release", now - 2 * 86400, gpus=[UUIDS[2]], lease="Lb", owner="bob"),
        events.record("grant", now - 6 * 3600, gpus=[UUIDS[1]], lease="La", owner="alice"),
        events.record("release", now - 2 * 3600, gpus=[UUIDS[1]], lease="La", owner="alice",
                      name="finetune"),
    ]  # fmt: skip
    with Path(alloc.config.state_dir, "audit.jsonl").open("a") as f:
        f.writelines(json.dumps(e) + "\n" for e in trail)
    made = alloc.reservations.reserve("dave", (now + 3600, now + 3 * 3600), gpus=("2",))
    assert isinstance(made, Reservation), made
    return made


def holds(dom: str) -> list[tuple[str, str]]:
    """(GPU row's UUID, owner) of each held bar, in drawing order."""
    found = []
    for uuid, row in re.findall(r'<g class="row" data-uuid="([^"]+)">(.*?)</g>', dom):
        found += [(uuid, owner) for owner in re.findall(r'class="hold" data-owner="([^"]*)"', row)]
    return found


def test_the_timeline_draws_a_row_per_gpu_its_holders_a_reservation_and_gpu_hours(world) -> None:
    alloc, _ = world
    made = write_history(alloc)
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    try:
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/")
        week = chromium("--dump-dom", f"http://127.0.0.1:{port}/#7d")
    finally:
        server.shutdown()
        server.server_close()
    assert 'data-timeline="24h"' in dom
    assert dom.count('<g class="row"') == 3
    assert holds(dom) == [(UUIDS[0], "unknown"), (UUIDS[1], "alice")]  # bob's was 3 days ago
    assert "alice · finetune" in dom
    [resv] = re.findall(r'<rect class="resv" data-id="([^"]+)"', dom)
    assert resv == made.id and "for dave" in dom
    assert '<line class="now"' in dom
    assert re.search(r"<td>.*alice</td><td>4\.0</td><td>0\.0</td>", dom)
    # a hold under an hour: held and used both in minutes, never "0.0" beside "<1 min"
    assert "unknown</td><td>&lt;1 min</td><td>0 min</td>" in dom
    assert 'data-timeline="7d"' in week
    assert holds(week) == [(UUIDS[0], "unknown"), (UUIDS[1], "alice"), (UUIDS[2], "bob")]
    assert re.search(r"<td>.*bob</td><td>24\.0</td>", week)


class SharedView(gpus.LiveView):
    """GPU 1 shared by two quarter shares (policy.sharing), as the snapshot lists them."""

    def snapshot(self, now: float | None = None) -> dict:
        snap = super().snapshot(now)
        snap["shares"] = [
            {"uuid": UUIDS[1], "share": "1/4", "owner": who, "name": name, "container": None}
            for who, name in (("al", "nb-al"), ("bo", "nb-bo"))
        ]
        return snap


def test_a_shared_gpu_lists_its_shares_on_its_tile(world) -> None:
    alloc, _ = world
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", SharedView(alloc))
    try:
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/")
    finally:
        server.shutdown()
        server.server_close()
    assert "shared: 2 shares" in dom
    assert "1/4 al / nb-al" in dom and "1/4 bo / nb-bo" in dom


def test_short_holds_utc_dates_minutes_reservations_and_time_left_are_all_on_the_page(
    world,
) -> None:
    """A hold of seconds is still a visible bar at the now-line; the axis says the date and
    UTC; GPU-hours below an hour are minutes; a free GPU reserved ahead says so, and a
    time-limited lease says what is left."""
    from dataclasses import replace

    alloc, _ = world
    made = write_history(alloc)  # GPU 2 reserved for dave from in an hour
    now = time.time()
    with alloc.ledger.transaction() as state:  # alice's lease (GPU 0, just granted): 1 h limit
        [lid] = list(state.leases)
        state.leases[lid] = replace(state.leases[lid], time_limit=3600.0, started=now - 600)
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    try:
        dom = chromium("--dump-dom", f"http://127.0.0.1:{port}/")
        week = chromium("--dump-dom", f"http://127.0.0.1:{port}/#7d")
    finally:
        server.shutdown()
        server.server_close()
    for page in (dom, week):
        widths = re.findall(rf'<g class="row" data-uuid="{UUIDS[0]}">.*?class="hold"[^>]*'
                            r'width="([\d.]+)"', page)  # fmt: skip
        assert widths and float(widths[0]) >= 6, widths  # the hold of seconds, at any zoom
        assert '<text class="axiszone" x="4" y="11">UTC</text>' in page
        months = re.findall(r'<text class="axis"[^>]*>(\d+ [A-Z][a-z]{2})', page)
        assert months, "no date on the axis"
    assert re.search(r"<td>.*unknown</td><td>(&lt;1|\d+) min</td>", dom), "minutes below 1 h"
    assert "reserved from " in dom and "UTC" in dom and f"for {made.holder}" in dom
    assert re.search(r'<span class="leftmark">(49|50)m left</span>', dom)
    assert re.search(r"updated \d\d:\d\d:\d\d UTC", dom)
