"""The shim's HTTP listener (``metrics.listen``): Prometheus metrics and the dashboard.

``/metrics``: the counters every process wrote under ``PROMETHEUS_MULTIPROC_DIR``
(the plugin's workers and this shim), summed by prometheus-client's
`MultiProcessCollector`, plus per-GPU gauges computed at scrape time from the
live view (one series per GPU and holder, so cardinality is bounded by the host).
``/``: the dashboard page; ``/api/gpus``: the JSON it refreshes from.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from allocator.host import metrics
from allocator.host.config import ConfigError
from allocator.ops import gpus

log = logging.getLogger("gpu-alloc.metrics")
_PAGE = resources.files("allocator.ops").joinpath("dashboard.html")


class GpuCollector(Collector):
    def __init__(self, live: gpus.LiveView) -> None:
        self.live = live

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.live.snapshot()
        held = ["uuid", "index", "owner", "container"]
        info = GaugeMetricFamily(
            "gpu_alloc_gpu_info", "GPU model", labels=["uuid", "index", "model"]
        )
        state = GaugeMetricFamily(
            "gpu_alloc_gpu_state",
            "1 for the GPU's current state",
            labels=["uuid", "index", "state"],
        )
        leased = GaugeMetricFamily(
            "gpu_alloc_gpu_leased",
            "1 per held GPU, by holder",
            labels=["uuid", "index", "owner", "container", "compose_project"],
        )
        util = GaugeMetricFamily(
            "gpu_alloc_gpu_utilization_ratio", "GPU utilisation 0..1", labels=held
        )
        used = GaugeMetricFamily("gpu_alloc_gpu_memory_used_bytes", "GPU memory used", labels=held)
        total = GaugeMetricFamily("gpu_alloc_gpu_memory_total_bytes", "GPU memory", labels=held)
        idle = GaugeMetricFamily(
            "gpu_alloc_gpu_idle",
            "1 when a leased GPU was unused for policy.idle_after",
            labels=held,
        )
        for g in snap["gpus"]:
            uuid, index = g["uuid"], str(g["index"])
            owner = g["owner"] or ""
            container = _container(g)
            info.add_metric([uuid, index, g["model"]], 1)
            for s in gpus.STATES:
                state.add_metric([uuid, index, s], 1 if g["state"] == s else 0)
            who = [uuid, index, owner, container]
            if g["state"] == "leased":
                leased.add_metric([*who, g["compose_project"] or ""], 1)
                idle.add_metric(who, 1 if g["idle"] else 0)
            if g["utilization"] is not None:
                util.add_metric(who, g["utilization"])
            if g["memory_used_bytes"] is not None:
                used.add_metric(who, g["memory_used_bytes"])
            if g["memory_total_bytes"]:
                total.add_metric(who, g["memory_total_bytes"])
        for uuid in snap["departed"]:
            for s in gpus.STATES:
                state.add_metric([uuid, "", s], 1 if s == "departed" else 0)
        yield from (info, state, leased, util, used, total, idle)


def _container(g: dict[str, Any]) -> str:
    holder = g.get("holder") or {}
    return g.get("container_name") or (holder.get("container") or "")[:12]


def registry(live: gpus.LiveView) -> CollectorRegistry:
    reg = CollectorRegistry()
    if os.environ.get(metrics.ENV):
        MultiProcessCollector(reg)
    reg.register(GpuCollector(live))
    return reg


def serve(listen: str, live: gpus.LiveView) -> ThreadingHTTPServer:
    """Start the listener in a daemon thread; returns the server (``.shutdown()`` stops it)."""
    host, _, port = listen.rpartition(":")
    reg = registry(live)
    page = _PAGE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            try:
                if path == "/metrics":
                    self._send(200, "text/plain; version=0.0.4", generate_latest(reg))
                elif path == "/api/gpus":
                    body = gpus.render_json(live.snapshot()).encode()
                    self._send(200, "application/json", body)
                elif path == "/":
                    self._send(200, "text/html; charset=utf-8", page)
                else:
                    self._send(404, "text/plain", b"not found: try /, /metrics or /api/gpus\n")
            except Exception as e:  # one bad scrape must not stop the listener
                log.exception("metrics: %s failed", path)
                self._send(503, "text/plain", f"gpu-alloc metrics: {e}\n".encode())

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
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info("metrics and dashboard on http://%s/", listen)
    return server


def sample_forever(live: gpus.LiveView, every: float, stop: threading.Event) -> None:
    """Look at the GPUs every few seconds, so an idle mark never misses use between scrapes."""
    while not stop.wait(every):
        try:
            live.snapshot()
        except Exception as e:
            log.warning("sampling GPU use failed: %s", e)
