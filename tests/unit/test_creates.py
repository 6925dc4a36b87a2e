"""Creates: the create's whole transaction in the library, from the decoded create to the
grant on disk and its settlement by the Engine's answer."""

from __future__ import annotations

import json
from pathlib import Path

from allocator.core.judging import verdicts as decide
from allocator.core.leases.leases import Phase
from allocator.core.machine.cpus import NOTHING
from allocator.core.rules.policy import Invalid, Wanted
from allocator.host.config import Config
from allocator.service.creates import Asked
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.enforcement_cases import body, request

GPU_CREATE = json.loads(body(HostConfig={"DeviceRequests": [request(1)]}))
CID = "c" * 64


def world(tmp_path: Path) -> Allocator:
    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)
    (tmp_path / "state").mkdir()
    return Allocator(Config(state_dir=str(tmp_path / "state"), gpus=str(gpus)))


def asked(alloc: Allocator, spec: dict) -> Asked:
    got = alloc.creates.lease_for(spec, "job", None, Wanted(), "", NOTHING)
    assert isinstance(got, Asked), got
    return got


def test_a_grant_is_durable_and_audited_when_its_future_is_done(tmp_path: Path) -> None:
    alloc = world(tmp_path)
    got = asked(alloc, GPU_CREATE)
    assert isinstance(got.leased, tuple)
    grant = alloc.creates.granted(got.req, *got.leased, GPU_CREATE)
    assert grant.durable.result(timeout=10) is None
    assert grant.body["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == list(grant.lease.gpus)
    assert [line["event"] for line in alloc.audit.read()] == ["grant"]
    alloc.creates.settle(grant, 201, json.dumps({"Id": CID}).encode())
    lease = alloc.ledger.read().leases[grant.lease.id]
    assert lease.phase is Phase.BOUND and lease.container == CID


def test_a_create_never_sent_frees_its_lease(tmp_path: Path) -> None:
    alloc = world(tmp_path)
    got = asked(alloc, GPU_CREATE)
    assert isinstance(got.leased, tuple)
    grant = alloc.creates.granted(got.req, *got.leased, GPU_CREATE)
    grant.durable.result(timeout=10)
    alloc.creates.unsent(grant)
    assert alloc.ledger.read().leases == {}


def test_refusals_are_values_the_shim_turns_into_status_codes(tmp_path: Path) -> None:
    alloc = world(tmp_path)
    privileged = json.loads(body(HostConfig={"Privileged": True}))
    denied = alloc.creates.lease_for(privileged, "job", None, Wanted(), "", NOTHING)
    assert isinstance(denied, decide.Deny)
    assert [line["event"] for line in alloc.audit.read()] == ["refusal"]
    bad = Invalid("gpu-alloc: no such pool")
    assert alloc.creates.lease_for(GPU_CREATE, "job", None, bad, "", NOTHING) == bad
    plain = json.loads(body())
    assert alloc.creates.lease_for(plain, "job", None, Wanted(), "", NOTHING) is None
