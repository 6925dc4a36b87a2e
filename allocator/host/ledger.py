"""The ledger: `allocator.core.leases.leases.State` kept under ``state_dir``, a file and two
journals.

Rules
-----
1. Every change is made under the ledger's lock (`store.Lock` on ``state_dir/lock``,
   with a deadline: a lock not got in time is an error, never a guess).  Readers take
   no lock: they read the journals, then the file, as the tables below say.
2. A file or record that cannot be read, or a file of a newer schema, stops allocation:
   `StateError` names the file and the repair command.
3. Tokens are stored only as SHA-256 hashes: reading the files (or a container's labels)
   never gives anyone a usable token.

The files and their writes
--------------------------
``state.json`` holds every lease under a *generation*, a random id each full write
makes.  Beside it, one small record a lease: ``grants/<id>`` a lease a grant added
without rewriting the file, with the generation it was granted on; ``binds/<id>`` the
container that lease's create made (its 201).

========== ====================== ===== ================================= ======================
step       when                   lock  writes, in this order             durable
========== ====================== ===== ================================= ======================
grant      a transaction that     held  ``grants/<id>``: O_EXCL, in       fsync'd (`sync_grant`)
           only adds leases, on         place; dockerd is asked only      while dockerd creates,
           a file of a                  once it is whole                  before the client
           generation, while                                              hears of it
           `MAX_JOURNAL` allows
bind       a create's 201         none  ``binds/<id>``: O_EXCL, the       never
                                        first one wins
full write any other change (a    held  1. ``state.json`` under a new     the file, fsync'd
           repair: `write`)             generation, every live record     before its rename; not
                                        folded in (`store.replace`)       the directory
                                        2. removes the records it folded
                                        (a repair: every record)
========== ====================== ===== ================================= ======================

What a reader concludes from what is on disk (at any instant, or after a crash)
-------------------------------------------------------------------------------
======================================== ==============================================
on disk                                  the reader concludes
======================================== ==============================================
grant record whole, of the file's        lease <id> is live (not folded yet)
generation
grant record whole, of another           nothing: folded into the file, or ended since
generation                               (a full write is removing it, or died first)
grant record empty or cut short          no lease: being written, or lost to a power cut
                                         before its create was answered
grant record that cannot be read         `StateError` (rule 2): a lease left out would
                                         let its GPUs be granted again
bind record, its lease in the state      the lease is bound to that container
bind record empty                        the lease stays pending: reconcile binds it by
                                         the container's label
bind record of an ended lease, or one    nothing
bound to another container
a record listed, gone when read          folded: the file, read after it, holds it
``.state.json.*.tmp``                    a full write that died before its rename: the
                                         file is the previous one
the previous ``state.json`` after a      the rename was lost (the directory is not
power cut                                fsync'd): grants since are dead, and reconcile
                                         adopts their containers by their GPUs
======================================== ==============================================

Records are read before the file because a full write replaces the file before it
removes the records it folded: read the other way round, a fold in between would hide a
grant, or show a bound lease pending.  A record is written once under its name (a lease
id is never reused; a bind record holds its lease's one create), so each process keeps
the records it read whole, by name, and a busy journal is read once, not at every read.
A file of no generation (new, or schema 1's) is written whole before a record names one.

`State` (the pure lease life) lives in allocator/core/leases/leases.py; the records are
written, read and laid over a state by allocator/host/journal.py; the locking and the
atomic write are allocator/host/store.py's.  When, and in which order, is decided here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from allocator.core.leases.leases import REPAIR_HINT, Lease, State, StateError
from allocator.host import journal, store

__all__ = ["Ledger", "State", "StateError", "now"]

STATE_FILE = "state.json"
MAX_JOURNAL = 32  # records beside the file before a grant folds them in (reads read each)
LOCK_FILE = "lock"


class Ledger:
    """The state file and its lock.  One instance per process is enough."""

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 5.0):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.binds = self.dir / journal.BINDS_DIR
        self.grants = self.dir / journal.GRANTS_DIR
        self.lock_path = self.dir / LOCK_FILE
        self.lock = store.Lock(self.lock_path, lock_timeout)
        self._dir_ready = False
        # The last state this process read or wrote, with the file's bytes: a file that
        # reads back the same bytes is that state, so it is not decoded again.
        self._known: tuple[bytes, State] = (_EMPTY, State())
        # Journal records this process read whole, by name: a busy host's journal
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
        """Make lease ``lease_id``'s grant record durable (the grant step): `journal.sync_grant`."""
        journal.sync_grant(self.grants, lease_id)

    def record_bind(self, lease_id: str, container: str) -> bool:
        """The Engine answered lease ``lease_id``'s create with ``container`` (the bind
        step): `journal.record_bind`."""
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
        read before the file; a record that is not this lease's by its content
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
        many grants and binds of them are live.  The records are read before the file.

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
            raw = store.read(self.path)
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
        """The ledger's lock (rule 1), for a transaction and for the stores kept under it."""
        self.ensure_dir()
        with self.lock.held():
            yield

    @contextlib.contextmanager
    def transaction(self, *, grant: bool = False) -> Iterator[State]:
        """Lock, read, let the caller change the state, write it back if it changed.

        "Changed" is decided on the encoded bytes against the file's own, and none is
        written when nothing changed.  With ``grant``, a change that only adds leases is
        recorded in the grant journal instead (the grant step), while few records are live.
        """
        with self.locked():
            state, raw, folded, grants, binds = self._load()
            base = state.copy() if grant else None
            yield state
            added = state.added_since(base) if base is not None else None
            # The grant step.  A file of no generation (none yet, or written by schema 1)
            # is written whole first: a record always names a generation a full write made.
            if (
                added
                and state.generation
                and grants + binds + len(added) <= MAX_JOURNAL
                and journal.write_grants(self.grants, added, state.generation)
            ):
                return
            # The full write, 1: the file.  Folding a grant takes a new generation even
            # where the file would read the same (the lease ended meanwhile): its record
            # must be dead from now on.
            if grants or _encode(state) != raw:
                self._commit(state)
            # 2: the records it folded (in the file now, or of no more use).
            for record in folded:
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
        try:
            store.replace(self.path, data)
        except OSError as e:
            raise StateError(
                f"{self.path}: cannot write the state ({e.strerror}); the previous state is "
                "kept; free space or fix permissions on the state directory"
            ) from None
        self._known = (data, state.copy())


def _encode(state: State) -> bytes:
    # Compact: json's C encoder runs only without indent (indent takes the pure-Python one).
    return json.dumps(state.to_json(), sort_keys=True, separators=(",", ":")).encode()


_EMPTY = _encode(State())


def now() -> float:
    return time.time()
