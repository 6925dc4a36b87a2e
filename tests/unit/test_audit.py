"""The audit trail and `gpu-alloc history`: one JSON line per decision, by whoever decided."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from allocator.core.judging.ask import Ask
from allocator.core.judging.verdicts import ALLOW
from allocator.core.leases import events
from allocator.core.machine import health
from allocator.core.placement import Shortage
from allocator.core.rules.policy import Owner, Pool, Refusal, Wanted
from allocator.host.audit import AuditLog
from allocator.host.config import Config
from allocator.ops import cli
from allocator.ops.history import render_table
from allocator.service.placer import LeaseRequest
from allocator.service.views import history
from allocator.service.wiring import Allocator
from tests.support.fake_engine import FakeEngine

FORK = multiprocessing.get_context("fork")
UUIDS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(4)]


def sim_allocator(tmp_path: Path) -> Allocator:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("".join(f"- {{uuid: {u}, index: {i}}}\n" for i, u in enumerate(UUIDS)))
    state = tmp_path / "state"
    state.mkdir()
    return Allocator(Config(state_dir=str(state), gpus=str(gpus)))


def _write_many(state_dir: str, who: int, n: int, max_bytes: int = 1 << 30) -> None:
    log = AuditLog(state_dir, max_bytes=max_bytes, keep=100)
    for k in range(n):
        log.write(events.record("denial", 0.0, name=f"w{who}-{k}", reason="x" * 5000))


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    procs = [FORK.Process(target=_write_many, args=(str(tmp_path), w, 50)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    assert len(lines) == 300
    names = {json.loads(line)["name"] for line in lines}  # every line parses whole
    assert names == {f"w{w}-{k}" for w in range(6) for k in range(50)}


def test_concurrent_writers_lose_no_line_to_rotation(tmp_path: Path) -> None:
    # About ten lines a file: the writers rotate it many times over between them.
    args = [(str(tmp_path), w, 50, 50_000) for w in range(6)]
    procs = [FORK.Process(target=_write_many, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    log = AuditLog(str(tmp_path), keep=100)
    assert len(log.files()) >= 20
    lines = [line for f in [*log.files(), log.path] for line in f.read_bytes().splitlines()]
    assert len(lines) == 300
    names = [json.loads(line)["name"] for line in lines]  # every line parses whole
    assert sorted(names) == sorted(f"w{w}-{k}" for w in range(6) for k in range(50))
    assert all(f.stat().st_size <= 50_000 for f in [*log.files(), log.path])


def test_rotation_keeps_a_bounded_number_of_bounded_files(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path), max_bytes=2000, keep=3)
    for k in range(200):
        log.write(events.record("denial", float(k), reason="y" * 100))
    files = sorted(p.name for p in tmp_path.glob("audit.jsonl*"))
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3"]
    assert all((tmp_path / f).stat().st_size <= 2000 for f in files)
    times = [e["time"] for e in log.read()]
    assert times == sorted(times)  # oldest file first, then the current one
    assert times[-1] == events.rfc3339(199.0)


def test_a_torn_line_is_skipped_and_the_rest_read(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path))
    log.write(events.record("grant", 1.0, gpus=[UUIDS[0]], lease="a"))
    with open(log.path, "ab") as f:
        f.write(b'{"event": "gra')
    log.write(events.record("release", 2.0, gpus=[UUIDS[0]], lease="a"))
    assert [e["event"] for e in log.read()] == ["grant", "release"]


def test_an_unwritable_audit_file_never_fails_the_decision(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    log = AuditLog(str(tmp_path / "file" / "state"))  # not a directory, even for root
    log.write(events.record("grant", 1.0))  # logged, not raised


def test_an_audit_lock_not_free_in_time_never_fails_the_decision(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = AuditLog(str(tmp_path))
    log.lock.timeout = 0.1
    other = AuditLog(str(tmp_path))
    with other.lock.held():
        log.write(events.record("grant", 1.0))  # logged, not raised
    assert "audit: could not record grant" in caplog.text
    assert "lock not acquired within 0.1s" in caplog.text
    assert list(log.read()) == []


def test_the_service_records_grant_refusal_and_release_with_times_and_gpus(
    tmp_path: Path,
) -> None:
    alloc = sim_allocator(tmp_path)
    lease, _ = alloc.book.lease(LeaseRequest(Ask((), 3, False, ("gpu",)), "train"))
    bob = Owner(1001, "bob")
    assert isinstance(
        alloc.book.lease(LeaseRequest(Ask((), 2, False, ("gpu",)), "second", owner=bob)), Shortage
    )
    # one waiting in line is not refused (yet): the shim tells if its time runs out
    assert isinstance(
        alloc.book.lease(LeaseRequest(Ask((), 2, False, ("gpu",)), "patient"), waits=True), Shortage
    )
    alloc.book.release(lease.id, "container removed")
    got = list(alloc.audit.read())
    assert [e["event"] for e in got] == ["grant", "refusal", "release"]
    grant, refusal, release = got
    assert grant["gpus"] == list(lease.gpus) and grant["indices"] == [0, 1, 2]
    assert grant["name"] == "train" and grant["lease"] == lease.id
    assert "GPU" in refusal["reason"] and refusal["name"] == "second"
    assert refusal["owner"] == "bob"  # history --user bob finds it
    assert release["reason"] == "container removed"
    assert grant["time"].endswith("+00:00")  # RFC 3339, UTC


def test_a_pool_that_is_not_open_to_its_asker_is_a_recorded_refusal(tmp_path: Path) -> None:
    alloc = sim_allocator(tmp_path)
    rules = replace(alloc.gather.rules, pools={"staff": Pool(gpus=(0, 1), users=("alice",))})
    alloc.gather._policy = replace(alloc.gather._policy, rules=rules)
    asked = LeaseRequest(
        Ask((), 1, False, ("gpu",)), "job", Owner(1001, "bob"), Wanted(pool="staff")
    )
    got = alloc.book.lease(asked)
    assert isinstance(got, Refusal)
    (line,) = alloc.audit.read()
    assert (line["event"], line["owner"], line["name"]) == ("refusal", "bob", "job")
    assert "pool 'staff' is not open to bob" in line["reason"]


def test_a_gpus_health_turning_is_recorded_with_its_index(tmp_path: Path) -> None:
    alloc = sim_allocator(tmp_path)
    xid = health.GpuEvent(UUIDS[2], health.XID, 1_700_000_000.0, 79)
    with alloc.health.transaction() as box:
        box[0] = health.observe(box[0], [xid], health.HealthPolicy())
    with alloc.health.transaction() as box:
        box[0] = health.clear(box[0], UUIDS[2])
    turns = [e for e in alloc.audit.read() if e["event"] == "health"]
    assert [(e["gpus"], e["indices"]) for e in turns] == [([UUIDS[2]], [2])] * 2
    assert turns[0]["reason"].startswith("GPU unhealthy: Xid 79 at 2023-11-14 22:13:20 UTC")
    assert turns[1]["reason"].startswith("GPU healthy again (was: Xid 79")


def test_reads_and_calls_that_touch_no_gpu_write_nothing(tmp_path: Path) -> None:
    alloc = sim_allocator(tmp_path)
    alloc.ledger.read()
    assert alloc.admission.resolve(ALLOW) is ALLOW
    assert not (tmp_path / "state" / "audit.jsonl").exists()


# ---------------------------------------------------------------------------- history


def trail() -> list[dict]:
    day = 86400.0
    return [
        events.record("grant", 1 * day, gpus=[UUIDS[3]], indices={UUIDS[3]: 3}, lease="L1",
                      name="old", owner="alice"),
        events.record("release", 2 * day, gpus=[UUIDS[3]], lease="L1", container="c1" * 32,
                      name="old", owner="alice", reason="container removed"),
        events.record("grant", 9 * day, gpus=[UUIDS[3], UUIDS[1]],
                      indices={UUIDS[3]: 3, UUIDS[1]: 1}, lease="L2", name="new", owner="bob"),
        events.record("denial", 9.5 * day, name="POST /containers/create", owner="carol",
                      reason="refused"),
    ]  # fmt: skip


def test_history_joins_each_grant_to_its_release() -> None:
    rows = history.uses(trail())
    assert [(r["event"], r["owner"], r["to"] is None) for r in rows] == [
        ("use", "alice", False),
        ("use", "bob", True),
        ("denial", "carol", False),
    ]
    assert rows[0]["end"] == "container removed" and rows[0]["container"] == "c1" * 32


@pytest.mark.parametrize(
    ("gpu", "user", "since_days", "owners"),
    [
        ("3", None, None, ["alice", "bob"]),
        ("1", None, None, ["bob"]),
        ("GPU-00000003", None, None, ["alice", "bob"]),
        (None, "alice", None, ["alice"]),
        ("3", None, 3, ["bob"]),  # "last week": alice's use ended before
        (None, None, 0.8, ["bob", "carol"]),  # bob still holds it
    ],
)
def test_history_selects_by_gpu_user_and_time(gpu, user, since_days, owners) -> None:
    since = None if since_days is None else 10 * 86400.0 - since_days * 86400.0
    rows = history.select(history.uses(trail()), gpu, user, since)
    assert [r["owner"] for r in rows] == owners


def test_since_takes_durations_and_times_and_explains_a_typo() -> None:
    assert history.since_epoch("7d", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert history.since_epoch("30m", 10_000.0) == 10_000.0 - 1800
    assert history.since_epoch("1970-01-02T00:00:00+00:00", 0) == 86400.0
    with pytest.raises(ValueError, match="duration such as 7d"):
        history.since_epoch("last week", 0)


def test_history_cli_answers_who_used_gpu_3(tmp_path: Path, capsys) -> None:
    log = AuditLog(str(tmp_path))
    for e in trail():
        log.write(e)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    assert cli.main(["--config", str(config), "history", "--gpu", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["owner"], r["name"]) for r in rows] == [("alice", "old"), ("bob", "new")]
    assert cli.main(["--config", str(config), "history", "--user", "bob"]) == 0
    table = capsys.readouterr().out
    assert "bob" in table and "alice" not in table and "3,1" in table and "held" in table


def test_history_gives_each_use_its_gpu_hours_and_marks_a_share() -> None:
    hour = 3600.0
    rows = history.uses(
        [
            events.record("grant", 0.0, gpus=[UUIDS[0], UUIDS[1]], lease="W", owner="alice"),
            events.record("release", 3 * hour, gpus=[UUIDS[0], UUIDS[1]], lease="W"),
            events.record("grant", 0.0, gpus=[UUIDS[2]], lease="S", owner="bob", share="1/4"),
        ]
    )
    history.with_gpu_hours(rows, now=2 * hour)  # bob's share still held
    assert [r["gpu_hours"] for r in rows] == [6.0, 0.5]
    alice, bob = render_table(rows).splitlines()[1:]
    assert "6.00" in alice and "(share" not in alice
    assert "(share 1/4)" in bob and "0.50" in bob


def test_history_shows_a_reason_whole() -> None:
    long = "not enough free GPUs: " + "x" * 200 + " the end"
    row = events.record("refusal", 0.0, name="job", owner="bob", reason=long)
    table = render_table(history.uses([row]))
    assert table.splitlines()[-1].endswith(" the end")


def test_reconcile_records_the_adoption_of_a_container_it_never_leased(tmp_path: Path) -> None:
    """A container gpu-alloc never leased, holding GPU 2 by --gpus, is adopted as a claim."""
    alloc = sim_allocator(tmp_path)
    engine = FakeEngine()
    legacy = engine.add("legacy", gpus=(UUIDS[2],))
    alloc = Allocator(alloc.config, engine)  # type: ignore[arg-type]
    assert alloc.reconciler.reconcile(adopt=True).adopted == [legacy]
    [adoption] = list(alloc.audit.read())
    assert adoption["event"] == "adoption" and adoption["gpus"] == [UUIDS[2]]
    assert (adoption["container"], adoption["name"], adoption["indices"]) == (
        legacy,
        "legacy",
        [2],
    )
    assert "DeviceRequests" in adoption["reason"]
