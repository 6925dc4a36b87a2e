"""The lease ledger: who holds which GPU, in one JSON file under ``state_dir``.

Rules
-----
1. Every change happens under an exclusive file lock (portalocker) taken with
   a deadline; a lock we cannot get in time is an error, never a guess.
2. The file is replaced atomically (write a temp file, fsync, rename, fsync the
   directory), so a process killed at any instant leaves the old or the new
   state, never half of one.
3. A file we cannot read, or one written by a newer schema, stops allocation:
   `StateError` names the file and the repair command.
4. Tokens are stored only as SHA-256 hashes: reading the file (or a container's
   labels) never gives anyone a usable token.

Lease life: ``pending`` (the shim placed it, the create is on its way) ->
``authorized`` (the plugin saw its token in a create: single use) -> ``bound``
(the Engine answered with a container id).  A lease ends when its container is
gone, when the create definitely failed, or when its deadline passed and the
container provably does not exist.  `State` is plain data with pure methods;
`Ledger` is the thin file shell around it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import portalocker

SCHEMA_VERSION = 1
STATE_FILE = "state.json"
LOCK_FILE = "lock"
LOCK_POLL = 0.003  # seconds between tries for a lock another process holds
REPAIR_HINT = "inspect it, then run 'gpu-alloc repair' to rebuild it from the Engine"


class StateError(Exception):
    """The ledger cannot be trusted or reached; allocation must stop."""


@dataclass(frozen=True)
class Lease:
    id: str
    gpus: tuple[str, ...]
    token_sha256: str
    state: str = "pending"  # pending | authorized | bound | handed-over
    container: str | None = None
    name: str = ""
    created: float = 0.0
    deadline: float = 0.0
    handed_to: str | None = None  # the lease of the container replacing this one

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_sha256, _hash(token))


@dataclass(frozen=True)
class Claim:
    """A container gpu-alloc did not lease but that holds GPUs (adopted)."""

    container: str
    name: str
    gpus: tuple[str, ...] | None  # None: unpinned, holds every GPU
    why: str


@dataclass
class State:
    leases: dict[str, Lease] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    adopted_at: float | None = None

    def holders(self, all_gpus: frozenset[str]) -> dict[str, str]:
        """UUID -> a short description of who holds it."""
        held: dict[str, str] = {}
        for lease in self.leases.values():
            if lease.state == "handed-over":
                continue  # its GPUs are counted under the lease it was handed to
            who = " ".join(
                filter(
                    None,
                    (
                        f"container {lease.container[:12]}"
                        if lease.container
                        else "a create in flight",
                        f"'{lease.name}'" if lease.name else "",
                        f"(lease {lease.id}, {lease.state})",
                    ),
                )
            )
            for uuid in lease.gpus:
                held.setdefault(uuid, who)
        for claim in self.claims.values():
            for uuid in all_gpus if claim.gpus is None else claim.gpus:
                held.setdefault(
                    uuid,
                    f"container {claim.container[:12]} '{claim.name}' (not leased: {claim.why})",
                )
        return held

    def new_lease(self, gpus: tuple[str, ...], now: float, ttl: float) -> tuple[Lease, str]:
        token = secrets.token_urlsafe(24)
        lease = Lease(
            id=secrets.token_hex(8),
            gpus=gpus,
            token_sha256=_hash(token),
            created=now,
            deadline=now + ttl,
        )
        self.leases[lease.id] = lease
        return lease, token

    def authorize(self, lease_id: str, token: str, gpus: frozenset[str]) -> str | None:
        """Consume a token for a create that asks for ``gpus``; a reason when refused."""
        lease = self.leases.get(lease_id)
        if lease is None or not lease.token_matches(token):
            return "its lease token is unknown or forged"
        if lease.state != "pending":
            return f"its lease token was already used (lease {lease_id} is {lease.state})"
        if frozenset(lease.gpus) != gpus:
            return f"its GPUs {sorted(gpus)} differ from lease {lease_id}'s {sorted(lease.gpus)}"
        self.leases[lease_id] = replace(lease, state="authorized")
        return None

    def bind(self, lease_id: str, container: str, name: str = "") -> bool:
        lease = self.leases.get(lease_id)
        if lease is None or (lease.container not in (None, container)):
            return False
        self.leases[lease_id] = replace(
            lease, state="bound", container=container, name=name or lease.name
        )
        return True

    def release(self, lease_id: str) -> Lease | None:
        """End a lease; a container that handed its GPUs to this one gets them back."""
        for other in list(self.leases.values()):
            if other.handed_to == lease_id:
                self.leases[other.id] = replace(other, state="bound", handed_to=None)
        return self.leases.pop(lease_id, None)

    def hand_over(self, lease_id: str, to: str, current_name: str) -> None:
        """A stopped container being replaced (Compose recreate) lends its GPUs to ``to``."""
        lease = self.leases[lease_id]
        self.leases[lease_id] = replace(lease, state="handed-over", handed_to=to, name=current_name)

    def lease_of(self, container: str) -> Lease | None:
        return next((le for le in self.leases.values() if le.container == container), None)

    def named(self, ref: str) -> Lease | None:
        """The lease of the container a reference (id, id prefix, name) points at."""
        ref = ref.lstrip("/")
        return next(
            (le for le in self.leases.values()
             if ref and (le.name == ref or (le.container or "").startswith(ref))),
            None,
        )  # fmt: skip

    def predecessor_of(self, lease_id: str) -> Lease | None:
        """The lease that handed its GPUs to ``lease_id``, while it is still recorded."""
        return next((le for le in self.leases.values() if le.handed_to == lease_id), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "leases": {k: asdict(v) for k, v in sorted(self.leases.items())},
            "claims": {k: asdict(v) for k, v in sorted(self.claims.items())},
            "adopted_at": self.adopted_at,
        }

    @classmethod
    def from_json(cls, data: Any, path: str) -> State:
        if not isinstance(data, dict) or "version" not in data:
            raise StateError(f"{path}: not a gpu-alloc state file; {REPAIR_HINT}")
        if data["version"] != SCHEMA_VERSION:
            newer = isinstance(data["version"], int) and data["version"] > SCHEMA_VERSION
            raise StateError(
                f"{path}: schema version {data['version']!r} "
                + (
                    "was written by a newer gpu-alloc; upgrade this one"
                    if newer
                    else f"is unknown; {REPAIR_HINT}"
                )
            )
        try:
            leases = {k: _lease(v) for k, v in data["leases"].items()}
            claims = {k: _claim(v) for k, v in data["claims"].items()}
            adopted_at = data.get("adopted_at")
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise StateError(f"{path}: malformed entry ({e!r}); {REPAIR_HINT}") from None
        return cls(leases, claims, adopted_at)


def _lease(v: dict[str, Any]) -> Lease:
    return Lease(**{**v, "gpus": tuple(v["gpus"])})


def _claim(v: dict[str, Any]) -> Claim:
    gpus = v["gpus"]
    return Claim(**{**v, "gpus": None if gpus is None else tuple(gpus)})


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Ledger:
    """The state file and its lock.  One instance per process is enough."""

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 5.0):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.lock_path = self.dir / LOCK_FILE
        self.lock_timeout = lock_timeout
        self._threads = threading.Lock()
        self._dir_ready = False

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
        """A consistent snapshot without the lock (renames are atomic)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return State()
        except OSError as e:
            raise StateError(f"{self.path}: cannot read: {e.strerror}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError is a ValueError too
            raise StateError(f"{self.path}: corrupt JSON ({e}); {REPAIR_HINT}") from None
        return State.from_json(data, str(self.path))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The exclusive lock: threads of this process queue, other processes poll briefly.

        portalocker's default poll is 0.25 s; under contention that, not the work, set
        the pace, so waiters poll every few milliseconds instead.
        """
        self.ensure_dir()
        deadline = time.monotonic() + self.lock_timeout
        if not self._threads.acquire(timeout=self.lock_timeout):
            raise self._timeout()
        try:
            lock = portalocker.Lock(
                str(self.lock_path),
                mode="a",
                timeout=max(0.0, deadline - time.monotonic()),
                check_interval=LOCK_POLL,
                flags=portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING,
            )
            try:
                lock.acquire()
            except portalocker.LockException:
                raise self._timeout() from None
            except OSError as e:
                raise StateError(f"{self.lock_path}: cannot open the lock: {e.strerror}") from None
            try:
                yield
            finally:
                lock.release()
        finally:
            self._threads.release()

    def _timeout(self) -> StateError:
        return StateError(
            f"{self.lock_path}: lock not acquired within {self.lock_timeout:g}s "
            "(another gpu-alloc process holds it); try again"
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[State]:
        """Lock, read, let the caller change the state, write it back if it changed."""
        with self.locked():
            state = self.read()
            before = state.to_json()
            yield state
            if state.to_json() != before:
                self.write(state)

    def write(self, state: State) -> None:
        data = json.dumps(state.to_json(), indent=1, sort_keys=True).encode()
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
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


def now() -> float:
    return time.time()
