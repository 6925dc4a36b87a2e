"""A container's lease ends when the container does, with nobody waiting and no create.

`--rm`, a removal by name through the real socket and an exit that dockerd follows
with its auto-removal pass no request that names the lease; the shim follows the
Engine's ``destroy`` events (allocator/service/departures.py), so the ledger, `history` and
every view stop naming the container within a second.  Each test reads the ledger
directly (no `status`, which would reconcile and hide a lease left behind).
"""

from __future__ import annotations

import time

from allocator.host.audit import AuditLog
from allocator.host.ledger import Ledger
from tests.support import engine
from tests.support.faults import IMAGE, FaultStack, assert_all_free, real, shim

WITHIN = 1.0  # seconds: a departed container's lease must end this soon


def make_stack() -> engine.Stack:
    return FaultStack(gpus=4)


def ok(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def leased(stack: engine.Stack) -> dict[str, str | None]:
    """Lease id -> container, straight from the ledger."""
    return {le.id: le.container for le in Ledger(stack.state_dir).read().leases.values()}


def ended_within(stack: engine.Stack, seconds: float) -> float | None:
    """Seconds until the ledger holds no lease, or None if one outlives ``seconds``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not leased(stack):
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def test_a_rm_run_frees_its_gpu_as_it_goes(stack):
    out = ok(shim(stack, "run", "--rm", "--gpus", "2", IMAGE, "printenv", "NVIDIA_VISIBLE_DEVICES"))
    assert len(out.split(",")) == 2
    assert ended_within(stack, WITHIN) is not None, leased(stack)


def test_a_detached_rm_container_that_exits_frees_its_gpu(stack):
    cid = ok(shim(stack, "run", "-d", "--rm", "--gpus", "1", IMAGE, "sleep", "1"))
    assert list(leased(stack).values()) == [cid]
    engine.engine_api(stack.engine_sock).wait(cid, timeout=30, condition="removed")
    assert ended_within(stack, WITHIN) is not None, leased(stack)
    # The release line is written just after the ledger transaction that ended the lease.
    t0 = time.monotonic()
    while not released(stack, cid) and time.monotonic() - t0 < WITHIN:
        time.sleep(0.01)
    assert released(stack, cid)


def released(stack, cid: str) -> bool:
    audit = AuditLog(str(stack.state_dir)).read()
    return any(e.get("event") == "release" and e.get("container") == cid for e in audit)


def test_a_removal_by_name_on_the_real_socket_frees_the_gpu(stack):
    ok(shim(stack, "run", "-d", "--name", "byname", "--gpus", "1", IMAGE, "sleep", "300"))
    assert len(leased(stack)) == 1
    ok(real(stack, "rm", "-f", "byname"))
    assert ended_within(stack, WITHIN) is not None, leased(stack)


def test_only_the_departed_containers_lease_ends(stack):
    keep = ok(shim(stack, "run", "-d", "--name", "keep", "--gpus", "1", IMAGE, "sleep", "300"))
    ok(shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true"))
    t0 = time.monotonic()
    while len(leased(stack)) > 1 and time.monotonic() - t0 < WITHIN:
        time.sleep(0.01)
    assert list(leased(stack).values()) == [keep]
    ok(real(stack, "rm", "-f", keep))
    assert_all_free(stack)


def test_a_removal_while_the_event_stream_was_down_is_caught_on_reconnecting(stack):
    cid = ok(shim(stack, "run", "-d", "--rm", "--gpus", "1", IMAGE, "sleep", "300"))
    assert list(leased(stack).values()) == [cid]
    # dockerd stops the container with itself and removes it (--rm) as it comes back,
    # before the shim's stream is open again: only the reconcile on reconnecting sees it.
    stack.restart_dockerd()
    assert ended_within(stack, 20.0) is not None, leased(stack)
