"""The shim's HTTP listener (``metrics.listen``): Prometheus metrics and the dashboard.

``/metrics``: the counters every process wrote under ``PROMETHEUS_MULTIPROC_DIR``
(the plugin's workers and this shim), summed by prometheus-client's
`MultiProcessCollector`, plus per-GPU gauges computed at scrape time from the
live view.  Numeric per-GPU families carry the GPU's labels only (``uuid``,
``index``), so a series lives as long as its GPU; who holds a GPU is the info
family ``gpu_alloc_gpu_holder_info`` (value 1, the kube-state-metrics
convention), one series per GPU and holder.  The scrape always answers 200: a
GPU list or state file that cannot be read is the gauge
``gpu_alloc_inventory_readable`` (or ``gpu_alloc_state_readable``) at 0, and
the reason goes to the log.
``/``: the dashboard page; ``/api/gpus``: the JSON it refreshes from;
``/api/timeline?period=24h|7d``: who held which GPU over the period, the reservations
ahead and GPU-hours per owner (`views.timeline`, kept a few seconds).
The counters ``gpu_alloc_gpu_seconds_held_total`` and ``..._used_total`` (owner,
pool) grow with each look of the sampler, `sample_forever`.  Each background worker of
the shim (allocator/service/background.py) is ``gpu_alloc_worker_up{worker}`` (1 while its
thread runs) and ``gpu_alloc_worker_errors{worker}`` (the failures it survived).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from allocator.core.leases.leases import StateError
from allocator.core.machine.gpu_states import STATES
from allocator.core.machine.inventory import InventoryError
from allocator.core.timing.usage import Usage
from allocator.host import metrics
from allocator.host.config import ConfigError
from allocator.host.samples import Samples
from allocator.service.background import Background
from allocator.service.views import wire
from allocator.service.views.gpus import LiveView, Reading
from allocator.service.views.timeline import PERIODS, Timeline

log = logging.getLogger("gpu-alloc.metrics")
_PAGE = resources.files("allocator.ops").joinpath("dashboard.html")
GPU = ["uuid", "index"]
HOLDER = [*GPU, "owner", "container", "lease", "compose_project"]
Queue = Callable[[], list[dict[str, Any]]]


class GpuCollector(Collector):
    def __init__(self, live: LiveView) -> None:
        self.live = live
        self._failing = ""  # the reason last logged, so a lasting fault is logged once

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inventory = GaugeMetricFamily(
            "gpu_alloc_inventory_readable", "1 when the GPU inventory could be read"
        )
        ledger = GaugeMetricFamily(
            "gpu_alloc_state_readable", "1 when the lease state and health could be read"
        )
        try:
            snap = self.live.snapshot()
        except InventoryError as e:
            self._failed(f"cannot read the GPU inventory: {e}")
            inventory.add_metric([], 0)
            yield inventory
            return
        except Exception as e:  # the ledger or health file: still answer, with the gauge
            self._failed(f"cannot read the GPU state: {e}")
            inventory.add_metric([], 1)
            ledger.add_metric([], 0)
            yield from (inventory, ledger)
            return
        if self._failing:
            log.info("metrics: the GPUs read again")
            self._failing = ""
        inventory.add_metric([], 1)
        ledger.add_metric([], 1)
        yield from (inventory, ledger, *gpu_families(snap), share_family(snap))

    def _failed(self, why: str) -> None:
        if why != self._failing:
            log.warning("metrics: %s; /metrics answers without per-GPU series", why)
        self._failing = why


def gpu_families(snap: dict[str, Any]) -> tuple[GaugeMetricFamily, ...]:
    """The per-GPU families of one live snapshot (departed GPUs have an empty index)."""
    info = GaugeMetricFamily("gpu_alloc_gpu_info", "GPU model", labels=[*GPU, "model"])
    state = GaugeMetricFamily(
        "gpu_alloc_gpu_state", "1 for the GPU's current state", labels=[*GPU, "state"]
    )
    holder = GaugeMetricFamily(
        "gpu_alloc_gpu_holder_info", "1 per held GPU: who holds it", labels=HOLDER
    )
    leased = GaugeMetricFamily(
        "gpu_alloc_gpu_leased", "1 while a lease or claim holds the GPU", labels=GPU
    )
    running = GaugeMetricFamily(
        "gpu_alloc_gpu_holder_running", "1 while the GPU's holder container runs", labels=GPU
    )
    util = GaugeMetricFamily("gpu_alloc_gpu_utilization_ratio", "GPU utilisation 0..1", labels=GPU)
    used = GaugeMetricFamily("gpu_alloc_gpu_memory_used_bytes", "GPU memory used", labels=GPU)
    total = GaugeMetricFamily("gpu_alloc_gpu_memory_total_bytes", "GPU memory", labels=GPU)
    idle = GaugeMetricFamily(
        "gpu_alloc_gpu_idle", "1 when a leased GPU was unused for policy.idle_after", labels=GPU
    )
    for g in [*snap["gpus"], *snap["departed"]]:
        gpu = [g["uuid"], "" if g["index"] is None else str(g["index"])]
        if g["index"] is not None:
            info.add_metric([*gpu, g["model"]], 1)
        for s in STATES:
            state.add_metric([*gpu, s], 1 if g["state"] == s else 0)
        leased.add_metric(gpu, 1 if g["holder"] else 0)
        if g["holder"]:
            lease = g["holder"].get("lease") or ""
            holder.add_metric([*gpu, g["owner"] or "", _container(g), lease,
                               g["compose_project"] or ""], 1)  # fmt: skip
            if g["container_state"] is not None:  # None: the Engine did not list it
                running.add_metric(gpu, 1 if g["container_state"] == "running" else 0)
            if g["use"] != "unknown":  # no sample: neither idle nor not (never reclaimed)
                idle.add_metric(gpu, 1 if g["idle"] else 0)
        if g["utilization"] is not None:
            util.add_metric(gpu, g["utilization"])
        if g["memory_used_bytes"] is not None:
            used.add_metric(gpu, g["memory_used_bytes"])
        if g["memory_total_bytes"]:
            total.add_metric(gpu, g["memory_total_bytes"])
    return (info, state, holder, leased, running, util, used, total, idle)


def share_family(snap: dict[str, Any]) -> GaugeMetricFamily:
    """1 per share of a shared GPU: who holds it, and which part (``1/4``)."""
    family = GaugeMetricFamily(
        "gpu_alloc_share_info",
        "1 per share of a shared GPU (policy.sharing): who holds it",
        labels=[*GPU, "owner", "container", "lease", "share"],
    )
    for s in snap.get("shares") or ():
        index = "" if s["index"] is None else str(s["index"])
        labels = [s["uuid"], index, s["owner"], s["name"] or "", s["lease"], s["share"]]
        family.add_metric(labels, 1)
    return family


def _container(g: dict[str, Any]) -> str:
    holder = g.get("holder") or {}
    return g.get("container_name") or (holder.get("container") or "")[:12]


def registry(live: LiveView) -> CollectorRegistry:
    reg = CollectorRegistry()
    if os.environ.get(metrics.ENV):
        MultiProcessCollector(reg)
    reg.register(GpuCollector(live))
    reg.register(WorkerCollector(live.alloc.background))
    return reg


class WorkerCollector(Collector):
    """Each background worker's health, as `Background.health` says it at scrape time."""

    def __init__(self, background: Background) -> None:
        self.background = background

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "gpu_alloc_worker_up", "1 while the background worker runs", labels=["worker"]
        )
        errors = GaugeMetricFamily(
            "gpu_alloc_worker_errors",
            "failures the background worker logged and survived",
            labels=["worker"],
        )
        for h in self.background.health():
            up.add_metric([h.name], int(h.alive))
            errors.add_metric([h.name], h.errors)
        yield from (up, errors)


def serve(listen: str, live: LiveView, line: Queue | None = None) -> ThreadingHTTPServer:
    """`listener`, served from a daemon thread of its own (tests); ``.shutdown()`` stops it."""
    server = listener(listen, live, line)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def listener(listen: str, live: LiveView, line: Queue | None = None) -> ThreadingHTTPServer:
    """The listener, bound and not yet serving: the shim serves it from its background
    work (``handle_request`` until stopped), a test with `serve`.

    ``line``: the creates waiting for GPUs, in serving order, for the dashboard."""
    host, _, port = listen.rpartition(":")
    reg = registry(live)
    page = _PAGE.read_bytes()
    timeline = Timeline(live.alloc)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            try:
                if path == "/metrics":
                    self._send(200, "text/plain; version=0.0.4", generate_latest(reg))
                elif path == "/api/gpus":
                    snap = live.snapshot()
                    snap["queue"] = None if line is None else line()
                    body = wire.encode(snap).encode()
                    self._send(200, "application/json", body)
                elif path == "/api/timeline":
                    self._timeline()
                elif path == "/":
                    self._send(200, "text/html; charset=utf-8", page)
                else:
                    self._send(
                        404,
                        "text/plain",
                        b"not found: try /, /metrics, /api/gpus or /api/timeline\n",
                    )
            except (InventoryError, StateError) as e:  # said on the page; no traceback
                log.warning("metrics: %s: %s", path, e)
                self._send(503, "text/plain", f"gpu-alloc: {e}\n".encode())
            except Exception as e:  # one bad request must not stop the listener
                log.exception("metrics: %s failed", path)
                self._send(503, "text/plain", f"gpu-alloc: {e}\n".encode())

        def _timeline(self) -> None:
            period = parse_qs(urlsplit(self.path).query).get("period", ["24h"])[0]
            if period not in PERIODS:
                why = f"gpu-alloc: period {period!r}: expected one of {', '.join(PERIODS)}\n"
                self._send(400, "text/plain", why.encode())
                return
            self._send(200, "application/json", wire.encode(timeline.get(period)).encode())

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    try:
        server = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
    except OSError as e:
        raise ConfigError(
            f"metrics.listen {listen}: cannot listen there ({e.strerror or e}); another "
            "process may hold it (a second shim, another exporter): set metrics.listen to "
            "a free host:port, or leave it out"
        ) from None
    server.daemon_threads = True
    log.info("metrics and dashboard on http://%s/", listen)
    return server


def sample_forever(
    live: LiveView,
    every: Callable[[], float],
    stop: threading.Event,
    samples: Samples | None = None,
) -> None:
    """Look at the GPUs every ``every()`` seconds (asked before each wait, so a reloaded
    ``policy.idle_after`` counts), so an idle mark never misses use between scrapes;
    each look goes to the utilisation samples (``gpu-alloc report``) and adds the time
    since the last one to the GPU-seconds counters of each holder."""
    last: float | None = None
    while not stop.wait(wait := every()):
        try:
            got = live.read()
        except Exception as e:
            log.warning("sampling GPU use failed: %s", e)
            continue
        if samples is not None:
            samples.add(got.now, got.use)
        if last is not None:
            count_gpu_seconds(got, min(got.now - last, 2 * wait))
        last = got.now


def count_gpu_seconds(got: Reading, seconds: float) -> None:
    """``seconds`` held by each GPU's holder now, and used as its utilisation says."""
    if seconds <= 0:
        return
    for s in got.gpus:
        if s.holder is None:
            continue
        util = got.use.get(s.uuid, Usage()).utilization
        used = None if util is None else seconds * util
        metrics.gpu_seconds(s.holder.owner, s.holder.pool or "", seconds, used)
