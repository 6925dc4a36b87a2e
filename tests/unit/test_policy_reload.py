"""Every key under ``policy:`` takes effect at a reload, with no restart
(allocator/service/gather.py `Gatherer.reload_policy`); the keys outside it say in the
log that they wait for one.  tests/engine/test_policy_reload_engine.py edits
``policy.placement`` under a running shim."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from allocator.core.placement import POLICIES
from allocator.host import config as configmod
from allocator.service.views import gpus, status
from allocator.service.wiring import Allocator
from shim.serve import sample_every
from tests.support import engine


class Host:
    """A config file and 4 simulated GPUs, and the service a shim started from them."""

    def __init__(self, root: Path) -> None:
        engine.write_sim_gpus(root / "gpus.yaml", 4)
        self.path = root / "config.yaml"
        self.data = {"state_dir": str(root / "state"), "gpus": str(root / "gpus.yaml")}
        self.edit()
        self.alloc = Allocator(configmod.load(str(self.path)))

    def edit(self, **policy: object) -> None:
        self.path.write_text(yaml.safe_dump({**self.data, "policy": policy}))

    def reload(self, **policy: object) -> None:
        self.edit(**policy)
        self.alloc.gather.reload_policy()


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_placement_reloads_into_every_grant(host: Host) -> None:
    assert host.alloc.placer.seen(cores=False).placement is POLICIES["best-effort"]
    host.reload(placement="first-fit")
    assert host.alloc.placer.seen(cores=False).placement is POLICIES["first-fit"]
    assert host.alloc.reservations.placement is POLICIES["first-fit"]


def test_mig_reserved_cpus_and_pending_ttl_reload_into_every_grant(host: Host) -> None:
    host.reload(mig="mixed", reserved_cpus="0-1", pending_ttl=900)
    seen = host.alloc.placer.seen(cores=False)
    assert (seen.mig, seen.reserved_cpus, seen.pending_ttl) == ("mixed", (0, 1), 900)
    assert status.snapshot(host.alloc)["mig_policy"] == "mixed"


def test_idle_after_reloads_into_every_view(host: Host) -> None:
    shim = gpus.LiveView(host.alloc)
    assert shim.snapshot()["idle_after"] == 3600
    host.edit(idle_after=60)  # no reload asked: the views look at the file themselves
    cli = gpus.LiveView(Allocator(configmod.load(str(host.path))))  # `gpu-alloc gpus`
    assert shim.snapshot()["idle_after"] == cli.snapshot()["idle_after"] == 60


def test_lock_timeout_reloads_into_every_stores_lock(host: Host) -> None:
    host.reload(lock_timeout=0.5)
    assert host.alloc.ledger.lock.timeout == 0.5
    assert host.alloc.lookups.creators.lock.timeout == 0.5


def test_a_reload_logs_the_keys_it_changed(host: Host, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        host.reload(placement="numa", limits={"default": {"gpus": 1}})
    assert "policy.placement, the policy's rules" in caplog.text
    assert host.alloc.gather.rules_in_force.default_limit == 1


def test_a_key_outside_policy_says_it_needs_a_restart(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    host.data["metrics"] = {"listen": "127.0.0.1:9999"}
    with caplog.at_level(logging.WARNING):
        host.reload()
    assert "metrics changed in" in caplog.text and "needs a restart" in caplog.text
    assert host.alloc.config.metrics.listen is None


def test_the_sampler_looks_as_often_as_the_idle_after_in_force() -> None:
    assert sample_every(3600) == 10.0
    assert sample_every(8) == 2.0
    assert sample_every(1) == 0.5
