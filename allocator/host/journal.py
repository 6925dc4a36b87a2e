"""The ledger's journals: the grant and bind records kept beside its state file.

One small file per lease: ``grants/<lease id>`` holds a lease a grant added without
rewriting the file, with the generation of the file it was granted on, and
``binds/<lease id>`` holds the container a create's 201 named.  The tables at the top
of allocator/host/ledger.py say when they are written, read and folded, and what each
on-disk combination means; this module writes, reads and lays them over a state, by
bare system calls: a busy host lays its journal over the file at every read.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path

from allocator.core.leases.leases import (
    Lease,
    State,
    StateError,
    boot_json,
    lease_from_json,
    lease_json,
)

BINDS_DIR = "binds"
GRANTS_DIR = "grants"
LEASE_ID = re.compile(r"[0-9a-f]{16}")  # `State.new_lease`'s ids: never a path
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def sync_grant(grants: Path, lease_id: str) -> None:
    """Make lease ``lease_id``'s grant record durable (the grant step); a record folded into
    the file already is (every full write is fsync'd)."""
    if not LEASE_ID.fullmatch(lease_id):
        return
    try:
        fd = os.open(grants / lease_id, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as e:
        raise StateError(f"{grants}: cannot sync the grant: {e.strerror}") from None
    try:
        os.fsync(fd)
    except OSError as e:
        raise StateError(f"{grants}: cannot sync the grant: {e.strerror}") from None
    finally:
        os.close(fd)


def record_bind(binds: Path, lease_id: str, container: str) -> bool:
    """The Engine answered lease ``lease_id``'s create with ``container`` (the bind step).

    The first record wins (O_EXCL); a second for the same container is no news, one
    for another container is refused, as `State.bind` would.
    """
    if not LEASE_ID.fullmatch(lease_id):
        return False
    path = binds / lease_id
    try:
        binds.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        with contextlib.suppress(OSError):
            return path.read_text() == container
        return False
    except OSError as e:
        raise StateError(f"{path}: cannot record the binding: {e.strerror}") from None
    try:
        os.write(fd, container.encode())
    finally:
        os.close(fd)
    return True


def write_grants(grants: Path, leases: list[Lease], generation: str) -> bool:
    """Record ``leases`` in the grant journal; False where it cannot be written (a full
    or read-only disk), and the caller writes the file instead, which says why.

    A record is written in place: only a holder of the lock writes or folds records,
    and a reader without it that meets one half written reads no lease from it, as
    before it was begun (the shim asks dockerd only once the record is whole).
    """
    done = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        for lease in leases:
            path = grants / lease.id
            entry = {"generation": generation, "lease": lease_json(lease), "boot": boot_json(lease)}
            data = json.dumps(entry).encode()
            try:
                fd = os.open(path, flags, 0o600)
            except FileNotFoundError:  # the first grant here
                grants.mkdir(mode=0o700, exist_ok=True)
                fd = os.open(path, flags, 0o600)
            done.append(path)
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write")
            finally:
                os.close(fd)
    except OSError:
        for record in done:
            with contextlib.suppress(OSError):
                record.unlink()
        with contextlib.suppress(OSError):
            grants.rmdir()  # only if nothing else is recorded there
        return False
    return True


def lay_over(
    state: State, granted: list[tuple[Path, str, Lease | None]], binds: list[tuple[Path, str]]
) -> tuple[list[Path], int, int]:
    """Lay the grant and bind journals over ``state``: the records it holds no more use
    for (folded into ``state``, or dead), and how many grants and binds are live."""
    done, grants, live = [], 0, 0
    for path, generation, lease in granted:
        done.append(path)  # folded into ``state`` here, or dead
        if lease is not None and generation == state.generation:
            grants += 1
            state.leases.setdefault(lease.id, lease)
    for record, container in binds:
        lease = state.leases.get(record.name)
        if lease is None or (container and not state.bind(record.name, container)):
            done.append(record)  # its lease ended, or it is bound to another one
        elif container:
            done.append(record)  # folded into ``state``
            live += 1
    return done, grants, live


def records(directory: Path) -> list[Path]:
    """A journal's records (never the ones being written aside)."""
    return [directory / name for name in names(directory)]


def names(directory: Path) -> list[str]:
    """The names of a journal's records: a listing, no path built for each."""
    try:
        return [name for name in os.listdir(directory) if not name.startswith(".")]
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StateError(f"{directory}: cannot read: {e.strerror}") from None


def read_grant(path: Path) -> tuple[Path, str, Lease | None] | None:
    """A grant record: (path, generation, lease), None for a record folded meanwhile, and
    no lease for one that is incomplete (`Ledger._granted`)."""
    try:
        raw = read_record(path)
    except FileNotFoundError:
        return None  # folded meanwhile
    except OSError as e:
        raise StateError(f"{path}: cannot read the grant: {e.strerror}") from None
    try:
        data = json.loads(raw)
        return path, str(data["generation"]), lease_from_json(data["lease"], data.get("boot"))
    except (ValueError, KeyError, TypeError):
        return path, "", None


def read_record(path: Path) -> bytes:
    """A journal record's bytes (a few hundred at most), in three system calls."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)
