"""Which calls may not be in flight together (allocator/core/leases/inflight.py), and the registry
file every plugin worker shares (allocator/host/inflight.py)."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest

from allocator.core.api.routes import Check, by_id, classify
from allocator.core.leases import inflight
from allocator.core.leases.inflight import Board, Change, Entry, Start, Target, clash
from allocator.host import inflight as inflight_file
from allocator.host.inflight import Registry

CID = "c0ffee" + "1" * 58  # the container a reference names
OTHER = "beef" + "2" * 60
WEB = Target(CID, "web")


def start(ref: str, target: Target | None = WEB) -> Start:
    return Start("start", ref, target)


def create(*names: str) -> Change:
    return Change("create", names=frozenset(names))


RM = Target(CID, "job", auto_remove=True, status="running")  # a --rm container that ran
# (start, change, conflicts): the rule, one row per way a reference can be moved.
CASES = {
    "removing its container by name": (start("web"), Change("remove", "web"), True),
    "removing its container by id prefix": (start("web"), Change("remove", CID[:5]), True),
    "removing its container by full id": (start(CID), Change("remove", CID), True),
    "removing it when started by prefix": (start(CID[:8]), Change("remove", "web"), True),
    "removing another container": (start("web"), Change("remove", "db"), False),
    "removing another by its id": (start(CID), Change("remove", OTHER), False),
    "removing by a link name": (start("web"), Change("remove", "app/db"), True),
    "a prune removes any stopped container": (start(CID), Change("prune"), True),
    "renaming its container away": (start("web"), Change("rename", "/web"), True),
    "renaming its container by id": (start("web"), Change("rename", CID), True),
    "renaming a name with spaces": (start("web"), Change("rename", " web "), True),
    "renaming another, start by name": (start("web"), Change("rename", "db"), False),
    "renaming another, start by full id": (start(CID), Change("rename", OTHER), False),
    "renaming another, start by prefix": (start(CID[:8]), Change("rename", "db"), True),
    "renaming another, nothing named yet": (start("web", None), Change("rename", "db"), True),
    "renaming another, --rm may vanish": (start("job", RM), Change("rename", "db"), True),
    "renaming another, start by link name": (start("app/web"), Change("rename", "app"), True),
    "creating the prefix as a name": (start(CID[:8]), create(CID[:8]), True),
    "creating the full id as a name": (start(CID), create(CID), True),
    "creating a name nothing has yet": (start("web", None), create("web"), True),
    "creating a link's parent": (start("app/web"), create("app"), True),
    "creating another name": (start("web"), create("db"), False),
}  # fmt: skip


@pytest.mark.parametrize(("a", "b", "conflicts"), CASES.values(), ids=CASES.keys())
def test_what_conflicts_with_a_start(a: Start, b: Change, conflicts: bool) -> None:
    assert clash(a, b) is conflicts
    assert clash(b, a) is conflicts  # whichever came first


def test_starts_conflict_only_when_they_start_one_rm_container() -> None:
    created = Target(CID, "job", auto_remove=True, status="created")
    assert clash(start(CID, created), start("job", created))
    assert not clash(start(CID), start("web"))
    assert not clash(Change("remove", "web"), Change("rename", "web"))


GOING = Target(CID, "web", status="removing")
CAFE = Target(CID, "cafe", auto_remove=True, status="running")
REFUSED = {
    "a prefix that names nothing": (start("abc0", None), "reads as an id prefix"),
    "a container being removed": (start("web", GOING), "being removed"),
    "a --rm container by prefix": (start(CID[:8], RM), f"by its full id (docker start {CID})"),
    "a --rm container by a name that is hex": (start("cafe", CAFE), "--rm"),
    "a --rm container by link name": (start("app/job", RM), "--rm"),
}  # fmt: skip
ALLOWED = {
    "a name that names nothing": start("web", None),
    "a container by prefix": start(CID[:8]),
    "a --rm container by name": start("job", RM),
    "a --rm container by full id": start(CID, RM),
    "a --rm container never started": start(CID[:8], Target(CID, "j", True, "created")),
}


@pytest.mark.parametrize(("s", "words"), REFUSED.values(), ids=REFUSED.keys())
def test_starts_whose_reference_could_move_unannounced_are_refused(s: Start, words: str) -> None:
    why = inflight.refusal(s)
    assert why is not None and words in why, why
    assert why.startswith(f"gpu-alloc refused to start {s.ref}")


@pytest.mark.parametrize("s", ALLOWED.values(), ids=ALLOWED.keys())
def test_other_starts_are_left_to_the_registry(s: Start) -> None:
    assert inflight.refusal(s) is None
    assert inflight.needs_name_check(s) is (s.ref == CID and s.target is RM)


def test_a_create_announces_every_name_dockerd_could_read_from_its_query() -> None:
    def names(uri: str) -> frozenset[str]:
        change = inflight.hold_of(classify("POST", uri), uri)
        return change.names if change else frozenset()

    assert names("/v1.41/containers/create?name=web") == {"web"}
    assert names("/containers/create?name=%2Fweb&name=db") == {"web", "db"}
    assert names("/containers/create?x=1;name=old") == {"old"}  # Go before 1.17
    assert names("/containers/create?name=") == frozenset()  # dockerd makes one up
    assert names("/containers/create") == frozenset()


def test_which_routes_are_announced() -> None:
    def hold(method: str, uri: str):
        return inflight.hold_of(classify(method, uri), uri)

    assert hold("POST", "/v1.41/containers/web/rename?name=x") == Change("rename", "web")
    assert hold("DELETE", "/containers/web?force=1") == Change("remove", "web")
    assert hold("POST", "/containers/prune") == Change("prune", "")
    assert hold("POST", "/containers/web/kill") is None
    assert classify("POST", "/containers/web/start").check in inflight.STARTS


def test_the_shim_forwards_a_start_by_full_id_keeping_version_and_query() -> None:
    def pinned(target: str) -> str:
        return by_id(target, classify("POST", target), CID)

    assert pinned("/v1.41/containers/web/start?detachKeys=x") == (
        f"/v1.41/containers/{CID}/start?detachKeys=x"
    )
    assert pinned("/containers/a%2Fb/restart") == f"/containers/{CID}/restart"
    assert classify("POST", pinned("/v1.24/containers/web/start")).check is Check.START


def test_a_board_round_trips_and_ends_calls_one_at_a_time() -> None:
    e1 = Entry("POST /containers/web/start", start("web", RM), 10.0)
    e2 = Entry("DELETE /containers/db", Change("remove", "db"), 10.0)
    board = Board().with_entry(e1, 0).with_entry(e2, 0).with_entry(e1, 0)
    assert Board.from_json(json.loads(json.dumps(board.to_json()))) == board
    ended = board.without(e1.key, 0)
    assert ended is not None and ended.entries == (e2, e1)
    assert ended.generation == board.generation + 1
    assert board.without("nothing", 0) is None
    assert board.blocker(Change("remove", "job"), now=5) == e1
    assert board.blocker(Change("remove", "job"), now=10) is None  # expired
    assert Board.from_json({"entries": [{"key": 1}]}) == Board()


# ------------------------------------------------------------------------ the file


def test_a_conflicting_call_waits_then_is_refused(tmp_path) -> None:
    registry = Registry(tmp_path)
    assert registry.begin("s", start("web"), wait=0)[0] is None
    began = time.monotonic()
    why, _ = registry.begin("r", Change("rename", "web"), wait=0.2)
    assert time.monotonic() - began >= 0.2
    assert why is not None and "a start of web is in progress" in why and "retry" in why
    assert registry.begin("r", Change("rename", "db"), wait=0)[0] is None  # not in its way


def test_a_waiting_call_goes_on_once_the_other_ends(tmp_path) -> None:
    registry = Registry(tmp_path)
    registry.begin("s", start("web"), wait=0)
    threading.Timer(0.1, registry.end, ["s"]).start()
    why, seen = registry.begin("r", Change("remove", "web"), wait=5)
    assert why is None
    assert seen == 2  # the start began and ended before the removal went in
    assert [e.key for e in registry.read().entries] == ["r"]


def test_the_generation_tells_a_start_that_something_began_or_ended_meanwhile(tmp_path) -> None:
    registry = Registry(tmp_path)
    before = registry.generation()
    registry.begin("r", Change("remove", "db"), wait=0)
    registry.end("r")
    _, seen = registry.begin("s", start("web"), wait=0)
    assert seen != before
    registry.end("s")
    registry.end("s")  # an AuthZRes for a call no longer there: nothing happens
    assert registry.generation() == seen + 2  # it began, and ended once


def test_an_unreadable_board_is_unknown_without_the_lock_and_empty_under_it(tmp_path) -> None:
    (tmp_path / inflight_file.BOARD_FILE).write_text("{not json")  # as a read torn by a write
    registry = Registry(tmp_path)
    assert registry.read() is None
    assert registry.generation() == -1  # "something changed": a start looks again
    assert registry.begin("s", start("web"), wait=0) == (None, 0)
    assert [e.key for e in registry.read().entries] == ["s"]


def _race(directory: str, hold: Start | Change, go, out, done) -> None:
    registry = Registry(directory)
    registry.read()
    go.wait()
    out.put(registry.begin("k", hold, wait=0)[0] is None)
    done.wait(10)  # a worker lives on: its entries end with it


def test_two_worker_processes_never_both_hold_calls_that_conflict(tmp_path) -> None:
    """AuthZReq of a start and of a removal of its container reach two workers at once."""
    ctx = multiprocessing.get_context("fork")
    for _ in range(10):
        go, out, done = ctx.Event(), ctx.Queue(), ctx.Event()
        holds = (start("web"), Change("remove", "web"))
        procs = [ctx.Process(target=_race, args=(str(tmp_path), h, go, out, done)) for h in holds]
        for p in procs:
            p.start()
        go.set()
        won = sorted(out.get(timeout=5) for _ in procs)
        done.set()
        for p in procs:
            p.join(10)
        assert won == [False, True]
        Registry(tmp_path).end("k")
        assert Registry(tmp_path).read() == Board(Registry(tmp_path).generation())


def test_an_entry_of_a_worker_that_died_ends_with_it(tmp_path):
    """A worker killed between AuthZReq and AuthZRes: dockerd failed that call."""
    worker = multiprocessing.get_context("fork").Process(
        target=lambda: Registry(tmp_path).begin("k1", Start("start", "job", None))
    )
    worker.start()
    worker.join(10)
    assert [e.key for e in Registry(tmp_path).read().entries] == []
    raw = json.loads((tmp_path / inflight_file.BOARD_FILE).read_text())
    assert [e["pid"] for e in raw["entries"]] == [worker.pid]  # written, then void
    why, _ = Registry(tmp_path).begin("k2", Change("remove", "job"))
    assert why is None


def test_activation_clears_what_a_previous_dockerd_left_in_flight(tmp_path):
    registry = Registry(tmp_path)
    assert registry.begin("k1", Start("start", "job", None))[0] is None
    registry.clear()
    assert registry.read().entries == ()


RUNNING = Target(CID, "db", status="running")
LOOKED_UP_SHOWN = {
    "a restart of a running container": (Start("restart", "db", RUNNING), True),
    "a restart of a stopped container": (Start("restart", "db", Target(CID, "db")), False),
    "a start": (Start("start", "db", RUNNING), False),
    "a restart of nothing": (Start("restart", "db", None), False),
    "a change": (Change("remove", "db"), False),
}  # fmt: skip


@pytest.mark.parametrize(("hold", "shown"), LOOKED_UP_SHOWN.values(), ids=LOOKED_UP_SHOWN.keys())
def test_only_a_restart_of_a_running_container_shows_its_look_up_by_a_signal(hold, shown) -> None:
    assert (inflight.signalled(hold) is not None) is shown


def test_a_restart_dockerd_has_looked_up_holds_nothing_off(tmp_path) -> None:
    registry = Registry(tmp_path)
    registry.begin("s", Start("restart", "db", RUNNING), wait=0)
    asked: list[float] = []

    def looked_up(entry: Entry) -> bool:
        asked.append(entry.began)
        return len(asked) > 1  # the kill event shows up at the second look

    why, _ = registry.begin("r", Change("remove", "db"), wait=0.5, looked_up=looked_up)
    assert why is None
    assert asked and asked[0] <= time.time()
    assert {e.key for e in registry.read().entries} == {"s", "r"}
    why, _ = registry.begin("p", Change("prune"), wait=0.1, looked_up=lambda e: False)
    assert why is not None and "a restart of db is in progress" in why
