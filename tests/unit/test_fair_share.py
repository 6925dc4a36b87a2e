"""allocator.service.fair_share: decayed usage from the audit trail, kept a few seconds, re-read
aside."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from allocator.core.leases import events
from allocator.host.audit import AuditLog
from allocator.host.held import HeldRecord
from allocator.ops.explain import render
from allocator.ops.status import fair_share_line
from allocator.service import fair_share

A = "GPU-aaaa"
HOUR = 3600.0


def test_fair_share_off_reads_nothing(tmp_path: Path) -> None:
    fair = fair_share.FairShare(AuditLog(str(tmp_path)), HeldRecord(str(tmp_path)))
    assert fair.usage(None) is None
    assert fair_share.table(fair, None) is None


def test_usage_is_kept_then_refreshed_without_waiting_for_the_file(tmp_path: Path) -> None:
    now = time.time()
    audit = AuditLog(str(tmp_path))
    audit.write(events.record("grant", now - HOUR, gpus=[A], lease="L1", owner="alice"))
    fair = fair_share.FairShare(AuditLog(str(tmp_path)), HeldRecord(str(tmp_path)))
    first = fair.usage(HOUR, now)
    assert first is not None and first["alice"] == pytest.approx(HOUR / 2 / 0.6931, rel=1e-3)
    audit.write(events.record("release", now - HOUR / 2, gpus=[A], lease="L1", owner="alice"))
    assert fair.usage(HOUR, now + 1) is first  # kept for TTL seconds
    stale = fair.usage(HOUR, now + fair_share.TTL + 1)  # answered at once from what was read
    assert stale is not None and stale["alice"] > first["alice"]
    deadline = time.monotonic() + 5
    while fair._refreshing and time.monotonic() < deadline:
        time.sleep(0.01)
    fresh = fair.usage(HOUR, now + 2 * fair_share.TTL + 2)
    assert fresh is not None and fresh["alice"] < first["alice"]  # the release was read


def test_the_table_lists_owners_least_use_first_with_their_share(tmp_path: Path) -> None:
    now = time.time()
    audit = AuditLog(str(tmp_path))
    audit.write(events.record("grant", now - 3 * HOUR, gpus=[A], lease="L1", owner="alice"))
    audit.write(events.record("release", now - HOUR, gpus=[A], lease="L1", owner="alice"))
    audit.write(events.record("grant", now - HOUR, gpus=[A], lease="L2", owner="bob"))
    fair = fair_share.FairShare(AuditLog(str(tmp_path)), HeldRecord(str(tmp_path)))
    got = fair_share.table(fair, 7 * 86400.0, now)
    assert got is not None and got["half_life_s"] == 7 * 86400.0
    assert [o["owner"] for o in got["owners"]] == ["bob", "alice"]
    assert sum(o["share"] for o in got["owners"]) == pytest.approx(1.0, abs=1e-3)
    assert got["owners"][0]["usage_gpu_hours"] == pytest.approx(1.0, abs=0.01)


def test_status_and_explain_say_each_owners_share_least_first() -> None:
    fair = {
        "half_life_s": 7 * 86400.0,
        "owners": [
            {"owner": "bob", "usage_gpu_hours": 0.1, "share": 0.125},
            {"owner": "alice", "usage_gpu_hours": 0.7, "share": 0.875},
        ],
    }
    line = fair_share_line(fair)
    assert line.startswith("fair share (half-life 7d; less recent use is served first")
    assert line.endswith("bob 0.10 GPU-h (12%), alice 0.70 GPU-h (88%)")
    answer = {"message": "would be granted now: GPU 0", "fair_share": fair}
    assert render(answer, as_json=False).splitlines() == ["would be granted now: GPU 0", line]
    assert render({"message": "m", "fair_share": None}, as_json=False) == "m"


def test_a_flood_of_denials_rotating_the_audit_trail_leaves_fair_share_its_memory(
    tmp_path: Path,
) -> None:
    """Fair share reads its own record of ended leases: the audit trail's size rotation
    (here after a few hundred bytes) drops the grant and release, not alice's use."""
    from allocator.core.judging.ask import Ask
    from allocator.core.rules.policy import Owner
    from allocator.host.config import Config
    from allocator.service.placer import LeaseRequest
    from allocator.service.wiring import Allocator
    from tests.support import engine as sim

    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)
    (tmp_path / "state").mkdir()
    alloc = Allocator(Config(state_dir=str(tmp_path / "state"), gpus=str(gpus)))
    alloc.audit.max_bytes, alloc.audit.keep = 2000, 1
    alice = Owner(1001, "alice", ("alice",))
    got = alloc.book.lease(LeaseRequest(Ask((), 1, False, ("gpu",)), "train", alice))
    assert isinstance(got, tuple)
    alloc.recorder.ended(got[0], "container removed")
    for _ in range(100):  # denials: one audit line each
        alloc.audit.write(events.record("denial", time.time(), owner="mallory", reason="x" * 80))
    assert not any(e.get("owner") == "alice" for e in alloc.audit.read())  # rotated away
    usage = alloc.fair_share.usage(HOUR, time.time() + 60)
    assert usage is not None and usage.get("alice", 0.0) > 0.0
