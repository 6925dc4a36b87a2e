"""The ledger file: `allocator.core.leases.State` kept in one JSON file under ``state_dir``.

Rules
-----
1. Every change happens under an exclusive file lock (portalocker) taken with
   a deadline; a lock we cannot get in time is an error, never a guess.
2. The file is replaced atomically (write a temp file, fsync it, rename it over the
   old one), so a process killed at any instant leaves the old or the new state,
   never half of one.
3. A file we cannot read, or one written by a newer schema, stops allocation:
   `StateError` names the file and the repair command.
4. Tokens are stored only as SHA-256 hashes: reading the file (or a container's
   labels) never gives anyone a usable token.
5. A create's 201 is recorded in the bind journal (`record_bind`): one small file per
   lease, ``binds/<lease id>``, holding the container id, made with O_EXCL, no lock and
   no fsync.  Every read lays the journal over the state; every transaction folds it
   in and removes what it folded.  A record lost to a power cut (or left empty) only
   leaves its lease pending, which reconcile binds from the container's label.
6. A transaction that only adds leases (a grant, `transaction(grant=True)`) records
   each in the grant journal, ``grants/<lease id>``, instead of rewriting the file;
   the caller makes it durable with `sync_grant`, which a create runs while dockerd
   works on it.  A record belongs to the file it was granted on (its ``generation``):
   the next full write folds it in under a new generation, so a record left behind
   by a crash is recognised as folded and never brings back a lease that ended.
   Readers read the grants before the file, so a fold in between hides a grant from
   nobody.  Only an incomplete record counts as no lease; one that cannot be read
   stops the read (rule 3), and a file of no generation (new, or schema 1's) is
   written whole before any record names one.  A record lost to a power cut leaves a
   container whose lease is gone, which reconcile adopts by its GPUs.
7. Readers read both journals before the file: a full write replaces the file before it
   removes the records it folded, so a record gone when looked for is in the file read
   after it (read the other way round, a fold in between showed a bound lease pending).
   Each process keeps the records it read whole, by name: a record is written once under
   its name (a lease id is never reused, and a bind record holds the container of its
   lease's one create), so a busy journal is read once, not at every lease.

Every full write is fsync'd before it replaces the file; a create's grant is fsync'd
while dockerd works on the create, and before its answer reaches the client.

`State` (the pure lease life) lives in allocator/core/leases.py; this is its file shell.
The journals' records are written, read and laid over a state by allocator/host/journal.py;
when, under which lock and in which order is decided here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import portalocker

from allocator.core.leases import REPAIR_HINT, Lease, State, StateError
from allocator.host import journal

__all__ = ["Ledger", "State", "StateError", "now"]

STATE_FILE = "state.json"
MAX_JOURNAL = 32  # records beside the file before a grant folds them in (reads read each)
LOCK_FILE = "lock"
LOCK_POLL = 0.003  # seconds between tries for a lock another process holds
_EXCLUSIVE_NOW = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING


class Ledger:
    """The state file and its lock.  One instance per process is enough."""

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 5.0):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.binds = self.dir / journal.BINDS_DIR
        self.grants = self.dir / journal.GRANTS_DIR
        self.lock_path = self.dir / LOCK_FILE
        self.lock_timeout = lock_timeout
        self._threads = threading.Lock()
        self._dir_ready = False
        # The last state this process read or wrote, with the file's bytes: a file that
        # reads back the same bytes is that state, so it is not decoded again.
        self._known: tuple[bytes, State] = (_EMPTY, State())
        # Journal records this process read whole, by name (rule 7): a busy host's journal
        # holds up to `MAX_JOURNAL` records, and every lease lays them all over the file.
        self._granted_seen: dict[str, tuple[Path, str, Lease]] = {}
        self._bound_seen: dict[str, tuple[Path, str]] = {}
        # The last lay-over: (the file's bytes and the records' names and contents, the
        # state they make, the records folded in, live grants, live binds).
        self._laid: tuple[object, State, list[Path], int, int] | None = None

    def ensure_dir(self) -> None:
        if self._dir_ready:
            return
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StateError(
                f"{self.dir}: cannot create the state directory: {e.strerror}"
            ) from None
        self._dir_ready = True

    def read(self) -> State:
        """A consistent snapshot without the lock (renames are atomic), journals included."""
        return self._load()[0]

    def sync_grant(self, lease_id: str) -> None:
        """Make lease ``lease_id``'s grant record durable (rule 6): `journal.sync_grant`."""
        journal.sync_grant(self.grants, lease_id)

    def record_bind(self, lease_id: str, container: str) -> bool:
        """The Engine answered lease ``lease_id``'s create with ``container`` (rule 5):
        `journal.record_bind`."""
        return journal.record_bind(self.binds, lease_id, container)

    def _granted(self) -> list[tuple[Path, str, Lease | None]]:
        """The grant journal's records: (path, generation, lease), None for one that is
        incomplete (empty after a power cut, or being written as a reader without the
        lock looks).  A record that cannot be read is no such proof: it stops the read,
        since a lease left out would let its GPUs be granted again."""
        records: list[tuple[Path, str, Lease | None]] = []
        seen: dict[str, tuple[Path, str, Lease]] = {}
        for name in journal.names(self.grants):
            known = self._granted_seen.get(name)
            if known is None:
                record = journal.read_grant(self.grants / name)
                if record is None:
                    continue
                if record[2] is None:  # incomplete: read again next time
                    records.append(record)
                    continue
                known = (record[0], record[1], record[2])
            seen[name] = known
            records.append(known)
        self._granted_seen = seen  # names no longer listed are forgotten
        return records

    def lease(self, lease_id: str) -> Lease | None:
        """Lease ``lease_id`` as `read` has it, from the file and that lease's own records
        alone: a create's admission asks about one lease, and listing both journals and
        reading every record would cost it more than the rest of its judgement.  The records are
        read before the file (rule 7); a record that is not this lease's by its content
        counts for nothing here, so a stray one only refuses.  Other leases' records are
        not read, so one that cannot be read does not stop this read: an admission grants
        no GPU."""
        if not journal.LEASE_ID.fullmatch(lease_id):
            return None
        granted = journal.read_grant(self.grants / lease_id)
        try:
            container = journal.read_record(self.binds / lease_id).decode()
        except (OSError, UnicodeDecodeError):
            container = ""  # no record (or gone meanwhile: folded into the file read next)
        state, _ = self._file()
        lease = state.leases.get(lease_id)
        if lease is None and granted is not None:
            _, generation, recorded = granted
            if recorded is not None and recorded.id == lease_id and generation == state.generation:
                lease = recorded
        if lease is None or not container:
            return lease
        one = State({lease_id: lease})
        one.bind(lease_id, container)
        return one.leases[lease_id]

    def _bind_records(self) -> list[tuple[Path, str]]:
        """The bind journal's records and what each holds (an empty one is being written,
        or was left so by a power cut); a record gone meanwhile was folded."""
        records: list[tuple[Path, str]] = []
        whole: dict[str, tuple[Path, str]] = {}
        for name in journal.names(self.binds):
            known = self._bound_seen.get(name)
            if known is None:
                path = self.binds / name
                try:
                    known = (path, journal.read_record(path).decode())
                except (OSError, UnicodeDecodeError):
                    continue  # gone meanwhile: folded by another transaction
            if journal.CONTAINER_ID.fullmatch(known[1]):
                whole[name] = known
            records.append(known)
        self._bound_seen = whole  # names no longer listed are forgotten
        return records

    def _load(self) -> tuple[State, bytes, list[Path], int, int]:
        """The state with the journals laid over it, the bytes of the file it was read
        from (an empty state's, with no file), the journal records it folded in, and how
        many grants and binds of them are live.  The records are read before the file
        (rules 6 and 7).

        The same file and the same records lay over into the same state: that is kept,
        so a busy host's journal is laid over once, not at every read."""
        granted = self._granted()
        binds = self._bind_records()
        state, raw = self._file()
        key = (
            raw,
            tuple(
                (path.name, generation, lease is not None) for path, generation, lease in granted
            ),
            tuple((path.name, container) for path, container in binds),
        )
        laid = self._laid
        if laid is not None and laid[0] == key:
            return laid[1].copy(), raw, list(laid[2]), laid[3], laid[4]
        done, grants, live = journal.lay_over(state, granted, binds)
        self._laid = (key, state.copy(), done, grants, live)
        return state, raw, list(done), grants, live

    def _file(self) -> tuple[State, bytes]:
        try:
            raw = _whole(self.path)
        except FileNotFoundError:
            return State(), _EMPTY
        except OSError as e:
            raise StateError(f"{self.path}: cannot read: {e.strerror}") from None
        known, state = self._known
        if raw == known:
            return state.copy(), raw
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError is a ValueError too
            raise StateError(f"{self.path}: corrupt JSON ({e}); {REPAIR_HINT}") from None
        state = State.from_json(data, str(self.path))
        self._known = (raw, state.copy())
        return state, raw

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The exclusive lock: threads of this process queue, other processes poll briefly.

        portalocker's default poll is 0.25 s; under contention that, not the work, would
        set the pace, so waiters poll every few milliseconds.  The lock file is opened
        for each transaction, as a bare descriptor (its file object and portalocker's
        `Lock` cost more than the lock): one kept open would pin the state directory's
        filesystem (and need reopening in every forked child).
        """
        self.ensure_dir()
        deadline = time.monotonic() + self.lock_timeout
        if not self._threads.acquire(timeout=self.lock_timeout):
            raise self._timeout()
        try:
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as e:
                raise StateError(f"{self.lock_path}: cannot open the lock: {e.strerror}") from None
            try:
                while True:
                    try:
                        portalocker.lock(fd, _EXCLUSIVE_NOW)
                        break
                    except portalocker.LockException as e:
                        if not _held(e):
                            why = getattr(e.__cause__, "strerror", None) or e
                            raise StateError(f"{self.lock_path}: cannot lock: {why}") from None
                        if time.monotonic() >= deadline:
                            raise self._timeout() from None
                        time.sleep(LOCK_POLL)
                try:
                    yield
                finally:  # unlocked before closed: a child forked meanwhile shares the fd
                    portalocker.unlock(fd)
            finally:
                os.close(fd)
        finally:
            self._threads.release()

    def _timeout(self) -> StateError:
        return StateError(
            f"{self.lock_path}: lock not acquired within {self.lock_timeout:g}s "
            "(another gpu-alloc process holds it); try again"
        )

    @contextlib.contextmanager
    def transaction(self, *, grant: bool = False) -> Iterator[State]:
        """Lock, read, let the caller change the state, write it back if it changed.

        "Changed" is decided on the encoded bytes against the file's own, and none is
        written when nothing changed.  With ``grant``, a change that only adds leases is
        recorded in the grant journal instead (rule 6), while few records are live.
        """
        with self.locked():
            state, raw, folded, grants, binds = self._load()
            base = state.copy() if grant else None
            yield state
            added = state.added_since(base) if base is not None else None
            # A file of no generation (none yet, or written by schema 1) is written whole
            # first: a record always names a generation a full write made.
            if (
                added
                and state.generation
                and grants + binds + len(added) <= MAX_JOURNAL
                and journal.write_grants(self.grants, added, state.generation)
            ):
                return
            # Folding a grant takes a new generation even where the file would read the
            # same (the lease ended meanwhile): its record must be dead from now on.
            if grants or _encode(state) != raw:
                self._commit(state)
            for record in folded:  # in the state file now, or of no more use
                with contextlib.suppress(OSError):
                    record.unlink()

    def write(self, state: State) -> None:
        """Replace the state whole (repair): the journals' records go with the old one."""
        self._commit(state)
        for record in [*journal.records(self.binds), *journal.records(self.grants)]:
            with contextlib.suppress(OSError):
                record.unlink()

    def _commit(self, state: State) -> None:
        """Write ``state`` as a new generation of the file: every grant recorded beside
        the old one is in it, or ended."""
        state.generation = secrets.token_hex(8)
        data = _encode(state)
        self._write(data)
        self._known = (data, state.copy())

    def _write(self, data: bytes) -> None:
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state.", suffix=".tmp")  # 0600
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # No fsync of the directory: a rename lost to a power cut leaves the previous
            # state, and the lease it lacks is adopted back from the container's labels.
            os.replace(tmp, self.path)
        except OSError as e:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise StateError(
                f"{self.path}: cannot write the state ({e.strerror}); the previous state is "
                "kept; free space or fix permissions on the state directory"
            ) from None


def _encode(state: State) -> bytes:
    # Compact: json's C encoder runs only without indent (indent takes the pure-Python one).
    return json.dumps(state.to_json(), sort_keys=True, separators=(",", ":")).encode()


def _held(e: portalocker.LockException) -> bool:
    """Another holds the lock (portalocker 4 says AlreadyLocked; older ones wrap EAGAIN)."""
    cause = e.__cause__
    return isinstance(e, portalocker.AlreadyLocked) or (
        isinstance(cause, OSError) and cause.errno in (errno.EAGAIN, errno.EACCES)
    )


def _whole(path: Path) -> bytes:
    """A file's bytes by bare system calls (no file object: it costs more than the read)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


_EMPTY = _encode(State())


def now() -> float:
    return time.time()
