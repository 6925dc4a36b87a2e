"""allocator/host/ledger.py: the file (hashed tokens, atomic writes, fail-closed reads), the
lock, the journals; the lease life as plain data is in test_leases.py."""

import errno
import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest

from allocator.core.judging.ask import Ask
from allocator.core.leases.leases import REPAIR_HINT, SCHEMA_VERSION, Claim, State, StateError
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.placement import POLICIES, Shortage, place
from allocator.host import journal, ledger, store
from allocator.host.ledger import Ledger

A, B, C, D = (f"GPU-{c * 8}" for c in "abcd")
FORK = multiprocessing.get_context("fork")


def temp_files(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.iterdir() if p.name.endswith(".tmp"))


def with_one_lease(state_dir: Path) -> tuple[Ledger, str]:
    """A ledger whose file holds one pending lease on GPU A; returns it and the file's text."""
    led = Ledger(state_dir)
    with led.transaction() as st:
        st.new_lease((A,), now=100.0, ttl=60.0)
    return led, led.path.read_text()


def test_a_lease_authorized_by_0_1_admits_nothing_and_still_binds(tmp_path: Path) -> None:
    """0.1's plugin consumed tokens in the ledger, and its containers carry the token."""
    st = State()
    lease, token = st.new_lease((A,), 0, 60)
    old = st.to_json()
    old["leases"][lease.id]["state"] = "authorized"
    loaded = State.from_json(old, "state.json")
    assert loaded.leases[lease.id].state == "pending"
    assert "unknown or forged" in (loaded.admits(lease.id, token, frozenset({A})) or "")
    assert loaded.bind(lease.id, "d" * 64)


@pytest.mark.parametrize(
    ("lease_id", "token", "gpus", "why"),
    [
        ("{id}", "{token}x", {A, B}, "unknown or forged"),
        ("{id}", "", {A, B}, "unknown or forged"),
        ("{token}", "{token}", {A, B}, "unknown or forged"),  # token as the id
        ("0000000000000000", "{token}", {A, B}, "unknown or forged"),
        ("{id}", "{token}", {A}, "differ from lease"),
        ("{id}", "{token}", {A, B, C}, "differ from lease"),
        ("{id}", "{token}", {A, C}, "differ from lease"),
    ],
    ids=["wrong token", "empty token", "token as id", "unknown lease", "fewer GPUs",
         "more GPUs", "other GPUs"],
)  # fmt: skip
def test_a_refused_admission_leaves_the_lease_pending_and_usable(
    lease_id: str, token: str, gpus: set[str], why: str
) -> None:
    st = State()
    lease, real = st.new_lease((A, B), 0, 60)
    reason = st.admits(
        lease_id.format(id=lease.id, token=real), token.format(token=real), frozenset(gpus)
    )
    assert reason is not None and why in reason
    assert st.leases[lease.id].state == "pending"
    assert st.admits(lease.id, real, frozenset({A, B})) is None


# --- the file ----------------------------------------------------------------------------------


def test_a_missing_state_file_is_an_empty_state(tmp_path: Path) -> None:
    st = Ledger(tmp_path / "state").read()
    assert (st.leases, st.claims, st.adopted_at) == ({}, {}, None)


def test_the_lease_life_survives_the_file_between_transactions(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "state")
    with led.transaction() as st:
        lease, token = st.new_lease((A, B), now=5.0, ttl=60.0)
    assert led.read().admits(lease.id, token, frozenset({A, B})) is None
    with led.transaction() as st:
        assert st.bind(lease.id, "f" * 64)
    assert led.read().leases[lease.id].state == "bound"
    assert "already" in (led.read().admits(lease.id, token, frozenset({A, B})) or "")
    with led.transaction() as st:
        st.release(lease.id)
    assert led.read().leases == {}


def test_claims_and_adoption_time_round_trip(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    with led.transaction() as st:
        st.claims["x"] = Claim("x", "old", (A, B), "device request")
        st.claims["y"] = Claim("y", "priv", None, "privileged")
        st.adopted_at = 42.5
    st = led.read()
    assert st.claims == {
        "x": Claim("x", "old", (A, B), "device request"),
        "y": Claim("y", "priv", None, "privileged"),
    }
    assert st.adopted_at == 42.5


def test_an_adopted_containers_cores_and_memory_are_held_like_a_leases(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    with led.transaction() as st:
        st.claims["x"] = Claim("x", "lost", (A,), "device request", (2, 3), (0,), 1 << 30)
        st.claims["y"] = Claim("y", "priv", None, "privileged")
    raw = json.loads(led.path.read_text())["claims"]
    assert set(raw["y"]) == {"container", "name", "gpus", "why"}  # as older readers expect
    st = led.read()
    assert st.claims["x"].cpus == (2, 3)
    assert st.leased_cpus() == {2, 3} and st.leased_memory() == {0: 1 << 30}


def test_an_adopted_container_of_a_user_counts_against_their_limit(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    with led.transaction() as st:
        st.claims["x"] = Claim("x", "lost", (A, B), "device request", owner="alice", owner_uid=7)
    st = led.read()
    assert st.held_by("alice") == 2 and st.held_by("bob") == 0
    assert (st.holders({A, B, C})[A].owner, st.holders({A, B, C})[A].owner_uid) == ("alice", 7)


def test_the_token_is_stored_only_as_its_sha256(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    with led.transaction() as st:
        lease, token = st.new_lease((A,), 0, 60)
    text = led.path.read_text()
    assert token not in text
    assert lease.token_sha256 in text
    assert json.loads(text)["leases"][lease.id]["token_sha256"] == lease.token_sha256
    assert led.read().leases[lease.id].token_matches(token)


def test_a_write_leaves_a_private_parseable_file_and_no_temp_files(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "state")
    for i in range(5):
        with led.transaction() as st:
            st.new_lease((f"GPU-{i}",), 0, 60)
    assert json.loads(led.path.read_text())["version"] == SCHEMA_VERSION
    assert len(led.read().leases) == 5
    assert temp_files(led.dir) == []
    assert led.path.stat().st_mode & 0o777 == 0o600
    assert led.dir.stat().st_mode & 0o777 == 0o700


def test_a_transaction_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    with led.transaction() as st:
        assert st.leases == {}
    assert not led.path.exists()


def test_a_transaction_that_raises_writes_nothing(tmp_path: Path) -> None:
    led, before = with_one_lease(tmp_path)
    with pytest.raises(RuntimeError), led.transaction() as st:
        st.leases.clear()
        raise RuntimeError("the caller changed its mind")
    assert led.path.read_text() == before


BAD_FILES = {
    "corrupt JSON": ('{"version": 1, "leases": {', "corrupt JSON"),
    "empty file": ("", "corrupt JSON"),
    "not an object": ("[1, 2]", "not a gpu-alloc state file"),
    "no version": ('{"leases": {}, "claims": {}}', "not a gpu-alloc state file"),
    "version 0": ('{"version": 0, "leases": {}, "claims": {}}', "schema version 0 is unknown"),
    "version as a string": ('{"version": "1", "leases": {}, "claims": {}}', "'1' is unknown"),
    "no leases": ('{"version": 1, "claims": {}}', "malformed entry"),
    "leases as a list": ('{"version": 1, "leases": [], "claims": {}}', "malformed entry"),
    "lease missing fields": (
        '{"version": 1, "leases": {"x": {"id": "x"}}, "claims": {}}',
        "malformed entry",
    ),
    "lease with an unknown field": (
        '{"version": 1, "leases": {"x": {"id": "x", "gpus": [], "token_sha256": "",'
        ' "colour": "red"}}, "claims": {}}',
        "malformed entry",
    ),
    "lease gpus null": (
        '{"version": 1, "leases": {"x": {"id": "x", "gpus": null, "token_sha256": ""}},'
        ' "claims": {}}',
        "malformed entry",
    ),
    "claim not an object": (
        '{"version": 1, "leases": {}, "claims": {"c": "busy"}}',
        "malformed entry",
    ),
}


@pytest.mark.parametrize(("text", "why"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_an_unreadable_state_file_stops_allocation_naming_the_file_and_the_repair(
    tmp_path: Path, text: str, why: str
) -> None:
    led = Ledger(tmp_path)
    led.path.write_text(text)
    with pytest.raises(StateError) as info:
        led.read()
    msg = str(info.value)
    assert msg.startswith(f"{led.path}: ")
    assert why in msg
    assert REPAIR_HINT in msg and "gpu-alloc repair" in msg
    with pytest.raises(StateError), led.transaction():
        pass  # a transaction refuses too, and never overwrites the evidence
    assert led.path.read_text() == text


def test_a_state_file_from_a_newer_gpu_alloc_asks_for_an_upgrade(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    text = json.dumps({"version": SCHEMA_VERSION + 1, "leases": {}, "claims": {}, "new": 1})
    led.path.write_text(text)
    with pytest.raises(StateError) as info:
        led.read()
    msg = str(info.value)
    assert msg.startswith(f"{led.path}: schema version {SCHEMA_VERSION + 1} ")
    assert "newer gpu-alloc" in msg and "upgrade" in msg
    with pytest.raises(StateError), led.transaction():
        pass
    assert led.path.read_text() == text


def _raise_enospc(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize(
    ("target", "name"),
    [(os, "replace"), (os, "fsync"), (store.tempfile, "mkstemp")],
    ids=["os.replace", "os.fsync", "mkstemp (unwritable directory)"],
)
def test_a_failing_write_is_a_state_error_and_keeps_the_previous_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: object, name: str
) -> None:
    led, before = with_one_lease(tmp_path)
    monkeypatch.setattr(target, name, _raise_enospc)
    with pytest.raises(StateError) as info, led.transaction() as st:
        st.new_lease((B,), 0, 60)
    msg = str(info.value)
    assert msg.startswith(f"{led.path}: cannot write the state (No space left on device)")
    assert "previous state is kept" in msg
    monkeypatch.undo()
    assert led.path.read_text() == before
    assert temp_files(tmp_path) == []


def test_a_state_directory_that_cannot_be_created_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    led = Ledger(tmp_path / "file" / "state")
    with pytest.raises(StateError, match="cannot create the state directory"), led.transaction():
        pass


def test_a_read_sees_every_other_writer_and_changes_to_it_stay_the_readers(
    tmp_path: Path,
) -> None:
    shim, plugin = Ledger(tmp_path), Ledger(tmp_path)  # two processes' ledgers, one file
    with shim.transaction() as st:
        first, _ = st.new_lease((A,), now=100.0, ttl=60.0)
    assert set(plugin.read().leases) == {first.id}
    with shim.transaction() as st:
        second, _ = st.new_lease((B,), now=100.0, ttl=60.0)
    assert set(plugin.read().leases) == {first.id, second.id}  # new bytes: read anew
    mine = plugin.read()
    mine.leases.clear()  # a reader's copy: the next read is the file's, not this
    assert set(plugin.read().leases) == {first.id, second.id}
    led = Ledger(tmp_path)
    led.path.write_text(json.dumps({**json.loads(led.path.read_text()), "leases": {}}))
    assert plugin.read().leases == {}  # a file changed under it, by anyone
    with plugin.transaction() as st:
        st.new_lease((C,), now=100.0, ttl=60.0)
    assert [le.gpus for le in shim.read().leases.values()] == [(C,)]


# --- the lock ----------------------------------------------------------------------------------


def _hold_lock(state_dir: str, held: object, done: object) -> None:
    with Ledger(state_dir).locked():
        held.set()  # type: ignore[attr-defined]
        done.wait(10)  # type: ignore[attr-defined]


def test_a_lock_held_by_another_process_times_out_with_a_state_error(tmp_path: Path) -> None:
    held, done = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(tmp_path), held, done))
    holder.start()
    try:
        assert held.wait(5)
        led = Ledger(tmp_path, lock_timeout=0.3)
        start = time.monotonic()
        with pytest.raises(StateError) as info, led.transaction():
            pass
        assert time.monotonic() - start >= 0.25
        assert str(info.value).startswith(f"{led.lock_path}: lock not acquired within 0.3s")
    finally:
        done.set()
        holder.join(5)
    with Ledger(tmp_path, lock_timeout=1).transaction() as st:  # free again once released
        st.new_lease((A,), 0, 60)
    assert len(Ledger(tmp_path).read().leases) == 1


def _try_lock(led: Ledger, parent_holds: object, got: object) -> None:
    parent_holds.wait(5)  # type: ignore[attr-defined]
    try:
        with led.locked():
            got.put("acquired")  # type: ignore[attr-defined]
    except StateError:
        got.put("timed out")  # type: ignore[attr-defined]


def test_a_forked_child_does_not_share_its_parents_open_lock(tmp_path: Path) -> None:
    """A child made by fork (gunicorn's workers) from a ledger that has locked before
    must lock on its own: whatever it inherits must not make the parent's lock its own."""
    led = Ledger(tmp_path, lock_timeout=0.3)
    with led.transaction():
        pass
    parent_holds, got = FORK.Event(), FORK.Queue()
    child = FORK.Process(target=_try_lock, args=(led, parent_holds, got))
    child.start()
    with led.locked():
        parent_holds.set()
        assert got.get(timeout=5) == "timed out"
    child.join(5)


def test_a_replaced_lock_file_is_opened_anew(tmp_path: Path) -> None:
    old = Ledger(tmp_path, lock_timeout=0.3)
    with old.transaction():
        pass
    old.lock_path.unlink()  # an operator's clean-up, say
    held, done = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(tmp_path), held, done))
    holder.start()
    try:
        assert held.wait(5)  # it locks the new file
        with pytest.raises(StateError, match="lock not acquired"), old.transaction():
            pass
    finally:
        done.set()
        holder.join(5)
    with old.transaction() as st:
        st.new_lease((A,), 0, 60)
    assert len(Ledger(tmp_path).read().leases) == 1


# --- many processes at once --------------------------------------------------------------------

POOL = Inventory(tuple(GPU(f"GPU-{i}", i) for i in range(4)))
ONE_GPU = Ask(required=(), count=1, every=False, caps=("gpu",))


def _violations(st: State) -> list[str]:
    owners: dict[str, str] = {}
    found = [f"{len(st.leases)} leases on 4 GPUs"] if len(st.leases) > 4 else []
    for lease in st.leases.values():
        for uuid in lease.gpus:
            if uuid in owners:
                found.append(f"{uuid} in leases {owners[uuid]} and {lease.id}")
            owners[uuid] = lease.id
    return found


def _allocate_and_release(state_dir: str, seed: int, rounds: int, grant: bool) -> dict[str, object]:
    rng = random.Random(seed)
    led = Ledger(state_dir, lock_timeout=30)
    created, released, violations, shortages = [], [], [], 0
    for _ in range(rounds):
        with led.transaction(grant=grant) as st:
            violations += _violations(st)
            held = st.holders(POOL.uuids)
            picked = place(ONE_GPU, POOL, held, POLICIES["first-fit"])
            if isinstance(picked, Shortage):
                shortages += 1
            else:
                lease, _ = st.new_lease(tuple(g.uuid for g in picked), now=0, ttl=60)
                created.append(lease.id)
            if st.leases and rng.random() < 0.4:
                released.append(st.release(rng.choice(sorted(st.leases))).id)
            violations += _violations(st)
    return {"created": created, "released": released, "violations": violations,
            "shortages": shortages}  # fmt: skip


@pytest.mark.parametrize("grant", [False, True], ids=["full writes", "with grant records"])
def test_concurrent_transactions_never_share_a_gpu_nor_lose_an_update(
    tmp_path: Path, grant: bool
) -> None:
    workers, rounds = 8, 40
    with FORK.Pool(workers) as pool:
        results = pool.starmap(
            _allocate_and_release,
            [(str(tmp_path), seed, rounds, grant) for seed in range(workers)],
        )
    assert [v for r in results for v in r["violations"]] == []
    created = [i for r in results for i in r["created"]]
    released = [i for r in results for i in r["released"]]
    assert len(created) == len(set(created))
    assert len(released) == len(set(released))  # no lease was released twice
    final = Ledger(tmp_path).read()
    assert _violations(final) == []
    # A lost update would drop a new lease or resurrect a released one.
    assert set(final.leases) == set(created) - set(released)
    assert sum(r["shortages"] for r in results) > 0  # the pool did run full
    assert temp_files(tmp_path) == []


# --- a writer killed at any instant ------------------------------------------------------------


def _churn(state_dir: str, grant: bool) -> None:
    led = Ledger(state_dir)
    i = 0
    while True:
        with led.transaction(grant=grant) as st:  # with grant: a grant record
            st.new_lease((f"GPU-{i % 4}", f"GPU-{(i + 1) % 4}"), now=i, ttl=60)
        with led.transaction() as st:
            while len(st.leases) > 3:
                st.release(min(st.leases.values(), key=lambda le: le.created).id)
        i += 1


@pytest.mark.parametrize("grant", [False, True], ids=["full writes", "with grant records"])
def test_a_writer_killed_at_random_moments_leaves_a_parseable_state(
    tmp_path: Path, grant: bool
) -> None:
    rng = random.Random(20240611)
    led = Ledger(tmp_path)
    seen: set[str] = set()
    for kills in range(8):
        child = FORK.Process(target=_churn, args=(str(tmp_path), grant))
        child.start()
        # Killed at a random moment after this writer has written something new (a
        # loaded machine can take longer than the random wait to let it run at all).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            not led.path.exists() or led.path.read_text() in seen
        ):
            time.sleep(0.001)
        time.sleep(rng.uniform(0.005, 0.08))
        os.kill(child.pid, signal.SIGKILL)
        child.join(5)
        assert child.exitcode == -signal.SIGKILL
        text = led.path.read_text()
        assert json.loads(text)["version"] == SCHEMA_VERSION
        # three kept, and one more for each writer killed between adding and releasing
        assert 1 <= len(led.read().leases) <= 4 + kills
        seen.add(text)
    assert len(seen) > 1  # the writer made progress between kills
    with Ledger(tmp_path, lock_timeout=1).transaction() as st:  # no lock left behind
        st.leases.clear()
    assert Ledger(tmp_path).read().leases == {}


# --- the bind journal --------------------------------------------------------------------------


def test_a_recorded_bind_is_read_at_once_and_folded_by_the_next_transaction(
    tmp_path: Path,
) -> None:
    led = Ledger(tmp_path / "state")
    with led.transaction() as st:
        lease, _ = st.new_lease((A,), now=0, ttl=60)
    assert led.record_bind(lease.id, "c" * 64)
    assert led.read().leases[lease.id].container == "c" * 64  # no transaction yet
    assert (led.binds / lease.id).exists()
    with led.transaction():
        pass
    assert not (led.binds / lease.id).exists()
    on_disk = json.loads(led.path.read_text())["leases"][lease.id]
    assert (on_disk["state"], on_disk["container"]) == ("bound", "c" * 64)


def test_the_first_recorded_answer_wins(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "state")
    with led.transaction() as st:
        lease, _ = st.new_lease((A,), now=0, ttl=60)
    assert led.record_bind(lease.id, "c" * 64)
    assert led.record_bind(lease.id, "c" * 64)  # the same answer twice
    assert not led.record_bind(lease.id, "d" * 64)
    assert led.read().leases[lease.id].container == "c" * 64


def test_an_empty_record_from_a_power_cut_leaves_the_lease_pending(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "state")
    with led.transaction() as st:
        lease, _ = st.new_lease((A,), now=0, ttl=60)
    led.binds.mkdir()
    (led.binds / lease.id).write_bytes(b"")
    assert led.read().leases[lease.id].state == "pending"
    with led.transaction() as st:
        assert st.bind(lease.id, "e" * 64)  # reconcile binds it from the label
    assert led.read().leases[lease.id].container == "e" * 64


def test_records_of_ended_leases_are_removed(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "state")
    with led.transaction() as st:
        lease, _ = st.new_lease((A,), now=0, ttl=60)
    assert led.record_bind(lease.id, "c" * 64)
    with led.transaction() as st:
        st.release(lease.id)
    assert led.read().leases == {}
    assert list(led.binds.iterdir()) == []


def test_a_record_is_never_a_path_outside_the_journal(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "state")
    assert not led.record_bind("../state.json", "c" * 64)
    assert not led.record_bind("0123456789ABCDEF", "c" * 64)
    assert not (tmp_path / "state").exists()


# --- the grant journal -------------------------------------------------------------------------


def grant(led: Ledger, gpu: str = A) -> str:
    with led.transaction(grant=True) as st:
        lease, _ = st.new_lease((gpu,), now=100.0, ttl=60.0)
    return lease.id


def written(state_dir: Path) -> Ledger:
    """A ledger whose file a full write made (it has a generation for grants to name)."""
    led = Ledger(state_dir)
    led.write(State())
    return led


def grant_records(led: Ledger) -> list[str]:
    return sorted(p.name for p in led.grants.iterdir()) if led.grants.exists() else []


def test_a_grant_is_a_record_beside_the_file_that_every_reader_sees(tmp_path: Path) -> None:
    shim, plugin = written(tmp_path), Ledger(tmp_path)
    before = shim.path.read_bytes()
    lease_id = grant(shim)
    assert grant_records(shim) == [lease_id]
    assert shim.path.read_bytes() == before  # not rewritten
    assert set(plugin.read().leases) == {lease_id}
    with plugin.transaction() as st:  # another transaction: a holder like any other
        assert st.holders({A, B}).keys() == {A}


def test_the_next_full_write_folds_the_grants_in_under_a_new_generation(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    first, second = grant(led, A), grant(led, B)
    with led.transaction() as st:
        st.release(first)
    assert grant_records(led) == []
    on_disk = json.loads(led.path.read_text())
    assert set(on_disk["leases"]) == {second} and on_disk["generation"]


def test_a_grant_record_a_crash_left_behind_never_brings_an_ended_lease_back(
    tmp_path: Path,
) -> None:
    led = written(tmp_path)
    lease_id = grant(led)
    left = led.grants / lease_id
    kept = left.read_bytes()
    with led.transaction() as st:
        st.release(lease_id)  # folded, then ended, in one full write
    left.write_bytes(kept)  # as if the writer died before removing the record
    assert Ledger(tmp_path).read().leases == {}
    with led.transaction():
        pass
    assert grant_records(led) == []  # a dead record is cleared by the next transaction


def test_a_grant_record_a_power_cut_left_empty_is_no_lease_and_is_cleared(
    tmp_path: Path,
) -> None:
    led = written(tmp_path)
    lease_id = grant(led)
    (led.grants / lease_id).write_bytes(b'{"generation": "", "lea')  # or half written
    assert led.read().leases == {}
    with led.transaction():
        pass
    assert sorted(p.name for p in led.grants.iterdir()) == []


def test_a_full_write_a_power_cut_lost_leaves_the_previous_file_and_kills_later_grants(
    tmp_path: Path,
) -> None:
    """The rename is not made durable (the directory is not fsync'd): after a power cut
    the previous file may be back, and a grant recorded on the lost one is no lease
    (reconcile adopts its container by its GPUs), never a lease of the file read now."""
    led = written(tmp_path)
    kept = grant(led, A)
    with led.transaction() as st:
        st.bind(kept, "c" * 64)  # a full write: generation 2, the grant folded in
    previous = led.path.read_bytes()
    with led.transaction() as st:
        st.release(kept)  # generation 3
    lost = grant(led, B)  # a record naming generation 3
    led.path.write_bytes(previous)  # the power cut: generation 3's rename never happened
    fresh = Ledger(tmp_path)
    assert set(fresh.read().leases) == {kept}
    assert fresh.lease(lost) is None
    with fresh.transaction() as st:
        assert st.holders({A, B}).keys() == {A}
    assert grant_records(led) == []  # the dead record is cleared


def test_a_temp_file_a_killed_write_left_is_never_read(tmp_path: Path) -> None:
    led = written(tmp_path)
    lease_id = grant(led)
    (tmp_path / ".state.json.k1ll3d.tmp").write_bytes(b'{"version": 2, "lea')
    (led.grants / ".half.tmp").write_bytes(b"{")
    assert set(Ledger(tmp_path).read().leases) == {lease_id}


def test_a_fold_between_a_readers_two_reads_hides_no_grant(tmp_path: Path, monkeypatch) -> None:
    """Grants are read before the file, so a fold in between loses nothing."""
    writer, reader = written(tmp_path), Ledger(tmp_path)
    lease_id = grant(writer)
    file_of = reader._file

    def fold_first() -> tuple[State, bytes]:
        with writer.transaction() as st:
            st.bind(lease_id, "c" * 64)  # a full write: the grant is folded and removed
        return file_of()

    monkeypatch.setattr(reader, "_file", fold_first)
    assert set(reader.read().leases) == {lease_id}
    assert grant_records(writer) == []


def test_a_transaction_that_changes_more_than_new_leases_writes_the_file(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    lease_id = grant(led)
    with led.transaction(grant=True) as st:
        st.new_lease((B,), now=100.0, ttl=60.0)
        st.release(lease_id)
    assert grant_records(led) == []
    assert len(json.loads(led.path.read_text())["leases"]) == 1


def test_past_the_journal_limit_a_grant_folds_the_records_in(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ledger, "MAX_JOURNAL", 2)
    led = written(tmp_path)
    ids = [grant(led, gpu) for gpu in (A, B, C)]
    assert grant_records(led) == []  # the third went with a full write
    assert set(json.loads(led.path.read_text())["leases"]) == set(ids)


def test_sync_grant_fsyncs_a_live_record_and_is_done_for_a_folded_one(
    tmp_path: Path, monkeypatch
) -> None:
    led = written(tmp_path)
    lease_id = grant(led)
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))
    )
    led.sync_grant(lease_id)
    assert synced == [str(led.grants / lease_id)]
    with led.transaction() as st:
        st.bind(lease_id, "c" * 64)  # folded by a full write, fsync'd there
    synced.clear()
    led.sync_grant(lease_id)
    assert synced == []


def test_a_grant_on_a_file_of_no_generation_writes_the_file_whole(tmp_path: Path) -> None:
    """A record always names a generation a full write made: on a new state directory, or
    a file schema 1 wrote (which schema 1's readers would read without the record), the
    first grant writes the file."""
    fresh = Ledger(tmp_path / "new")
    lease_id = grant(fresh)
    assert grant_records(fresh) == []
    on_disk = json.loads(fresh.path.read_text())
    assert set(on_disk["leases"]) == {lease_id} and on_disk["generation"]
    old = Ledger(tmp_path / "old")
    old.dir.mkdir()
    old.path.write_text(json.dumps({"version": 1, "leases": {}, "claims": {}}))
    assert old.read().generation == ""
    grant(old)
    assert grant_records(old) == []
    assert json.loads(old.path.read_text())["version"] == SCHEMA_VERSION == 2


def test_a_grant_record_that_cannot_be_read_stops_the_transaction(
    tmp_path: Path, monkeypatch
) -> None:
    """Left out, its lease's GPUs could be granted again: only an incomplete record is
    proof of no lease, not one that could not be opened (a full descriptor table)."""
    led = written(tmp_path)
    lease_id = grant(led)
    real = os.open

    def crowded(path: object, flags: int, *mode: int) -> int:
        if "/grants/" in str(path):
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path, flags, *mode)

    monkeypatch.setattr(os, "open", crowded)
    refused = pytest.raises(StateError, match="cannot read the grant: Too many open files")
    with refused, led.transaction(grant=True) as st:
        st.new_lease((A,), now=100.0, ttl=60.0)
    monkeypatch.undo()
    assert [le.gpus for le in led.read().leases.values()] == [(A,)]
    assert set(led.read().leases) == {lease_id}


def test_a_grant_that_cannot_be_recorded_beside_the_file_is_written_into_it(
    tmp_path: Path, monkeypatch
) -> None:
    led = written(tmp_path)
    real = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(led.grants)):
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    lease_id = grant(led)
    assert set(json.loads(led.path.read_text())["leases"]) == {lease_id}
    assert not led.grants.exists()  # nothing half written is left


# --- one lease, read alone (a create's admission) ---------------------------------------------


def one_lease_situations(tmp_path: Path) -> list[tuple[str, Ledger, str]]:
    """(what, ledger, lease id): every way the journals can hold a lease, or not."""
    out = []

    def fresh(name: str) -> Ledger:
        (tmp_path / name).mkdir()
        return written(tmp_path / name)

    led = fresh("recorded")
    out.append(("a grant recorded beside the file", led, grant(led)))
    led = fresh("bound by record")
    lease_id = grant(led)
    led.record_bind(lease_id, "c" * 64)
    out.append(("a recorded grant with a recorded bind", led, lease_id))
    led = fresh("folded")
    lease_id = grant(led)
    with led.transaction():
        pass  # folded into the file by a transaction that found the record
    with led.transaction() as st:
        st.bind(lease_id, "c" * 64)
    out.append(("a lease folded into the file", led, lease_id))
    led = fresh("bound elsewhere")
    lease_id = grant(led)
    with led.transaction() as st:
        st.bind(lease_id, "c" * 64)
    (led.binds).mkdir(exist_ok=True)
    (led.binds / lease_id).write_text("d" * 64)  # a record for another container: no news
    out.append(("a bind record naming another container", led, lease_id))
    led = fresh("dead record")
    lease_id = grant(led)
    kept = (led.grants / lease_id).read_bytes()
    with led.transaction() as st:
        st.release(lease_id)
    (led.grants / lease_id).write_bytes(kept)  # left by a writer that died
    out.append(("a record of an older generation", led, lease_id))
    led = fresh("torn")
    lease_id = grant(led)
    (led.grants / lease_id).write_bytes(b'{"generation": "", "lea')
    out.append(("a record a power cut left half written", led, lease_id))
    led = fresh("empty bind")
    lease_id = grant(led)
    led.binds.mkdir()
    (led.binds / lease_id).write_bytes(b"")
    out.append(("an empty bind record", led, lease_id))
    out.append(("no such lease", fresh("none"), "0123456789abcdef"))
    out.append(("not a lease id", fresh("bad id"), "../state.json"))
    return out


def test_one_lease_read_alone_is_the_lease_the_whole_read_has(tmp_path: Path) -> None:
    for what, led, lease_id in one_lease_situations(tmp_path):
        assert led.lease(lease_id) == led.read().leases.get(lease_id), what


def test_one_lease_read_alone_lists_no_journal(tmp_path: Path, monkeypatch) -> None:
    led = written(tmp_path)
    lease_id = grant(led)
    for other in (B, C):
        grant(led, other)
    monkeypatch.setattr(journal, "records", lambda directory: pytest.fail(f"listed {directory}"))
    lease = led.lease(lease_id)
    assert lease is not None and lease.gpus == (A,)


# --- a busy journal, read again -----------------------------------------------------------------


def test_a_journal_record_is_read_once_by_a_process(tmp_path: Path, monkeypatch) -> None:
    """A record is written once under its name: every lease used to read them all again,
    up to `MAX_JOURNAL` of them on a busy host."""
    led = written(tmp_path)
    ids = [grant(led, gpu) for gpu in (A, B)]
    for lease_id in ids:
        led.record_bind(lease_id, lease_id[0] * 64)
    reader = Ledger(tmp_path)
    reader.read()
    third = grant(led, C)  # another process grants
    opened: list[str] = []
    real = journal.read_record
    monkeypatch.setattr(
        journal, "read_record", lambda path: (opened.append(path.name), real(path))[1]
    )
    assert set(reader.read().leases) == {*ids, third}
    assert opened == [third]  # only the new record
    assert [reader.read().leases[i].container for i in ids] == [i[0] * 64 for i in ids]


def test_a_reread_journal_is_the_state_a_fresh_reader_sees(tmp_path: Path) -> None:
    led, reader = written(tmp_path), Ledger(tmp_path)
    first = grant(led, A)
    assert reader.read() == Ledger(tmp_path).read()
    led.record_bind(first, "c" * 64)
    assert reader.read().leases[first].container == "c" * 64  # the new bind record is seen
    changed = reader.read()
    changed.leases.clear()  # a caller's changes stay its own
    assert set(reader.read().leases) == {first}
    with led.transaction() as st:
        st.release(first)  # a full write folds and removes the records
    assert reader.read() == Ledger(tmp_path).read()
    assert reader.read().leases == {}


def test_an_empty_bind_record_is_read_again_until_it_is_whole(tmp_path: Path) -> None:
    """A bind record is written without the lock: a reader may meet it empty."""
    led = written(tmp_path)
    lease_id = grant(led)
    led.binds.mkdir()
    (led.binds / lease_id).write_bytes(b"")
    assert led.read().leases[lease_id].state == "pending"
    (led.binds / lease_id).write_text("c" * 64)
    assert led.read().leases[lease_id].container == "c" * 64


def test_a_fold_just_after_a_readers_file_read_shows_no_bound_lease_pending(
    tmp_path: Path, monkeypatch
) -> None:
    """A full write replaces the file, then removes the records it folded.  Read
    file first and records after, a fold in between showed the lease pending, and a
    pending lease admits a create."""
    writer, reader = written(tmp_path), Ledger(tmp_path)
    lease_id = grant(writer)
    writer.record_bind(lease_id, "c" * 64)
    file_of = reader._file

    def fold_after() -> tuple[State, bytes]:
        read = file_of()
        with writer.transaction():
            pass  # folds the grant and the bind, and removes both records
        return read

    monkeypatch.setattr(reader, "_file", fold_after)
    assert reader.read().leases[lease_id].container == "c" * 64
    lease_id = grant(writer, B)  # and a create's admission, which reads one lease
    writer.record_bind(lease_id, "d" * 64)
    lease = reader.lease(lease_id)
    assert lease is not None and lease.container == "d" * 64
