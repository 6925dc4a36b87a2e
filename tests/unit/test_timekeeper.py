"""Time limits through the service and the timekeeper, against an in-memory Engine:
the limit recorded with the lease, the clock started from the Engine's StartedAt,
the stop (restart policy off first), its audit line, and idle reclaim."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from allocator.core.judging.ask import Ask
from allocator.core.leases.clock import Jump, Now
from allocator.core.rules.policy import NOBODY, Invalid, Owner, Wanted
from allocator.core.timing import timelimits
from allocator.host import clock as hostclock
from allocator.host import config as configmod
from allocator.host.engine import EngineError
from allocator.ops import doctor
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine

CAROL = Owner(1002, "carol", ("carol",))
POLICY = {"exempt": [], "time_limit": {"default": "1h"}}
STARTED = "2026-01-01T00:00:00.5Z"
T0 = 1767225600.5  # STARTED as epoch seconds


class StoppingEngine(FakeEngine):
    """The fake Engine with a stop, as dockerd does it: the container is no longer running."""

    def __init__(self) -> None:
        super().__init__()
        self.stops: list[tuple[str, int | None]] = []
        self.stopped = threading.Event()

    def stop(self, container: str, grace: int | None = None) -> None:
        self._call("stop")
        self.stops.append((container, grace))
        self.by_id[container]["State"].update(Running=False, Status="exited")
        self.stopped.set()


def make(
    tmp_path: Path, policy: dict[str, Any], usage: dict | None = None, **sections: Any
) -> Allocator:
    tmp_path.mkdir(parents=True, exist_ok=True)
    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)
    if usage is not None:
        entries = yaml.safe_load(gpus.read_text())
        for e in entries:
            e["usage"] = usage
        gpus.write_text(yaml.safe_dump(entries))
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus),
           "engine": {"socket": str(tmp_path / "none.sock")}, "policy": policy,
           **sections}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(tmp_path / "config.yaml")), StoppingEngine())  # type: ignore[arg-type]
    alloc.ledger.ensure_dir()
    return alloc


def one() -> Ask:
    return Ask(required=(), count=1, every=False, caps=("gpu",))


def running_job(alloc: Allocator, want: Wanted = Wanted(), **inspect: Any) -> tuple[str, str]:  # noqa: B008
    """A granted, bound and running GPU container: (lease id, container id)."""
    got = alloc.book.lease(LeaseRequest(one(), "job", CAROL, want))
    assert isinstance(got, tuple), got
    lease, _ = got
    fake = alloc.engine
    cid = fake.add("job", gpus=lease.gpus, lease=lease.id)  # type: ignore[union-attr]
    fake.by_id[cid]["State"]["StartedAt"] = STARTED  # type: ignore[union-attr]
    fake.by_id[cid]["Config"].update(inspect.get("config", {}))  # type: ignore[union-attr]
    fake.by_id[cid]["HostConfig"].update(inspect.get("host_config", {}))  # type: ignore[union-attr]
    assert alloc.book.bind(lease.id, cid)
    return lease.id, cid


def audit(alloc: Allocator, event: str) -> list[dict[str, Any]]:
    path = Path(alloc.config.state_dir, "audit.jsonl")
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == event]


def test_the_lease_records_the_limit_the_request_gets(tmp_path):
    alloc = make(tmp_path, POLICY)
    lease_id, _ = running_job(alloc)
    assert alloc.ledger.read().leases[lease_id].time_limit == 3600
    shorter, _ = running_job(alloc, Wanted(time=60))
    assert alloc.ledger.read().leases[shorter].time_limit == 60


def test_a_request_above_its_limit_is_invalid_audited_and_takes_nothing(tmp_path):
    alloc = make(tmp_path, POLICY)
    got = alloc.book.lease(LeaseRequest(one(), "long", CAROL, Wanted(time=7200)))
    assert isinstance(got, Invalid) and "(policy.time_limit.default)" in got.msg
    assert alloc.ledger.read().leases == {}
    (line,) = audit(alloc, "refusal")
    assert "policy.time_limit.default" in line["reason"]
    assert isinstance(alloc.book.explain(one(), CAROL, Wanted(time=7200)), Invalid)


def test_an_unknown_owner_is_limited_by_the_default(tmp_path):
    alloc = make(tmp_path, POLICY)
    got = alloc.book.lease(LeaseRequest(one(), "job", NOBODY, Wanted()))
    assert isinstance(got, tuple) and got[0].time_limit == 3600


def test_the_clock_starts_at_the_engines_started_at_and_the_stop_comes_at_the_end(tmp_path):
    alloc = make(tmp_path, POLICY)
    keeper = alloc.timekeeper
    lease_id, cid = running_job(
        alloc, Wanted(time=60), config={"StopTimeout": 3},
        host_config={"RestartPolicy": {"Name": "always"}},
    )  # fmt: skip
    assert keeper.check(Now(T0 + 30)) == timelimits.CHECK_MAX
    assert alloc.ledger.read().leases[lease_id].started == T0
    assert keeper.check(Now(T0 + 59)) == 1 and alloc.engine.stops == []  # type: ignore[union-attr]
    keeper.check(Now(T0 + 60))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    assert fake.stopped.wait(10)
    assert fake.stops == [(cid, 3)]  # its own StopTimeout
    assert fake.updates == [(cid, {"RestartPolicy": {"Name": "no"}})]
    deadline = time.monotonic() + 10
    while not audit(alloc, "time-limit"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (line,) = audit(alloc, "time-limit")
    assert line["container"] == cid and line["owner"] == "carol"
    assert "restart policy always was turned off" in line["reason"]
    assert lease_id in alloc.ledger.read().leases  # the lease stays: the container exists
    assert "ran its time limit" in (alloc.restarts.start_refusal(cid) or "")


def test_a_restart_before_the_first_look_does_not_move_the_clock(tmp_path):
    """The clock starts at the first start, as the Engine's start events say it, even when
    the container restarted (a later StartedAt) before the timekeeper first looked."""
    alloc = make(tmp_path, POLICY)
    lease_id, cid = running_job(alloc, Wanted(time=60))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    first = alloc.ledger.read().leases[lease_id].created + 1
    fake.starts[cid] = [first, first + 8]  # started, restarted 8 s later
    later = datetime.fromtimestamp(first + 8, UTC).isoformat().replace("+00:00", "Z")
    fake.by_id[cid]["State"]["StartedAt"] = later
    alloc.timekeeper.check(Now(first + 9))
    assert alloc.ledger.read().leases[lease_id].started == first
    alloc.timekeeper.check(Now(first + 60))
    assert fake.stopped.wait(10)


def test_without_limits_or_reclaim_the_timekeeper_asks_the_engine_nothing(tmp_path):
    alloc = make(tmp_path, {"exempt": []})
    running_job(alloc)
    alloc.engine.calls.clear()  # type: ignore[union-attr]
    alloc.timekeeper.check(Now(time.time()))
    assert alloc.engine.calls == []  # type: ignore[union-attr]


def test_an_idle_container_is_stopped_and_a_busy_one_is_not(tmp_path):
    alloc = make(tmp_path, {"exempt": [], "reclaim_idle_after": "2s"}, {"utilization": 0.0})
    keeper = alloc.timekeeper
    _, cid = running_job(alloc)
    now = time.time()
    keeper.check(Now(now + 1))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    assert fake.stops == []
    keeper.check(Now(now + 5))
    assert fake.stopped.wait(10) and fake.stops == [(cid, 10)]  # the Engine's default, said

    busy = make(tmp_path / "busy", {"exempt": [], "reclaim_idle_after": "2s"},
                {"utilization": 0.4})  # fmt: skip
    running_job(busy)
    busy.timekeeper.check(Now(time.time() + 60))
    assert busy.engine.stops == []  # type: ignore[union-attr]


def test_a_gpu_with_memory_and_power_but_no_utilisation_figure_is_never_reclaimed(tmp_path):
    unread = {"memory_used_mib": 30000, "power_w": 250}  # in use, by all appearances
    alloc = make(tmp_path, {"exempt": [], "reclaim_idle_after": "2s"}, unread)
    running_job(alloc)
    alloc.timekeeper.check(Now(time.time() + 3600))
    time.sleep(0.2)  # a stop would run on a thread of its own
    assert alloc.engine.stops == [] and audit_lines(alloc, "idle-reclaim") == []  # type: ignore[union-attr]


def audit_lines(alloc: Allocator, event: str) -> list[dict[str, Any]]:
    path = Path(alloc.config.state_dir, "audit.jsonl")
    return audit(alloc, event) if path.exists() else []


def test_status_shows_the_limit_and_the_time_left(tmp_path):
    from allocator.ops.status import render_table
    from allocator.service.views.status import snapshot

    alloc = make(tmp_path, POLICY)
    lease_id, cid = running_job(alloc)
    with alloc.ledger.transaction() as state:
        state.start_clock(lease_id, cid, time.time() - 570)  # 50.5m left
    (holder,) = snapshot(alloc)["holders"]
    assert holder["time_limit_s"] == 3600 and 3020 <= holder["time_left_s"] <= 3030
    assert "running, 50m left" in render_table(snapshot(alloc))


def paused(alloc: Allocator, cid: str) -> None:
    """``docker pause``: dockerd says Running and Paused, state "paused"."""
    alloc.engine.by_id[cid]["State"].update(Running=True, Paused=True, Status="paused")  # type: ignore[union-attr]


def test_a_paused_container_is_stopped_at_its_time_limit(tmp_path):
    alloc = make(tmp_path, POLICY)
    lease_id, cid = running_job(alloc, Wanted(time=60))
    paused(alloc, cid)
    alloc.timekeeper.check(Now(T0 + 30))
    assert alloc.ledger.read().leases[lease_id].started == T0  # its clock runs, paused
    alloc.timekeeper.check(Now(T0 + 60))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    assert fake.stopped.wait(10) and [c for c, _ in fake.stops] == [cid]


def test_a_paused_idle_container_is_reclaimed(tmp_path):
    alloc = make(tmp_path, {"exempt": [], "reclaim_idle_after": "2s"}, {"utilization": 0.0})
    _, cid = running_job(alloc)
    paused(alloc, cid)
    alloc.timekeeper.check(Now(time.time() + 5))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    assert fake.stopped.wait(10) and [c for c, _ in fake.stops] == [cid]


SIGNALLED = {**POLICY, "signal": {"default": "USR1@5m"}}


def test_the_checkpoint_signal_comes_its_lead_before_the_limit_once_then_the_stop(tmp_path):
    alloc = make(tmp_path, SIGNALLED)
    keeper = alloc.timekeeper
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    lease_id, cid = running_job(alloc, Wanted(time=600))
    lease = alloc.ledger.read().leases[lease_id]
    assert (lease.signal, lease.signal_lead, lease.signalled) == ("SIGUSR1", 300, None)
    assert keeper.check(Now(T0 + 10)) == timelimits.CHECK_MAX
    assert keeper.check(Now(T0 + 295)) == 5 and fake.kills == []  # the next look at the signal
    keeper.check(Now(T0 + 300))
    assert fake.kills == [(cid, "SIGUSR1")]
    assert alloc.ledger.read().leases[lease_id].signalled == T0 + 300
    (line,) = audit(alloc, "signal")
    assert line["container"] == cid and "SIGUSR1 5m before its time limit" in line["reason"]
    keeper.check(Now(T0 + 400))
    assert fake.kills == [(cid, "SIGUSR1")] and fake.stops == []  # sent once
    keeper.check(Now(T0 + 600))
    assert fake.stopped.wait(10) and fake.stops == [(cid, 10)]


def test_a_signal_sent_before_a_shim_restart_is_not_sent_again(tmp_path):
    alloc = make(tmp_path, SIGNALLED)
    _, cid = running_job(alloc, Wanted(time=600))
    alloc.timekeeper.check(Now(T0 + 10))
    alloc.timekeeper.check(Now(T0 + 301))
    again = Allocator(alloc.config, alloc.engine)  # the restarted shim reads the same ledger
    again.timekeeper.check(Now(T0 + 302))
    assert alloc.engine.kills == [(cid, "SIGUSR1")]  # type: ignore[union-attr]


def test_a_signal_the_engine_refused_is_tried_again_at_the_next_look(tmp_path, monkeypatch):
    alloc = make(tmp_path, SIGNALLED)
    lease_id, cid = running_job(alloc, Wanted(time=600))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    refusals = [EngineError("Engine at fake.sock: kill failed: 500 Server Error")]
    kill = fake.kill

    def refusing(container: str, signal: str) -> None:
        if refusals:
            raise refusals.pop()
        kill(container, signal)

    monkeypatch.setattr(fake, "kill", refusing)
    alloc.timekeeper.check(Now(T0 + 10))
    alloc.timekeeper.check(Now(T0 + 301))
    assert alloc.ledger.read().leases[lease_id].signalled is None and fake.kills == []
    alloc.timekeeper.check(Now(T0 + 302))
    assert fake.kills == [(cid, "SIGUSR1")]


def test_the_label_chooses_the_signal_over_the_policy(tmp_path):
    from allocator.core.api import signals

    alloc = make(tmp_path, SIGNALLED)
    lease_id, _ = running_job(alloc, Wanted(signal=signals.parse("TERM@30s")))
    lease = alloc.ledger.read().leases[lease_id]
    assert (lease.signal, lease.signal_lead) == ("SIGTERM", 30)


def test_an_idle_container_is_signalled_its_lead_before_reclaim_and_stopped_after_it(tmp_path):
    policy = {"exempt": [], "reclaim_idle_after": "60s", "signal": {"default": "USR2@20s"}}
    alloc = make(tmp_path, policy, {"utilization": 0.0})
    keeper = alloc.timekeeper
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    lease_id, cid = running_job(alloc)
    since = alloc.ledger.read().leases[lease_id].created
    keeper.check(Now(since + 39))
    assert fake.kills == []
    keeper.check(Now(since + 41))
    assert fake.kills == [(cid, "SIGUSR2")] and fake.stops == []
    keeper.check(Now(since + 50))
    assert fake.kills == [(cid, "SIGUSR2")] and fake.stops == []  # once, and its lead runs
    keeper.check(Now(since + 61))
    assert fake.stopped.wait(10) and fake.stops == [(cid, 10)]


def test_status_and_gpus_show_when_the_signal_was_sent(tmp_path):
    from allocator.ops import gpus as gpus_table
    from allocator.ops.status import render_table
    from allocator.service.views import gpus
    from allocator.service.views.status import snapshot

    alloc = make(tmp_path, SIGNALLED)
    lease_id, cid = running_job(alloc)
    (holder,) = snapshot(alloc)["holders"]
    assert (holder["signal"], holder["signal_lead_s"], holder["signalled_at"]) == (
        "SIGUSR1", 300, None
    )  # fmt: skip
    assert "signalled" not in render_table(snapshot(alloc))
    with alloc.ledger.transaction() as state:
        state.signalled(lease_id, cid, T0 + 3300, None)
    (holder,) = snapshot(alloc)["holders"]
    assert holder["signalled_at"] == "2026-01-01T00:55:00Z"
    assert "signalled: job was sent SIGUSR1 at 2026-01-01T00:55:00Z, 5m before its stop" in (
        render_table(snapshot(alloc))
    )
    [row] = [r for r in gpus.LiveView(alloc).snapshot()["gpus"] if r["holder"]]
    assert (row["signal"], row["signalled_at"]) == ("SIGUSR1", T0 + 3300)
    assert "signalled at 00:55:00Z" in gpus_table.render_table(gpus.LiveView(alloc).snapshot())


def test_the_signal_and_the_stop_are_each_a_notice_to_the_owner_in_the_outbox(tmp_path):
    """The notifier hears the timekeeper's audit records; its worker sends them later."""
    hook = {"webhooks": [{"url": "http://127.0.0.1:9/none", "format": "json"}]}
    alloc = make(tmp_path, SIGNALLED, notify=hook)
    _, cid = running_job(alloc, Wanted(time=600))
    alloc.timekeeper.check(Now(T0 + 10))
    alloc.timekeeper.check(Now(T0 + 300))
    alloc.timekeeper.check(Now(T0 + 600))
    fake: StoppingEngine = alloc.engine  # type: ignore[assignment]
    assert fake.stopped.wait(10)
    deadline = time.monotonic() + 10
    while len(alloc.notifier.outbox.entries()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    told = [
        (e.notice.kind, e.notice.user, e.notice.container) for e in alloc.notifier.outbox.entries()
    ]
    assert sorted(told) == [("stopped", "carol", cid), ("warning", "carol", cid)]


def test_without_a_signal_the_owner_is_told_at_80_and_90_percent_once_each(tmp_path):
    hook = {"webhooks": [{"url": "http://127.0.0.1:9/none", "format": "json"}]}
    alloc = make(tmp_path, POLICY, notify=hook)
    running_job(alloc, Wanted(time=100))
    for at in (10, 79, 80, 85, 90, 95):
        alloc.timekeeper.check(Now(T0 + at))
    told = sorted(e.notice.text.partition(":")[0] for e in alloc.notifier.outbox.entries())
    assert told == [
        "container job has run 80% of its time limit of 1m",
        "container job has run 90% of its time limit of 1m",
    ]


def test_without_a_signal_an_idle_containers_owner_is_told_before_reclaim(tmp_path):
    hook = {"webhooks": [{"url": "http://127.0.0.1:9/none", "format": "json"}]}
    policy = {"exempt": [], "reclaim_idle_after": "100s"}
    alloc = make(tmp_path, policy, {"utilization": 0.0}, notify=hook)
    running_job(alloc)
    since = max(le.created for le in alloc.ledger.read().leases.values())
    alloc.timekeeper.check(Now(since + 79))
    assert alloc.notifier.outbox.entries() == []
    alloc.timekeeper.check(Now(since + 81))
    alloc.timekeeper.check(Now(since + 90))
    [entry] = alloc.notifier.outbox.entries()
    assert entry.notice.subject == "gpu-alloc: container job is idle"
    assert alloc.engine.stops == []  # type: ignore[union-attr]


def test_a_jump_of_the_wall_clock_is_kept_for_reservations_and_doctor_until_undone(tmp_path):
    alloc = make(tmp_path, POLICY)
    state_dir = Path(alloc.config.state_dir)
    alloc.timekeeper.clockwatch.see(Now(T0, "boot", 100.0))  # the shim's first look: trusted
    alloc.timekeeper.clockwatch.see(Now(T0 + 10 + 1.5, "boot", 110.0))
    assert hostclock.jumped(state_dir) is None
    alloc.timekeeper.clockwatch.see(Now(T0 + 20 + 3600, "boot", 120.0))
    assert hostclock.jumped(state_dir) == Jump(3600, T0 + 3620, "boot", T0 - 100)
    line = doctor.check_clock(alloc.config)
    assert line.status == doctor.OK  # that jump was on another boot than this host's
    alloc.timekeeper.clockwatch.see(Now(T0 + 30, "boot", 130.0))  # set back where it was
    assert hostclock.jumped(state_dir) is None


def test_doctor_says_the_wall_clock_moved_and_reservations_are_held(tmp_path):
    alloc = make(tmp_path, POLICY)
    now = hostclock.read()
    assert doctor.check_clock(alloc.config).status == doctor.OK
    hostclock.keep(
        Path(alloc.config.state_dir),
        Jump(3 * 3600, now.wall, now.boot_id, (now.offset or 0) - 3 * 3600),
    )
    line = doctor.check_clock(alloc.config)
    assert line.status == doctor.WARN and line.what.startswith(
        "clock: the wall clock moved by +3h at "
    )
    assert "(3h behind the wall clock) until the shim restarts" in line.what
    assert "systemctl restart gpu-alloc-shim" in line.fix


def test_after_a_jump_grants_go_by_the_clock_from_before_it(tmp_path):
    alloc = make(tmp_path, POLICY)
    now = hostclock.read()
    moved = Jump(3 * 3600, now.wall, now.boot_id, (now.offset or 0) - 3 * 3600)
    hostclock.keep(Path(alloc.config.state_dir), moved)
    assert abs(alloc.placer.seen(False).now - (time.time() - 3 * 3600)) < 60
    hostclock.keep(Path(alloc.config.state_dir), None)
    assert abs(alloc.placer.seen(False).now - time.time()) < 60
