"""Restart policies against an in-memory Engine: the order of each step, and the verdicts.

A restart policy must be off before the ledger stops vouching for the container's
GPUs, so a crash in between leaves a state dockerd can act on: each test records
what the ledger said when the Engine was asked to turn the policy off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from allocator.core.api.routes import classify
from allocator.core.judging import compose
from allocator.core.judging import verdicts as decide
from allocator.core.judging.verdicts import UpdateCheck
from allocator.core.leases import outcomes, restarts
from allocator.core.leases.leases import Phase
from allocator.host import config as configmod
from allocator.host.engine import EngineError
from allocator.ops.repair import repair
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from tests.support.fake_engine import FakeEngine
from tests.unit.test_service import GPUS, create, leased, one

ALWAYS = {"Name": "always", "MaximumRetryCount": 0}


class Recorder(FakeEngine):
    """A fake Engine that notes, at each update, what the ledger says of the container."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc: Allocator | None = None
        self.seen: list[tuple[str, str | None]] = []  # (container, its lease's phase)
        self.fails = False

    def update(self, container: str, config: dict) -> None:
        assert self.alloc is not None
        if self.fails:
            raise EngineError("Engine at fake.sock: update failed: boom")
        lease = self.alloc.ledger.read().lease_of(container)
        self.seen.append((container, lease.state if lease else None))
        super().update(container, config)
        self.by_id[container]["HostConfig"]["RestartPolicy"] = config["RestartPolicy"]


@pytest.fixture
def fake() -> Recorder:
    return Recorder()


@pytest.fixture
def alloc(tmp_path: Path, fake: Recorder) -> Allocator:
    from tests.support import engine as sim

    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", GPUS)
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"pending_ttl": 300, "release_stopped_after": "1s"}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    made = Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]
    fake.alloc = made
    return made


def bound(alloc: Allocator, fake: Recorder, name: str = "job", **kw) -> tuple[str, str]:
    """A container made for a lease and bound to it, with ``restart: always``; (id, lease)."""
    lease, token = leased(alloc, 1, name, kw.get("labels_"))
    cid = create(fake, lease, token, name, **kw)
    alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    fake.by_id[cid]["HostConfig"]["RestartPolicy"] = dict(ALWAYS)
    return cid, lease.id


def stop(fake: Recorder, cid: str) -> None:
    fake.by_id[cid]["State"] = {"Running": False, "Status": "exited",
                                "FinishedAt": "2020-01-01T00:00:00Z"}  # fmt: skip


def audit(alloc: Allocator, kind: str = "restart-off") -> list[dict]:
    lines = alloc.audit.path.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_an_expiring_lease_ends_only_after_its_containers_policy_is_off(alloc, fake) -> None:
    cid, lease_id = bound(alloc, fake)
    stop(fake, cid)
    assert alloc.reconciler.reconcile().freed == [lease_id]
    assert fake.seen[0] == (cid, Phase.BOUND.value)  # still leased when it went off
    assert fake.by_id[cid]["HostConfig"]["RestartPolicy"] == {"Name": "no"}
    assert cid in alloc.ledger.read().expired
    (line,) = audit(alloc)
    assert line["container"] == cid and line["lease"] == lease_id
    assert line["reason"] == "restart policy always turned off: its lease expired"
    assert audit(alloc, "release")[-1]["lease"] == lease_id


def test_a_lease_whose_policy_cannot_be_turned_off_is_kept(alloc, fake) -> None:
    cid, lease_id = bound(alloc, fake)
    stop(fake, cid)
    fake.fails = True
    assert alloc.reconciler.reconcile().freed == []
    assert alloc.ledger.read().leases[lease_id].phase is Phase.BOUND
    fake.fails = False
    assert alloc.reconciler.reconcile().freed == [lease_id]  # the next run tries again


def test_a_container_without_a_policy_is_turned_off_too_but_not_audited(alloc, fake) -> None:
    """One may have been set since the inspect: the update costs one call per expiry."""
    cid, lease_id = bound(alloc, fake)
    fake.by_id[cid]["HostConfig"]["RestartPolicy"] = {"Name": "no"}
    stop(fake, cid)
    assert alloc.reconciler.reconcile().freed == [lease_id]
    assert fake.seen[0] == (cid, Phase.BOUND.value) and audit(alloc) == []


def test_a_compose_predecessors_policy_goes_off_before_it_lends_its_gpus(alloc, fake) -> None:
    given = {compose.PROJECT: "p", compose.SERVICE: "train"}
    olds = [bound(alloc, fake, "p_train_1", labels_=given)]
    olds += [bound(alloc, fake, f"other{k}") for k in range(GPUS - 1)]
    old_id, old_lease = olds[0]
    fake.by_id[old_id]["State"] = {"Running": False, "Status": "exited"}
    fake.by_id[old_id]["Name"] = f"/{old_id[:12]}_p_train_1"
    leased(alloc, 1, "p_train_1", given)
    assert alloc.ledger.read().leases[old_lease].phase is Phase.HANDED_OVER
    # Off while it still held them, and once more after (an update may land in between).
    assert fake.seen == [(old_id, Phase.BOUND.value), (old_id, Phase.HANDED_OVER.value)]
    (line,) = audit(alloc)
    assert line["container"] == old_id and "lent its GPUs to p_train_1" in line["reason"]


def test_a_predecessor_that_lends_nothing_gets_its_policy_back(alloc, fake) -> None:
    given = {compose.PROJECT: "p", compose.SERVICE: "train"}
    old_id, old_lease = bound(alloc, fake, "p_train_1", labels_=given)
    for k in range(GPUS - 1):
        bound(alloc, fake, f"other{k}")
    fake.by_id[old_id]["State"] = {"Running": False, "Status": "exited"}
    fake.by_id[old_id]["Name"] = f"/{old_id[:12]}_p_train_1"
    # Two GPUs: the predecessor's one is not enough, so it lends nothing.
    assert not isinstance(alloc.book.lease(LeaseRequest(one(2), "p_train_1", labels=given)), tuple)
    assert [c for c, _ in fake.seen] == [old_id, old_id]  # off, then back
    assert fake.by_id[old_id]["HostConfig"]["RestartPolicy"] == ALWAYS
    assert alloc.ledger.read().leases[old_lease].phase is Phase.BOUND
    assert audit(alloc) == []


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        ({"RestartPolicy": {"Name": "always"}}, "always"),
        ({"RestartPolicy": {"Name": "unless-stopped"}}, "unless-stopped"),
        ({"RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 3}}, "on-failure:3"),
        ({"RestartPolicy": {"Name": "Always"}}, "Always"),  # dockerd refuses it; so do we
        ({"RestartPolicy": {"Name": "no"}}, ""),
        ({"RestartPolicy": {"Name": ""}}, ""),
        ({"CpuShares": 512}, ""),
    ],
)
def test_an_update_is_judged_when_it_sets_a_restart_policy(body, asked) -> None:
    uri = "/v1.41/containers/abc/update"
    got = decide.authz_request(classify("POST", uri), "POST", uri, json.dumps(body).encode(), None)  # type: ignore[arg-type]
    assert got == (UpdateCheck("abc", (), asked) if asked else decide.ALLOW)


def test_a_restart_policy_is_refused_where_a_start_would_be(alloc, fake) -> None:
    cid, _ = bound(alloc, fake)
    plain = fake.add("plain")
    fake.add("unleased", gpus=(alloc.gather.inventory().gpus[1].uuid,))  # no lease
    assert alloc.admission.resolve(UpdateCheck(cid, (), "always")) == decide.ALLOW  # its own lease
    assert alloc.admission.resolve(UpdateCheck(plain, (), "always")) == decide.ALLOW  # no GPU
    assert (
        alloc.admission.resolve(UpdateCheck("gone", (), "always")) == decide.ALLOW
    )  # dockerd: 404
    refused = alloc.admission.resolve(UpdateCheck("unleased", (), "on-failure:3"))
    assert isinstance(refused, decide.Deny)
    assert refused.msg.startswith(
        "gpu-alloc refused the container update: restart policy on-failure:3 would have "
        "dockerd start unleased by itself"
    )
    assert "without a gpu-alloc lease" in refused.msg and "docker rm" in refused.msg


def test_the_start_up_check_turns_off_only_what_a_start_would_refuse(alloc, fake) -> None:
    cid, _ = bound(alloc, fake)
    unleased = fake.add("unleased", gpus=(alloc.gather.inventory().gpus[1].uuid,))
    plain = fake.add("plain")
    for c in (unleased, plain):
        fake.by_id[c]["HostConfig"]["RestartPolicy"] = dict(ALWAYS)
    assert alloc.restarts.check_restarts() == [unleased]
    assert fake.by_id[cid]["HostConfig"]["RestartPolicy"] == ALWAYS
    assert fake.by_id[plain]["HostConfig"]["RestartPolicy"] == ALWAYS
    (line,) = audit(alloc)
    assert line["container"] == unleased and "without a gpu-alloc lease" in line["reason"]


class Steps:
    """A background owner that keeps the step it is given, for the test to run."""

    def every(self, name: str, period: float, step, first: float | None = None) -> None:
        self.step = step


def test_after_a_policy_reload_the_check_runs_again_until_the_engine_answers(
    alloc, fake, monkeypatch
) -> None:
    unleased = fake.add("unleased", gpus=(alloc.gather.inventory().gpus[1].uuid,))
    fake.by_id[unleased]["HostConfig"]["RestartPolicy"] = dict(ALWAYS)
    steps = Steps()
    alloc.restarts.follow_policy(steps)  # type: ignore[arg-type]
    steps.step()  # no reload yet: nothing looked at
    assert fake.by_id[unleased]["HostConfig"]["RestartPolicy"] == ALWAYS
    for tell in alloc.gather.policy_listeners:
        tell(alloc.gather.policy)
    listing = fake.containers

    def down(**_: object) -> list:
        raise EngineError("Engine at fake.sock: not answering")

    monkeypatch.setattr(fake, "containers", down)
    with pytest.raises(EngineError):
        steps.step()
    monkeypatch.setattr(fake, "containers", listing)
    steps.step()  # the reload is still owed a check
    assert fake.by_id[unleased]["HostConfig"]["RestartPolicy"]["Name"] == "no"


def test_a_reset_turns_policies_off_before_it_drops_the_leases(alloc, fake) -> None:
    cid, _ = bound(alloc, fake)
    seen_file = []
    original = fake.update

    def update(container: str, config: dict) -> None:
        seen_file.append(alloc.ledger.path.exists())
        original(container, config)

    fake.update = update  # type: ignore[method-assign]
    assert "turned off the restart policy of 1 container(s)" in repair(alloc, reset=True)
    assert seen_file == [True]  # the ledger was still in place
    assert fake.by_id[cid]["HostConfig"]["RestartPolicy"] == {"Name": "no"}


def test_described_writes_policies_as_the_cli_does() -> None:
    assert restarts.described({"Name": "on-failure", "MaximumRetryCount": 3}) == "on-failure:3"
    assert restarts.described({"Name": "on-failure"}) == "on-failure"
    assert restarts.described({"Name": "no"}) == restarts.described(None) == ""


def test_an_update_to_a_container_whose_lease_is_due_to_end_is_refused(alloc, fake) -> None:
    """Stopped past release_stopped_after: the next reconcile ends its lease, and a policy
    set now could land after that reconcile turned it off."""
    cid, _ = bound(alloc, fake)
    stop(fake, cid)  # stopped in 2020: long past the 1 s rule
    refused = alloc.admission.resolve(UpdateCheck(cid, (), "always"))
    assert isinstance(refused, decide.Deny)
    assert "stayed stopped longer than policy.release_stopped_after" in refused.msg


def test_an_expired_containers_policy_goes_off_again_after_the_lease_ends(alloc, fake) -> None:
    """An update judged while the lease still held may land after the first turn-off."""
    cid, lease_id = bound(alloc, fake)
    stop(fake, cid)
    assert alloc.reconciler.reconcile().freed == [lease_id]
    assert fake.seen == [(cid, Phase.BOUND.value), (cid, None)]
    assert fake.by_id[cid]["HostConfig"]["RestartPolicy"] == {"Name": "no"}
