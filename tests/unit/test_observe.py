"""Seeing the GPUs: live use, processes -> containers -> owners, idle marks, Prometheus."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from allocator.core.judging.ask import Ask
from allocator.core.machine.health import XID, GpuEvent, HealthPolicy, observe
from allocator.host import ledger, metrics, usage
from allocator.host.config import Config, ConfigError, PolicyConfig
from allocator.ops import gpus as gpus_table
from allocator.ops import status as status_table
from allocator.service.placer import LeaseRequest
from allocator.service.views import gpus, status
from allocator.service.wiring import Allocator
from shim import metrics_server
from tests.support.fake_engine import FakeEngine

UUIDS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(3)]
CID = "c0ffee" + "0" * 58
ONE = Ask((), 1, False, ("gpu",))


def holders(owners: dict[str, str], name: str = "train") -> FakeEngine:
    """An Engine with each container of `owners` (id: owner) running, labelled its owner's."""
    fake = FakeEngine()
    for cid, owner in owners.items():
        own = {"io.gpu-alloc.owner": owner, "com.docker.compose.project": "lab"}
        fake.add(name, cid=cid, labels_=own)
    return fake


def write_gpus(path: Path, use: dict[int, dict[str, Any]]) -> None:
    entries = []
    for i, u in enumerate(UUIDS):
        entry: dict[str, Any] = {"uuid": u, "index": i, "name": "NVIDIA H100", "memory_mib": 81920}
        if i in use:
            entry["usage"] = use[i]
        entries.append(entry)
    path.write_text(yaml.safe_dump(entries))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Allocator, Path]:
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file, {i: {"utilization": 0.0} for i in range(len(UUIDS))})  # read, unused
    (tmp_path / "state").mkdir()
    config = Config(
        state_dir=str(tmp_path / "state"),
        gpus=str(gpus_file),
        policy=PolicyConfig(idle_after=60.0),
    )
    alloc = Allocator(config)
    lease, _ = alloc.book.lease(LeaseRequest(ONE, "train"))
    alloc.book.bind(lease.id, CID)
    alloc = Allocator(config, holders({CID: "alice"}))  # type: ignore[arg-type]
    monkeypatch.setattr(
        usage, "container_of", lambda pid, proc="/proc": CID if pid == 4242 else None
    )
    return alloc, gpus_file


# ------------------------------------------------------------------------- parsing


def test_container_of_reads_proc_pid_cgroup_and_a_gone_pid_is_none(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    assert usage.container_of(4242, proc=str(tmp_path)) == CID
    assert usage.container_of(4243, proc=str(tmp_path)) is None


# ---------------------------------------------------------------------------- the view


def test_processes_map_to_their_container_and_owner(world: tuple[Allocator, Path]) -> None:
    alloc, gpus_file = world
    write_gpus(
        gpus_file,
        {
            0: {"utilization": 0.9, "memory_used_mib": 2048, "temperature_c": 65, "power_w": 310,
                "processes": [{"pid": 4242, "used_memory_mib": 2000}]},
            1: {"processes": [{"pid": 99}]},
        },
    )  # fmt: skip
    snap = gpus.LiveView(alloc).snapshot()
    g0, g1, _ = snap["gpus"]
    assert (g0["state"], g0["owner"], g0["container_name"], g0["compose_project"]) == (
        "leased",
        "alice",
        "train",
        "lab",
    )
    assert (g0["utilization"], g0["memory_used_bytes"], g0["temperature_c"], g0["power_w"]) == (
        0.9,
        2048 * 2**20,
        65,
        310,
    )
    assert g0["memory_total_bytes"] == 81920 * 2**20
    [p] = g0["processes"]
    assert (p["pid"], p["container"], p["container_name"], p["owner"]) == (
        4242,
        CID,
        "train",
        "alice",
    )
    assert g1["state"] == "free" and g1["processes"][0]["container"] is None


def test_a_containers_labels_are_asked_once_not_per_scrape(world: tuple[Allocator, Path]) -> None:
    alloc, _ = world
    live = gpus.LiveView(alloc)
    for _ in range(5):
        live.snapshot()
    assert alloc.engine.inspected == [CID]  # type: ignore[union-attr]


def test_the_idle_mark_appears_after_idle_after_and_clears_on_use(
    world: tuple[Allocator, Path],
) -> None:
    alloc, gpus_file = world
    live = gpus.LiveView(alloc)
    t0 = time.time()
    assert not live.snapshot(t0 + 30)["gpus"][0]["idle"]
    marked = live.snapshot(t0 + 61)["gpus"][0]
    assert marked["idle"] and marked["idle_since"] <= t0
    write_gpus(gpus_file, {0: {"utilization": 0.4}})
    assert not live.snapshot(t0 + 62)["gpus"][0]["idle"]
    write_gpus(gpus_file, {0: {"utilization": 0.0}})
    assert not live.snapshot(t0 + 100)["gpus"][0]["idle"]  # 38 s since it was last used
    again = gpus.LiveView(alloc).snapshot(t0 + 123)["gpus"][0]  # another process agrees
    assert again["idle"] and again["idle_since"] == pytest.approx(t0 + 62)


def test_gpus_cli_shows_the_owner_and_the_process(world, capsys, tmp_path: Path) -> None:
    alloc, gpus_file = world
    write_gpus(gpus_file, {0: {"utilization": 0.5, "processes": [{"pid": 4242}]}})
    table = gpus_table.render_table(gpus.LiveView(alloc).snapshot())
    head, row0, proc, *_ = table.splitlines()
    assert "OWNER" in head and "alice" in row0 and "50%" in row0 and "leased" in row0
    assert "pid 4242" in proc and "train" in proc


# ------------------------------------------------------------------------- prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_in_another_process(state_dir: str, env_dir: str, field: str) -> None:
    code = (
        "from allocator.host import metrics; import sys;"
        "metrics.enable(sys.argv[1]); metrics.request('denied'); metrics.denial(sys.argv[2]);"
        "metrics.decision(0.002); metrics.lease_ended(90);"
        "metrics.gpu_seconds('alice', '', 2.0, 1.5)"  # as the shim's sampler counts
    )
    env = {**os.environ, metrics.ENV: env_dir}
    subprocess.run([sys.executable, "-c", code, state_dir, field], env=env, check=True)


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append((s.labels, s.value))
    return found


def grafana() -> dict[str, Any]:
    path = Path(__file__).parents[2] / "deploy/monitoring/grafana-dashboard.json"
    return json.loads(path.read_text())


def grafana_metrics() -> set[str]:
    """Every metric the shipped Grafana dashboard queries."""
    exprs = [t["expr"] for p in grafana()["panels"] for t in p["targets"]]
    return {m for e in exprs for m in re.findall(r"gpu_alloc_\w+", e)}


def test_the_grafana_dashboard_shows_gpu_hours_per_owner_and_holders_over_time() -> None:
    panels = {p["title"]: p for p in grafana()["panels"]}
    held = panels["GPU-hours held per owner (time range)"]
    used = panels["GPU-hours used per owner (held × utilisation, time range)"]
    for panel, metric in ((held, "held"), (used, "used")):
        [target] = panel["targets"]
        assert target["expr"] == (
            f"sum by (owner) (increase(gpu_alloc_gpu_seconds_{metric}_total"
            '{host=~"$host"}[$__range])) / 3600'
        )
        assert target["instant"] and panel["type"] == "bargauge"
    holders = panels["Who held which GPU (holders over the time range)"]
    assert holders["type"] == "state-timeline"
    [target] = holders["targets"]
    assert "gpu_alloc_gpu_holder_info" in target["expr"]
    assert "GPU {{index}}" in target["legendFormat"] and "{{owner}}" in target["legendFormat"]
    ids = [p["id"] for p in grafana()["panels"]]
    assert len(ids) == len(set(ids))


def test_the_grafana_dashboard_picks_a_host_and_shows_the_line_and_health() -> None:
    dash = grafana()
    [host] = [v for v in dash["templating"]["list"] if v["name"] == "host"]
    assert "label_values(gpu_alloc_inventory_readable, host)" in json.dumps(host["query"])
    for p in dash["panels"]:
        for t in p["targets"]:
            for use in re.findall(r"gpu_alloc_\w+(?:\{[^}]*\})?", t["expr"]):
                assert 'host=~"$host"' in use, (p["title"], use)
    queried = grafana_metrics()
    assert {"gpu_alloc_queue_length", "gpu_alloc_wait_seconds_bucket"} <= queried
    assert "gpu_alloc_inventory_readable" in queried
    assert any('state=~"unhealthy|departed"' in t["expr"] for p in dash["panels"]
               for t in p["targets"])  # fmt: skip


def test_a_scrape_joins_gpu_use_with_owners_and_sums_every_processs_counters(
    world: tuple[Allocator, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc, gpus_file = world
    write_gpus(gpus_file, {0: {"utilization": 0.75, "memory_used_mib": 1024}})
    env_dir = metrics.directory(alloc.config.state_dir)
    os.makedirs(env_dir, exist_ok=True)
    monkeypatch.setenv(metrics.ENV, env_dir)
    count_in_another_process(alloc.config.state_dir, env_dir, "HostConfig.Devices[0]")
    count_in_another_process(alloc.config.state_dir, env_dir, "HostConfig.Devices[3]")
    port = free_port()
    server = metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))
    try:
        got = scrape(port)
        gpu = {"uuid": UUIDS[0], "index": "0"}
        [lease] = alloc.ledger.read().leases
        who = {"owner": "alice", "container": "train", "lease": lease, "compose_project": "lab"}
        assert got["gpu_alloc_gpu_holder_info"] == [({**gpu, **who}, 1.0)]
        assert (gpu, 1.0) in got["gpu_alloc_gpu_leased"]
        assert got["gpu_alloc_gpu_utilization_ratio"][0] == (gpu, 0.75)
        assert (gpu, 2**30) in got["gpu_alloc_gpu_memory_used_bytes"]
        assert got["gpu_alloc_inventory_readable"] == [({}, 1.0)]
        assert ({"uuid": UUIDS[0], "index": "0", "model": "NVIDIA H100"}, 1.0) in got[
            "gpu_alloc_gpu_info"
        ]
        states = {(lab["uuid"], lab["state"]): v for lab, v in got["gpu_alloc_gpu_state"]}
        assert states[(UUIDS[0], "leased")] == 1 and states[(UUIDS[1], "free")] == 1
        assert states[(UUIDS[1], "leased")] == 0
        assert got["gpu_alloc_denials_total"] == [({"field": "HostConfig.Devices"}, 2.0)]
        assert ({"outcome": "denied"}, 2.0) in got["gpu_alloc_requests_total"]
        count_in_another_process(alloc.config.state_dir, env_dir, "HostConfig.Devices[1]")
        again = scrape(port)
        series = {k: sorted(map(str, (lab for lab, _ in v))) for k, v in got.items()}
        assert {k: sorted(map(str, (lab for lab, _ in v))) for k, v in again.items()} == series
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read()
        assert b"<title>gpu-alloc</title>" in page and b"http" not in page.split(b"<script>")[1]
        data = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/gpus").read())
        assert [g["owner"] for g in data["gpus"]] == ["alice", None, None]
        assert grafana_metrics() <= set(again), "the Grafana dashboard asks for a missing metric"
    finally:
        server.shutdown()
        server.server_close()


def test_status_marks_an_idle_lease(world, monkeypatch: pytest.MonkeyPatch) -> None:
    alloc, _ = world
    assert "(idle)" not in status_table.render_table(status.snapshot(alloc))
    later = time.time() + 120  # past policy.idle_after (60 s) with no use
    monkeypatch.setattr(ledger, "now", lambda: later)
    snap = status.snapshot(alloc)
    assert [g["idle_since"] is not None for g in snap["gpus"]] == [True, False, False]
    holder_row = status_table.render_table(snap).splitlines()[1]
    assert holder_row.startswith("0 ") and "(idle)" in holder_row


def families(port: int) -> dict[str, Any]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def serving(alloc: Allocator) -> tuple[int, Any]:
    port = free_port()
    return port, metrics_server.serve(f"127.0.0.1:{port}", gpus.LiveView(alloc))


def test_numeric_gpu_series_are_labelled_by_gpu_only_and_the_holder_is_an_info_family(
    world: tuple[Allocator, Path],
) -> None:
    alloc, gpus_file = world
    write_gpus(gpus_file, {0: {"utilization": 0.5, "memory_used_mib": 10}, 1: {"utilization": 0}})
    port, server = serving(alloc)
    try:
        found = families(port)
        gpu_families = {n: f for n, f in found.items() if n.startswith("gpu_alloc_gpu_")}
        numeric = {n for n, f in gpu_families.items() if not n.endswith("_info")}
        assert {"gpu_alloc_gpu_memory_total_bytes", "gpu_alloc_gpu_utilization_ratio",
                "gpu_alloc_gpu_idle", "gpu_alloc_gpu_leased"} <= numeric  # fmt: skip
        for name in numeric:
            for sample in gpu_families[name].samples:
                assert not {"owner", "container", "lease"} & set(sample.labels), (name, sample)
        totals = [s.labels for s in found["gpu_alloc_gpu_memory_total_bytes"].samples]
        assert totals == [{"uuid": u, "index": str(i)} for i, u in enumerate(UUIDS)]
        [held] = found["gpu_alloc_gpu_holder_info"].samples
        assert (held.labels["owner"], held.labels["container"], held.value) == ("alice", "train", 1)
    finally:
        server.shutdown()
        server.server_close()


def test_a_leased_gpu_without_a_utilisation_reading_is_unknown_in_every_view(
    world: tuple[Allocator, Path],
) -> None:
    """Where NVML cannot read utilisation, a leased GPU is never shown idle."""
    alloc, gpus_file = world
    write_gpus(gpus_file, {0: {"memory_used_mib": 30000, "power_w": 250}})
    later = time.time() + 7200  # far past policy.idle_after
    [row, *_] = gpus.LiveView(alloc).snapshot(later)["gpus"]
    assert (row["use"], row["idle"], row["idle_since"]) == ("unknown", False, None)
    assert "use unknown" in gpus_table.describe(row)
    port, server = serving(alloc)
    try:
        idle = families(port)["gpu_alloc_gpu_idle"].samples
        assert [s for s in idle if s.labels["uuid"] == UUIDS[0]] == []  # no sample, not 1
    finally:
        server.shutdown()
        server.server_close()
    text = status_table.render_table(status.snapshot(alloc))
    assert "(idle)" not in text and "use unknown" in text and "GPU 0" in text


def mark_unhealthy(alloc: Allocator, uuid: str) -> None:
    """What the watcher does on a critical Xid."""
    with alloc.health.transaction() as box:
        box[0] = observe(box[0], [GpuEvent(uuid, XID, time.time(), 79)], HealthPolicy())


def test_an_unhealthy_gpu_is_unhealthy_in_the_metrics_the_gpus_table_and_its_json(
    world: tuple[Allocator, Path],
) -> None:
    alloc, _ = world
    for index in (0, 2):  # GPU 0 is leased, GPU 2 free: both stay out of placement
        mark_unhealthy(alloc, UUIDS[index])
    snap = gpus.LiveView(alloc).snapshot()
    assert [(g["state"], g["healthy"]) for g in snap["gpus"]] == [
        ("unhealthy", False),
        ("free", True),
        ("unhealthy", False),
    ]
    assert snap["gpus"][0]["owner"] == "alice"  # the holder is still shown
    table = gpus_table.render_table(snap).splitlines()
    assert "unhealthy (held)" in table[1] and "alice" in table[1]
    assert "unhealthy" in table[3] and "free" not in table[3]
    assert "GPU 2 unhealthy (Xid 79 at" in table[-1]
    port, server = serving(alloc)
    try:
        states = {
            (s.labels["index"], s.labels["state"]): s.value
            for s in families(port)["gpu_alloc_gpu_state"].samples
        }
    finally:
        server.shutdown()
        server.server_close()
    assert states[("0", "unhealthy")] == states[("2", "unhealthy")] == 1
    assert states[("2", "free")] == states[("0", "leased")] == 0
    assert status.snapshot(alloc)["gpus"][2]["state"] == "unhealthy"


def test_metrics_answer_200_with_the_gauge_at_0_while_the_gpu_list_is_unreadable(
    world: tuple[Allocator, Path], caplog: pytest.LogCaptureFixture
) -> None:
    alloc, gpus_file = world
    gpus_file.unlink()
    port, server = serving(alloc)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200
            text = r.read().decode()
        found = {f.name: f for f in text_string_to_metric_families(text)}
        assert [s.value for s in found["gpu_alloc_inventory_readable"].samples] == [0]
        assert "Traceback" not in text and "gpu_alloc_gpu_state" not in found
        assert "cannot read the GPU inventory" in caplog.text
        write_gpus(gpus_file, {})
        assert [s.value for s in families(port)["gpu_alloc_inventory_readable"].samples] == [1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_metrics_port_in_use_is_a_config_error_naming_the_key(world) -> None:
    alloc, _ = world
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError) as refused:
            metrics_server.serve(listen, gpus.LiveView(alloc))
    assert f"metrics.listen {listen}: cannot listen there" in str(refused.value)
    assert "set metrics.listen to a free host:port" in str(refused.value)
    assert "Errno" not in str(refused.value)


def test_activity_marks_from_threads_at_once_are_all_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timekeeper and the views mark activity.json from threads of their own: each
    read-modify-write holds the store's lock, so no mark is lost to another's write."""
    import threading

    from allocator.host import store

    real_replace = store.replace

    def slow_replace(path: Path, data: bytes, **kw: Any) -> None:
        time.sleep(0.05)  # widen the window between the read and the write
        real_replace(path, data, **kw)

    monkeypatch.setattr(store, "replace", slow_replace)
    keepers = [usage.Activity(str(tmp_path)) for _ in range(4)]
    go = threading.Barrier(len(keepers))

    def mark(i: int) -> None:
        go.wait()
        keepers[i].observe({f"GPU-{i}"}, 1000.0 + i, 1.0)

    threads = [threading.Thread(target=mark, args=(i,)) for i in range(len(keepers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert usage.Activity(str(tmp_path)).read() == {f"GPU-{i}": 1000.0 + i for i in range(4)}
