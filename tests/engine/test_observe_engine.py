"""Seeing it on a real Engine: metrics with owners and containers, /gpu-alloc/v1/gpus,
the idle mark, and `gpu-alloc history`, all through the real plugin and shim."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from allocator.host import unixhttp
from tests.support import engine
from tests.unit.test_observe import free_port

PORT = free_port()
IDLE_AFTER = 2


def make_stack() -> engine.Stack:
    return engine.Stack(
        gpus=4,
        extra={"metrics": {"listen": f"127.0.0.1:{PORT}"}, "policy": {"idle_after": IDLE_AFTER}},
    )


def cli(stack: engine.Stack, *args: str) -> Any:
    done = subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), *args, "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def set_usage(stack: engine.Stack, uuid: str, usage: dict[str, Any] | None) -> None:
    """The simulated GPU file carries what NVML would report for that GPU."""
    entries = yaml.safe_load(stack.gpus_file.read_text())
    for e in entries:
        if e["uuid"] == uuid:
            e.pop("usage", None)
            if usage is not None:
                e["usage"] = usage
    stack.gpus_file.write_text(yaml.safe_dump(entries))


def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=30).read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append((s.labels, s.value))
    return found


def counter_series(got: dict) -> set[str]:
    names = ("gpu_alloc_requests_total", "gpu_alloc_denials_total")
    return {f"{n}{sorted(lab.items())}" for n in names for lab, _ in got.get(n, ())}


def test_gpu_use_processes_metrics_idle_and_history_on_a_real_engine(stack: engine.Stack) -> None:
    run = engine.docker_cli(stack.shim_sock, "run", "-d", "--gpus", "1", "--name", "train",
                            engine.BUSYBOX_TAG, "sleep", "300")  # fmt: skip
    assert run.returncode == 0, run.stderr + stack.logs()
    cid = run.stdout.strip()
    inspect = json.loads(engine.docker_cli(stack.engine_sock, "inspect", cid).stdout)[0]
    pid, [uuid] = inspect["State"]["Pid"], inspect["HostConfig"]["DeviceRequests"][0]["DeviceIDs"]
    set_usage(stack, uuid, {"utilization": 0.6, "memory_used_mib": 4096,
                            "processes": [{"pid": pid, "used_memory_mib": 4000}]})  # fmt: skip

    # A user who cannot read the state dir asks the shim; root reads it directly.
    code, body = unixhttp.request(stack.shim_sock, "GET", "/gpu-alloc/v1/gpus", timeout=30)
    assert code == 200, body
    for snap in (json.loads(body), cli(stack, "gpus")):
        [gpu] = [g for g in snap["gpus"] if g["uuid"] == uuid]
        assert (gpu["state"], gpu["container_name"], gpu["utilization"]) == ("leased", "train", 0.6)
        [proc] = gpu["processes"]
        assert (proc["pid"], proc["container"], proc["container_name"]) == (pid, cid, "train")

    # Requests refused by the plugin (on the Engine's own socket) count by field.
    denied = engine.docker_cli(stack.engine_sock, "run", "--rm", "--gpus", "1",
                               engine.BUSYBOX_TAG, "true")  # fmt: skip
    assert denied.returncode != 0 and "gpu-alloc" in denied.stderr
    got = scrape()
    index = str(next(g["index"] for g in cli(stack, "gpus")["gpus"] if g["uuid"] == uuid))
    gpu = {"uuid": uuid, "index": index}
    [holder] = [lab for lab, _ in got["gpu_alloc_gpu_holder_info"] if lab["uuid"] == uuid]
    assert (holder["owner"], holder["container"]) == ("root", "train") and holder["lease"]
    assert (gpu, 0.6) in got["gpu_alloc_gpu_utilization_ratio"]
    assert (gpu, 1.0) in got["gpu_alloc_gpu_holder_running"]
    denials = dict((lab["field"], v) for lab, v in got["gpu_alloc_denials_total"])
    assert denials.get("HostConfig.DeviceRequests", 0) >= 1, got["gpu_alloc_denials_total"]
    outcomes = {lab["outcome"]: v for lab, v in got["gpu_alloc_requests_total"]}
    assert outcomes["granted"] >= 1 and outcomes["denied"] >= 1
    [(_, decided)] = got["gpu_alloc_decision_seconds_count"]
    assert decided >= 2  # the leased create and the refused one, from the plugin's workers

    # More runs add counts, never series.
    for _ in range(3):
        r = engine.docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1", engine.BUSYBOX_TAG,
                              "true")  # fmt: skip
        assert r.returncode == 0, r.stderr
    again = scrape()
    assert counter_series(again) == counter_series(got)
    assert (
        dict((lab["outcome"], v) for lab, v in again["gpu_alloc_requests_total"])["granted"]
        >= outcomes["granted"] + 3
    )

    # No process and no utilisation for idle_after: idle; used again: not idle.
    set_usage(stack, uuid, {"utilization": 0.0})
    time.sleep(IDLE_AFTER * 2 + 1)
    assert next(g for g in cli(stack, "gpus")["gpus"] if g["uuid"] == uuid)["idle"]
    assert any(lab["uuid"] == uuid and v == 1 for lab, v in scrape()["gpu_alloc_gpu_idle"])
    set_usage(stack, uuid, {"utilization": 0.3})
    assert not next(g for g in cli(stack, "gpus")["gpus"] if g["uuid"] == uuid)["idle"]

    # Who used that GPU: the audit trail joins the grant to the release.
    assert engine.docker_cli(stack.shim_sock, "rm", "-f", cid).returncode == 0
    rows = cli(stack, "history", "--gpu", index)
    [use] = [r for r in rows if r["event"] == "use" and r["name"] == "train"]
    assert use["container"] == cid and use["to"] is not None and use["end"] == "container removed"
    assert any(r["event"] == "denial" for r in cli(stack, "history", "--since", "1h"))
