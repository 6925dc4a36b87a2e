"""The counters the plugin's workers and the shim keep, for the shim's Prometheus endpoint.

prometheus-client's multiprocess mode: each process writes its samples to small
mmap files under ``PROMETHEUS_MULTIPROC_DIR`` (``state_dir/metrics``), and the
shim's scrape sums them, so every gunicorn worker's denials reach the one
endpoint.  The library reads that variable when it is imported, so nothing here
imports it until `enable` has set the directory; until then (the CLI, or a host
without ``metrics.listen``) every call is a no-op and nothing is written.

Labels are small closed sets (outcome, field without its index; owner and pool,
the host's users and the policy's pools, at most `MAX_OWNERS` owners before the
rest count as ``other``), never a request or container id, so the series do not
grow with the number of requests.
"""

from __future__ import annotations

import os
from typing import Any

from allocator.core.leases.events import field_label

OUTCOMES = ("granted", "short", "policy", "denied")
MAX_OWNERS = 256
STOPS = ("time-limit", "idle-reclaim")  # why gpu-alloc stopped a container
ENV = "PROMETHEUS_MULTIPROC_DIR"
_instruments: dict[str, Any] = {}
_owners: set[str] = set()


def directory(state_dir: str) -> str:
    return os.path.join(state_dir, "metrics")


def enable(state_dir: str) -> str:
    """Count in this process (and its forks) into ``state_dir/metrics``."""
    path = os.environ.setdefault(ENV, directory(state_dir))
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not _instruments:
        from prometheus_client import Counter, Gauge, Histogram

        _instruments.update(
            requests=Counter("gpu_alloc_requests", "GPU creates by outcome", ["outcome"]),
            denials=Counter(
                "gpu_alloc_denials", "Requests refused, by the GPU-granting field", ["field"]
            ),
            decision=Histogram(
                "gpu_alloc_decision_seconds",
                "Time the plugin took to decide a request it had to look at",
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
            ),
            lease=Histogram(
                "gpu_alloc_lease_seconds",
                "How long leases lasted, observed when they end",
                buckets=(60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400),
            ),
            queue=Gauge(
                "gpu_alloc_queue_length", "GPU creates waiting in line", multiprocess_mode="livemax"
            ),
            waited=Histogram(
                "gpu_alloc_wait_seconds",
                "How long GPU creates waited in line, observed when they leave it",
                buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600),
            ),
            held=Counter(
                "gpu_alloc_gpu_seconds_held",
                "GPU-seconds held, by owner and pool",
                ["owner", "pool"],
            ),
            used=Counter(
                "gpu_alloc_gpu_seconds_used",
                "GPU-seconds held weighted by sampled utilisation, by owner and pool",
                ["owner", "pool"],
            ),
            stops=Counter(
                "gpu_alloc_stops", "GPU containers gpu-alloc stopped, by why", ["reason"]
            ),
            outbox=Gauge(
                "gpu_alloc_notices_outbox",
                "Notices waiting in the outbox to be sent",
                multiprocess_mode="livemax",
            ),
            notice_failures=Counter(
                "gpu_alloc_notice_failures", "Notice sends that failed, by sink", ["sink"]
            ),
            signals=Counter(
                "gpu_alloc_signals",
                "Checkpoint signals gpu-alloc sent GPU containers, by the stop to come",
                ["reason"],
            ),
        )
        for reason in STOPS:
            _instruments["stops"].labels(reason)
            _instruments["signals"].labels(reason)
        for outcome in OUTCOMES:  # every outcome is scraped, 0 until it happens
            _instruments["requests"].labels(outcome)
    return path


def request(outcome: str) -> None:
    if _instruments:
        _instruments["requests"].labels(outcome).inc()


def denial(field: str) -> None:
    if _instruments:
        _instruments["denials"].labels(field_label(field)).inc()


def decision(seconds: float) -> None:
    if _instruments:
        _instruments["decision"].observe(seconds)


def lease_ended(seconds: float) -> None:
    if _instruments:
        _instruments["lease"].observe(max(0.0, seconds))


def queue_length(n: int) -> None:
    if _instruments:
        _instruments["queue"].set(n)


def waited(seconds: float) -> None:
    if _instruments:
        _instruments["waited"].observe(max(0.0, seconds))


def gpu_seconds(owner: str, pool: str, held: float, used: float | None) -> None:
    """Time on a GPU one sampler period added (``used``: None when the GPU's use is unknown)."""
    if not _instruments:
        return
    if owner not in _owners:
        if len(_owners) >= MAX_OWNERS:
            owner = "other"
        _owners.add(owner)
    _instruments["held"].labels(owner, pool).inc(held)
    if used is not None:
        _instruments["used"].labels(owner, pool).inc(used)


def stopped(reason: str) -> None:
    if _instruments:
        _instruments["stops"].labels(reason).inc()


def signalled(reason: str) -> None:
    """A checkpoint signal sent before a stop for ``reason`` (one of `STOPS`)."""
    if _instruments:
        _instruments["signals"].labels(reason).inc()


def outbox(waiting: int, failed: dict[str, int]) -> None:
    """The notices' outbox after a round of sends: how many wait, and the sends that
    failed in it, by sink."""
    if _instruments:
        _instruments["outbox"].set(waiting)
        for sink, n in failed.items():
            _instruments["notice_failures"].labels(sink).inc(n)
