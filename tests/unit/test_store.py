"""allocator.host.store: the one lock, atomic replace and read every state-directory store uses."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from allocator.core.leases.leases import StateError
from allocator.host import store
from allocator.host.store import Lock, LockTimeout

FORK = multiprocessing.get_context("fork")


def _hold(path: str, shared: bool, held: object, done: object) -> None:
    with Lock(path, 5).held(shared=shared):
        held.set()  # type: ignore[attr-defined]
        done.wait(10)  # type: ignore[attr-defined]


class Holder:
    """Another process holding the lock on ``path`` until the block ends."""

    def __init__(self, path: Path, shared: bool = False) -> None:
        self.held, self.done = FORK.Event(), FORK.Event()
        self.proc = FORK.Process(target=_hold, args=(str(path), shared, self.held, self.done))

    def __enter__(self) -> Holder:
        self.proc.start()
        assert self.held.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.proc.join(5)


def test_a_lock_held_elsewhere_times_out_with_a_clear_state_error(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with Holder(path):
        began = time.monotonic()
        with pytest.raises(LockTimeout) as info, Lock(path, 0.3).held():
            pass
        assert time.monotonic() - began >= 0.3
    assert isinstance(info.value, StateError)  # what the service turns into a refusal
    assert str(info.value) == (
        f"{path}: lock not acquired within 0.3s (another gpu-alloc process holds it); try again"
    )
    with Lock(path, 0.3).held():  # free again once the holder is gone
        pass


def test_a_lock_asked_with_no_time_to_wait_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    lock = Lock(path, 5)
    with Holder(path):
        began = time.monotonic()
        with pytest.raises(LockTimeout, match="within 0s"), lock.held(0):
            pass
        assert time.monotonic() - began < 2.5  # not the 5 s a wait would take


def test_a_waiter_gets_the_lock_once_the_holder_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = Holder(path)
    with holder:
        threading.Timer(0.2, holder.done.set).start()
        began = time.monotonic()
        with Lock(path, 5).held():
            waited = time.monotonic() - began
    assert 0.15 <= waited < 2


def test_shared_holders_share_and_keep_an_exclusive_one_out(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with (
        Holder(path, shared=True),
        Lock(path, 0.2).held(shared=True),
        pytest.raises(LockTimeout),
        Lock(path, 0.2).held(),
    ):
        pass
    with Holder(path), pytest.raises(LockTimeout), Lock(path, 0.2).held(shared=True):
        pass


def test_threads_of_one_process_never_hold_a_kept_open_lock_together(tmp_path: Path) -> None:
    lock = Lock(tmp_path / "board", 5, keep_open=True)
    inside, overlaps = [0], []

    def work() -> None:
        for _ in range(50):
            with lock.held():
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(overlaps) == 200 and set(overlaps) == {1}


def _try(lock: Lock, parent_holds: object, got: object) -> None:
    parent_holds.wait(5)  # type: ignore[attr-defined]
    try:
        with lock.held(0.2):
            got.put("acquired")  # type: ignore[attr-defined]
    except LockTimeout:
        got.put("timed out")  # type: ignore[attr-defined]


def test_a_kept_open_lock_is_opened_anew_in_a_forked_child(tmp_path: Path) -> None:
    """flock is per open file: a descriptor a forked worker inherits would make the
    parent's lock its own."""
    lock = Lock(tmp_path / "board", 5, keep_open=True)
    with lock.held():
        pass  # opened, and kept
    parent_holds, got = FORK.Event(), FORK.Queue()
    child = FORK.Process(target=_try, args=(lock, parent_holds, got))
    child.start()
    with lock.held():
        parent_holds.set()
        assert got.get(timeout=5) == "timed out"
    child.join(5)


def test_a_kept_open_lock_follows_its_file_when_it_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "board"
    lock = Lock(path, 0.2, keep_open=True)
    with lock.held():
        pass
    path.unlink()  # an operator's clean-up, or a tmpfs made anew
    with Holder(path), pytest.raises(LockTimeout), lock.held():
        pass


def test_a_lock_is_made_with_its_directory_and_one_that_cannot_be_is_a_state_error(
    tmp_path: Path,
) -> None:
    with Lock(tmp_path / "new" / "lock", 1).held():
        pass
    assert (tmp_path / "new" / "lock").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    (tmp_path / "file").write_text("")
    bad = Lock(tmp_path / "file" / "lock", 1)
    with pytest.raises(StateError, match="file/lock: cannot open the lock"), bad.held():
        pass


# --- replace ------------------------------------------------------------------------------------


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def _replace_then_die(path: str, written: object) -> None:
    def stop(src: str, dst: str) -> None:
        written.set()  # type: ignore[attr-defined]
        time.sleep(30)  # killed here: the new file is whole, not renamed yet

    store.os.replace = stop  # type: ignore[assignment]
    store.replace(Path(path), b'{"new": true}')


def test_a_crash_between_the_temp_write_and_the_rename_leaves_the_old_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    store.replace(path, b'{"old": true}')
    written = FORK.Event()
    child = FORK.Process(target=_replace_then_die, args=(str(path), written))
    child.start()
    assert written.wait(5)
    os.kill(child.pid, signal.SIGKILL)
    child.join(5)
    assert store.read(path) == b'{"old": true}'
    (left,) = temp_files(tmp_path)  # a temp file no store reads
    assert left.startswith(".state.json.")
    assert (tmp_path / left).read_bytes() == b'{"new": true}'


@pytest.mark.parametrize("name", ["write", "fsync", "replace"])
def test_a_failed_replace_raises_keeps_the_old_file_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / "health.json"
    store.replace(path, b"old")

    def enospc(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, name, enospc)
    with pytest.raises(OSError, match="No space left"):
        store.replace(path, b"new" * 1000)
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert temp_files(tmp_path) == []


def test_replace_fsyncs_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(store.os, "fsync", synced.append)
    store.replace(tmp_path / "activity.json", b"{}", sync=False)
    assert synced == []
    store.replace(tmp_path / "state.json", b"{}")
    assert len(synced) == 1


def test_replace_gives_the_mode_asked_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        store.replace(tmp_path / "health.json", b"{}", mode=0o644)
        store.replace(tmp_path / "state.json", b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "health.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600


def test_read_returns_a_file_larger_than_one_read(tmp_path: Path) -> None:
    data = os.urandom(200_000)
    (tmp_path / "big").write_bytes(data)
    assert store.read(tmp_path / "big") == data
    with pytest.raises(FileNotFoundError):
        store.read(tmp_path / "missing")
