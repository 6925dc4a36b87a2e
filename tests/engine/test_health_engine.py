"""GPU health through the real stack: a simulated Xid in the GPU file takes a GPU out of
placement within the watcher's period; ``gpu-alloc health clear`` and the automatic probe
bring it back; ``status`` shows each step.  Users drive it with the docker CLI."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import engine
from tests.support.engine import gpu_alloc
from tests.support.faults import IMAGE, shim, status
from tests.unit.test_observe import free_port

PERIOD = 0.2
# The probing stack's recheck_after: long enough for its test to see the GPU out first, on a
# loaded machine (the module's own stack never probes).
RECHECK = 20.0
UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]


PORT = free_port()


def make_stack() -> engine.Stack:
    """The module's stack: its probe never runs (``recheck_after: 0``), so a GPU the tests
    mark unhealthy stays so however long a loaded machine takes to get to the next step."""
    health = {"period": PERIOD, "recheck_after": 0}
    return engine.Stack(
        gpus=4, extra={"health": health, "metrics": {"listen": f"127.0.0.1:{PORT}"}}
    )


@pytest.fixture(scope="module")
def probing() -> Iterator[engine.Stack]:
    """A stack whose probe brings a free GPU back ``RECHECK`` seconds after its event."""
    health = {"period": PERIOD, "recheck_after": RECHECK}
    started = engine.Stack(gpus=4, extra={"health": health}).start()
    try:
        yield started
    finally:
        started.stop()


def inject(stack: engine.Stack, index: int, **event: Any) -> None:
    """Add an event to GPU ``index`` of the simulated file, as a driver would report it."""
    gpus = yaml.safe_load(stack.gpus_file.read_text())
    gpus[index].update(event)
    stack.gpus_file.write_text(yaml.safe_dump(gpus, sort_keys=False))


def health_of(stack: engine.Stack, index: int) -> dict[str, Any]:
    return status(stack, reconcile=False)["gpus"][index]


def wait_for(stack: engine.Stack, index: int, healthy: bool, within: float) -> float:
    began = time.monotonic()
    while health_of(stack, index)["healthy"] is not healthy:
        assert time.monotonic() - began < within, stack.logs()
        time.sleep(0.05)
    return time.monotonic() - began


def run(stack: engine.Stack, gpus: str) -> Any:
    return shim(stack, "run", "--rm", "--gpus", gpus, IMAGE, "true")


def test_a_critical_xid_takes_a_gpu_out_until_health_clear(stack: engine.Stack) -> None:
    inject(stack, 0, xid=79)
    took = wait_for(stack, 0, healthy=False, within=PERIOD + 3)
    event = health_of(stack, 0)["health_event"]
    assert (event["kind"], event["xid"]) == ("xid", 79)

    refused = run(stack, "device=0")
    assert refused.returncode != 0
    assert f"GPU 0 ({UUIDS[0]}) had Xid 79 at" in refused.stderr
    assert run(stack, "4").returncode != 0  # only three healthy GPUs
    got = shim(
        stack, "run", "--rm", "--gpus", "3", IMAGE, "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"
    )
    assert got.returncode == 0, got.stderr
    assert sorted(got.stdout.strip().split(",")) == UUIDS[1:]
    table = gpu_alloc(stack, "status").stdout
    assert "unhealthy (Xid 79 at" in table
    assert "free: 3 of 4 GPUs (GPUs 1,2,3)" in table  # an unhealthy GPU is not free

    cleared = gpu_alloc(stack, "health", "clear", "0")
    assert cleared.returncode == 0, cleared.stderr
    health_file = (stack.state_dir / "health.json").read_text()
    assert "cleared (was: Xid 79 at" in cleared.stdout, (health_file, stack.logs())
    assert health_of(stack, 0)["healthy"]
    assert run(stack, "device=0").returncode == 0
    history = json.loads(gpu_alloc(stack, "history", "--gpu", "0", "--json").stdout)
    turns = [r["reason"] for r in history if r["event"] == "health"]
    assert [t.split(":")[0] for t in turns] == ["GPU unhealthy", "GPU healthy again (was"]
    assert "Xid 79 at" in turns[0]
    print(f"unhealthy {took:.2f}s after the Xid (watcher period {PERIOD}s)")


def test_an_ignored_xid_leaves_the_gpu_in_placement(stack: engine.Stack) -> None:
    inject(stack, 1, xid=43)
    time.sleep(PERIOD * 5)
    assert health_of(stack, 1)["healthy"]
    assert run(stack, "device=1").returncode == 0


def test_the_probe_brings_a_free_gpu_back_after_recheck_after(probing: engine.Stack) -> None:
    injected = time.monotonic()
    inject(probing, 2, double_bit_ecc=1)
    wait_for(probing, 2, healthy=False, within=PERIOD + 3)
    assert run(probing, "device=2").returncode != 0
    wait_for(probing, 2, healthy=True, within=RECHECK + 10)
    assert time.monotonic() - injected >= RECHECK - 0.5  # not before recheck_after
    assert run(probing, "device=2").returncode == 0


def test_a_held_gpu_that_turns_unhealthy_is_unhealthy_and_held_in_every_view(
    stack: engine.Stack,
) -> None:
    held = shim(stack, "run", "-d", "--gpus", "device=3", "--name", "held", IMAGE, "sleep", "300")
    assert held.returncode == 0, held.stderr
    inject(stack, 3, xid=79)
    wait_for(stack, 3, healthy=False, within=PERIOD + 3)

    row = health_of(stack, 3)  # status --json
    assert (row["state"], row["free"], row["container_state"]) == ("unhealthy", False, "running")
    assert row["holder"]["name"] == "held"
    live = json.loads(gpu_alloc(stack, "gpus", "--json").stdout)["gpus"][3]
    assert (live["state"], live["healthy"], live["container_name"]) == ("unhealthy", False, "held")
    assert "Xid 79 at" in live["health"]
    table = gpu_alloc(stack, "gpus").stdout.splitlines()
    # a simulated GPU has no utilisation figure: its use is said to be unknown, never idle
    assert "unhealthy (held, use unknown)" in table[4] and "held" in table[4].split()[-1]
    dashboard = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/gpus").read())
    assert dashboard["gpus"][3]["state"] == "unhealthy"

    text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    found = {f.name: f for f in text_string_to_metric_families(text)}
    states = {(s.labels["index"], s.labels["state"]) for s in found["gpu_alloc_gpu_state"].samples
              if s.value == 1}  # fmt: skip
    assert ("3", "unhealthy") in states and ("3", "free") not in states
    holders = [s.labels for s in found["gpu_alloc_gpu_holder_info"].samples]
    assert [h["container"] for h in holders if h["index"] == "3"] == ["held"]

    assert shim(stack, "rm", "-f", "held").returncode == 0
    assert gpu_alloc(stack, "health", "clear", "3").returncode == 0
