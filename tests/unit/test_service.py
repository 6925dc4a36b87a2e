"""The service against an in-memory Engine: leases, settling and reconcile, without dockerd.

Each test builds a host of simulated GPUs, an empty ledger and a `FakeEngine`, then
drives `Allocator` the way the shim and the plugin do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from allocator.core.access.access import EngineView
from allocator.core.api import labels
from allocator.core.judging import compose
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.leases import outcomes
from allocator.core.leases.leases import Phase
from allocator.core.machine.inventory import InventoryError
from allocator.core.placement import Shortage
from allocator.core.timing.clock import Now
from allocator.host import clock as hostclock
from allocator.host import config as configmod
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine

GPUS = 4
UUIDS = [sim.sim_gpu_uuid(k) for k in range(GPUS)]
NV = "nvidia-container-runtime"


def one(n: int = 1) -> Ask:
    return Ask(required=(), count=n, every=False, caps=("gpu",))


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def gpus_file(tmp_path: Path) -> Path:
    return sim.write_sim_gpus(tmp_path / "gpus.yaml", GPUS)


@pytest.fixture
def alloc(tmp_path: Path, gpus_file: Path, fake: FakeEngine) -> Allocator:
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus_file),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"pending_ttl": 300}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]


def leased(alloc: Allocator, n: int = 1, name: str = "job", given=None):
    got = alloc.book.lease(LeaseRequest(one(n), name, labels=given))
    assert not isinstance(got, Shortage), got
    return got


def create(fake: FakeEngine, lease, token: str, name: str = "job", **kw) -> str:
    """What dockerd does with the shim's rewritten create: a container carrying the lease."""
    return fake.add(name, gpus=lease.gpus, lease=labels.lease_label(lease.id), **kw)


# ---------------------------------------------------------------------- leasing


def test_leases_take_distinct_free_gpus_without_asking_the_engine(alloc, fake) -> None:
    a, _ = leased(alloc)
    b, _ = leased(alloc)
    assert set(a.gpus).isdisjoint(b.gpus)
    assert alloc.ledger.read().leases[a.id].phase is Phase.PENDING
    assert fake.calls == []  # the common path: ledger and inventory only


def test_a_gpu_asked_by_name_and_held_says_who_holds_it_and_what_to_ask(alloc, fake) -> None:
    named = Ask(required=(UUIDS[1],), count=0, every=False, caps=("gpu",))
    assert isinstance(alloc.book.lease(LeaseRequest(named, "t2")), tuple)
    short = alloc.book.lease(LeaseRequest(named, "again"))
    assert isinstance(short, Shortage)
    assert short.msg.startswith(f"gpu-alloc: GPU 1 ({UUIDS[1]}), asked by name, is not free (")
    assert "'t2'" in short.msg and "3 of 4 on this host are" in short.msg
    assert "Ask for a count (--gpus 1) to take any free one" in short.msg


def test_a_shortage_reconciles_once_and_finds_gpus_freed_by_docker_rm(alloc, fake) -> None:
    lease, token = leased(alloc, GPUS)
    cid = create(fake, lease, token)
    alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    assert isinstance(alloc.book.lease(LeaseRequest(one(), "next")), Shortage)
    fake.remove(cid)  # `docker rm` never passes the plugin with the container's GPUs
    again, _ = leased(alloc, 1, "next")
    assert lease.id not in alloc.ledger.read().leases
    assert again.gpus[0] in lease.gpus


def test_a_shortage_says_which_holder_is_stopped_from_reconciles_listing(alloc, fake) -> None:
    lease, token = leased(alloc, GPUS)
    cid = create(fake, lease, token, "train", running=False)
    alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    fake.calls.clear()
    short = alloc.book.lease(LeaseRequest(one(), "next"))
    assert isinstance(short, Shortage)
    assert f"(lease {lease.id}, bound; stopped: Exited (0) 5 minutes ago)" in short.msg
    assert short.msg.count("A stopped container keeps its GPUs until it is removed") == 1
    assert "inspect" not in fake.calls  # the reconcile's listing told it, no holder asked
    fake.by_id[cid]["State"] = {"Running": True, "Status": "running"}
    running = alloc.book.lease(LeaseRequest(one(), "next"))
    assert isinstance(running, Shortage) and "stopped" not in running.msg


# ---------------------------------------------------- settling a create's answer


def test_201_binds_the_lease_to_the_new_container(alloc, fake) -> None:
    lease, token = leased(alloc)
    outcome = outcomes.create_outcome(lease.id, token, 201, b'{"Id": "' + b"c" * 64 + b'"}')
    alloc.book.settle(outcome)
    bound = alloc.ledger.read().leases[lease.id]
    assert (bound.phase, bound.container) == (Phase.BOUND, "c" * 64)


def test_a_201_to_a_create_with_a_forged_lease_header_binds_nothing(alloc, fake) -> None:
    """A header the shim did not send proves nothing, whatever the Engine answered."""
    lease, _ = leased(alloc)
    alloc.book.settle(
        outcomes.create_outcome(lease.id, "made-up", 201, b'{"Id": "' + b"d" * 64 + b'"}')
    )
    assert alloc.ledger.read().leases[lease.id].phase is Phase.PENDING


def test_an_error_to_a_create_with_a_forged_lease_header_frees_nothing(alloc, fake) -> None:
    """Else a failing create naming someone's pending lease would free its GPUs while
    that lease's own create is still on its way to a container."""
    lease, _ = leased(alloc)
    alloc.book.settle(outcomes.create_outcome(lease.id, "made-up", 404, b'{"message": "no image"}'))
    assert alloc.ledger.read().leases[lease.id].phase is Phase.PENDING


def test_the_plugins_own_admitted_create_binds_without_reading_the_ledger(
    alloc, fake, monkeypatch
) -> None:
    lease, token = leased(alloc)
    cid = create(fake, lease, token)
    reads = []
    monkeypatch.setattr(alloc.ledger, "read", lambda: reads.append(1))
    body = json.dumps({"Id": cid}).encode()
    header = {labels.LEASE_HEADER: labels.lease_header(lease.id, token)}
    alloc.book.settle(
        outcomes.authz_response("POST", "/v1.41/containers/create", 201, body, header)
    )
    monkeypatch.undo()
    assert reads == []
    assert alloc.ledger.read().leases[lease.id].container == cid


def test_an_error_with_no_container_frees_the_lease(alloc, fake) -> None:
    lease, token = leased(alloc)
    alloc.book.settle(outcomes.create_outcome(lease.id, token, 409, b'{"message": "name in use"}'))
    assert lease.id not in alloc.ledger.read().leases


def test_an_error_after_dockerd_created_the_container_binds_instead(alloc, fake) -> None:
    """A 5xx (or a 4xx) can come after the container exists: its lease must not be freed."""
    lease, token = leased(alloc)
    cid = create(fake, lease, token)
    alloc.book.settle(outcomes.create_outcome(lease.id, token, 500, b'{"message": "authz broke"}'))
    assert alloc.ledger.read().leases[lease.id].container == cid


def test_an_error_with_the_engine_down_leaves_the_lease_pending(alloc, fake) -> None:
    lease, token = leased(alloc)
    fake.down = True
    alloc.book.settle(outcomes.create_outcome(lease.id, token, 404, b""))
    assert alloc.ledger.read().leases[lease.id].phase is Phase.PENDING


def test_the_plugin_and_the_shim_follow_the_same_rule() -> None:
    """AuthZRes and the shim both settle through `create_outcome`: 4xx proves nothing."""
    headers = {"X-Gpu-Alloc-Lease": "abc.tok"}  # as dockerd passes the request's headers on
    plugin = outcomes.authz_response("POST", "/v1.41/containers/create", 400, None, headers)
    assert plugin == outcomes.create_outcome("abc", "tok", 400, None)
    assert plugin == outcomes.Unanswered("abc", "abc", "tok")
    assert outcomes.create_outcome("abc", "tok", 201, b"not json") is None  # reconcile binds


def test_a_removal_by_id_prefix_ends_that_containers_lease_once_it_is_gone(alloc, fake) -> None:
    lease, token = leased(alloc)
    cid = create(fake, lease, token)
    alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    alloc.book.settle(outcomes.Forget(cid[:12]))
    assert lease.id in alloc.ledger.read().leases  # the Engine still has it: a decoy went
    fake.remove(cid)
    alloc.book.settle(outcomes.Forget(cid[:12]))
    assert lease.id not in alloc.ledger.read().leases


# ------------------------------------------------------------------ reconcile


def test_reconcile_frees_a_lease_whose_container_is_gone(alloc, fake) -> None:
    lease, token = leased(alloc)
    cid = create(fake, lease, token)
    alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    fake.remove(cid)
    report = alloc.reconciler.reconcile()
    assert report.freed == [lease.id]
    assert alloc.ledger.read().leases == {}


def test_reconcile_binds_a_pending_lease_to_the_container_that_carries_it(alloc, fake) -> None:
    """The shim was killed between forwarding and settling: the label finds the container."""
    lease, token = leased(alloc)
    cid = create(fake, lease, token)
    assert alloc.reconciler.reconcile().bound == [lease.id]
    assert alloc.ledger.read().leases[lease.id].container == cid


def test_reconcile_binds_a_privileged_containers_lease_of_every_gpu(alloc, fake) -> None:
    """policy.privileged: lease-all: privileged mode is never pinned, the lease is the host."""
    got = alloc.book.lease(LeaseRequest(Ask((), 0, True, ("gpu",)), "dind"))
    assert not isinstance(got, Shortage), got
    cid = fake.add("dind", lease=labels.lease_label(got[0].id))
    fake.by_id[cid]["HostConfig"]["Privileged"] = True
    assert alloc.reconciler.reconcile().bound == [got[0].id]


def test_a_copied_label_without_the_gpus_binds_nothing(alloc, fake) -> None:
    """`docker commit` copies labels: a container must hold the lease's GPUs to get it."""
    lease, _ = leased(alloc)
    fake.add("copy", lease=labels.lease_label(lease.id))  # no device request
    assert alloc.reconciler.reconcile().bound == []
    assert alloc.ledger.read().leases[lease.id].phase is Phase.PENDING


def test_a_pending_lease_past_its_deadline_is_freed(alloc, fake, monkeypatch) -> None:
    lease, _ = leased(alloc)
    boot_id, granted = lease.granted_boot or ("", 0.0)
    ttl = lease.deadline - lease.created
    monkeypatch.setattr(
        hostclock, "read", lambda: Now(lease.deadline + 1, boot_id, granted + ttl + 1)
    )
    assert alloc.reconciler.reconcile().freed == [lease.id]


def test_a_wall_clock_set_forward_frees_no_pending_lease_early(alloc, fake, monkeypatch) -> None:
    lease, _ = leased(alloc)
    assert lease.granted_boot is not None  # the grant read the boot's clock
    boot_id, granted = lease.granted_boot
    monkeypatch.setattr(hostclock, "read", lambda: Now(lease.deadline + 3600, boot_id, granted + 5))
    assert alloc.reconciler.reconcile().freed == []


def test_adopted_gpus_are_not_leased_again(alloc, fake) -> None:
    """A container made on the real socket before gpu-alloc was installed keeps its GPUs."""
    foreign = fake.add("legacy", gpus=(UUIDS[0], UUIDS[1]))
    report = alloc.reconciler.reconcile(adopt=True)
    assert report.adopted == [foreign]
    lease, _ = leased(alloc, 2)
    assert set(lease.gpus) == {UUIDS[2], UUIDS[3]}
    assert isinstance(alloc.book.lease(LeaseRequest(one(), "more")), Shortage)
    fake.remove(foreign)
    assert alloc.reconciler.reconcile().dropped == [foreign]


# ------------------------------------------------------------ Compose recreate


def test_a_compose_recreate_on_a_full_host_takes_over_its_predecessors_gpus(alloc, fake) -> None:
    given = {compose.PROJECT: "p", compose.SERVICE: "train"}
    old, token = leased(alloc, GPUS, "p_train_1", given)
    old_id = create(fake, old, token, "p_train_1", labels_=given)
    alloc.book.settle(outcomes.Bind(old.id, old_id, token))
    # Compose v1: stop the old one, rename it <short id>_<name>, create the new one.
    fake.by_id[old_id]["State"] = {"Running": False, "Status": "exited"}
    fake.by_id[old_id]["Name"] = f"/{old_id[:12]}_p_train_1"
    new, _ = leased(alloc, GPUS, "p_train_1", given)
    assert set(new.gpus) == set(old.gpus)
    state = alloc.ledger.read()
    assert state.leases[old.id].phase is Phase.HANDED_OVER
    assert fake.updates == [(old_id, {"RestartPolicy": {"Name": "no"}})] * 2  # before, after
    refusal = alloc.restarts.start_refusal(old_id)
    assert refusal and "handed to the container replacing it" in refusal


def test_a_start_is_judged_on_one_inspect_of_the_container_as_it_is_now(alloc, fake) -> None:
    """The Engine grants at start; /info is cached, so later starts cost one inspect each."""
    fake.add("plain")
    assert alloc.restarts.start_refusal("plain") is None
    assert fake.calls.count("inspect") == 1
    fake.calls.clear()
    assert alloc.restarts.start_refusal("plain") is None
    assert fake.calls == ["inspect"]


# --------------------------------------------------------- inventory unreadable


def test_an_unreadable_inventory_is_a_missing_fact_not_an_error(alloc, gpus_file) -> None:
    gpus_file.unlink()
    facts = alloc.gather.facts()
    assert facts.inventory is None
    assert str(gpus_file) in facts.inventory_error
    with pytest.raises(InventoryError, match="cannot read simulated GPUs"):
        alloc.book.lease(LeaseRequest(one(), "job"))


def test_without_an_inventory_only_creates_that_touch_gpus_are_refused(alloc, gpus_file) -> None:
    gpus_file.write_text("[unclosed")
    facts = alloc.gather.facts()
    plain = {"Image": "busybox", "HostConfig": {}}
    assert isinstance(decide.shim_ask(plain, facts), Ask)
    gpu = {"Image": "busybox", "HostConfig": {"DeviceRequests": [{"Driver": "nvidia", "Count": 1}]}}
    refused = decide.shim_ask(gpu, facts)
    assert isinstance(refused, decide.Deny)
    assert "cannot read the GPU inventory" in refused.msg and str(gpus_file) in refused.msg


def test_reconcile_without_an_inventory_says_why(alloc, gpus_file) -> None:
    gpus_file.unlink()
    with pytest.raises(InventoryError, match=str(gpus_file)):
        alloc.reconciler.reconcile()


# ------------------------------------------------------------ default runtime


@pytest.mark.parametrize(
    ("daemon_json", "nvidia"),
    [
        ({}, False),
        ({"default-runtime": "runc", "runtimes": {"nvidia": {"path": NV}}}, False),
        ({"default-runtime": "nvidia"}, True),  # not even listed: fail closed
        ({"default-runtime": "gpu", "runtimes": {"gpu": {"path": f"/usr/bin/{NV}"}}}, True),
    ],
)  # fmt: skip
def test_one_default_runtime_check_for_info_and_daemon_json(daemon_json, nvidia) -> None:
    assert EngineView.from_daemon_json(daemon_json).default_is_nvidia is nvidia
    info = {
        "DefaultRuntime": daemon_json.get("default-runtime"),
        "Runtimes": daemon_json.get("runtimes"),
    }
    assert EngineView.from_info(info).default_is_nvidia is nvidia


NVIDIA_DEFAULT = {"DefaultRuntime": "nvidia", "Runtimes": {"nvidia": {"path": NV}}}


def engine_world(tmp_path: Path, gpus_file: Path, fake: FakeEngine) -> Allocator:
    """An Allocator whose dockerd has a daemon.json and a socket of its own, as on a host."""
    (tmp_path / "daemon.json").write_text("{}")
    (tmp_path / "docker.sock").write_text("")
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus_file),
           "engine": {"socket": str(tmp_path / "docker.sock"),
                      "daemon_json": str(tmp_path / "daemon.json")},
           "plugin": {"socket": str(tmp_path / "plugins" / "gpu-alloc.sock")}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "plugins").mkdir(exist_ok=True)
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]


def test_the_engines_view_is_read_once_while_nothing_changes(tmp_path, gpus_file, fake) -> None:
    alloc = engine_world(tmp_path, gpus_file, fake)
    for _ in range(3):
        assert not alloc.gather.engine_view().default_is_nvidia
    assert fake.calls.count("info") == 1
    assert alloc.gather.known_engine_view() is not None


def sighup_after_rewriting_daemon_json(tmp_path: Path, alloc: Allocator) -> None:
    (tmp_path / "daemon.json").write_text(json.dumps({"default-runtime": "nvidia"}))


def restart_making_the_socket_again(tmp_path: Path, alloc: Allocator) -> None:
    (tmp_path / "docker.sock").unlink()
    (tmp_path / "docker.sock").write_text("")


def restart_seen_by_another_worker(tmp_path: Path, alloc: Allocator) -> None:
    Allocator(alloc.config, FakeEngine()).gather.engine_activated()  # Plugin.Activate, elsewhere


@pytest.mark.parametrize(
    "change",
    [
        sighup_after_rewriting_daemon_json,
        restart_making_the_socket_again,
        restart_seen_by_another_worker,
    ],
)
def test_a_dockerd_that_may_run_other_runtimes_is_asked_again_before_the_next_decision(
    tmp_path, gpus_file, fake, change
) -> None:
    alloc = engine_world(tmp_path, gpus_file, fake)
    assert not alloc.gather.engine_view().default_is_nvidia
    fake._info = NVIDIA_DEFAULT
    change(tmp_path, alloc)
    assert alloc.gather.known_engine_view() is None  # the event loops send the decision to a thread
    assert alloc.gather.engine_view().default_is_nvidia


@pytest.mark.parametrize(
    ("edit", "nvidia"),
    [
        ({"default-runtime": "nvidia"}, True),
        ({"runtimes": {"nvidia": {"path": NV}}}, False),  # listed, not the default
        ("{not json", False),  # dockerd would refuse it: what it runs stands
    ],
)
def test_a_daemon_json_edit_counts_before_dockerd_reloads_it(
    tmp_path, gpus_file, fake, edit, nvidia
) -> None:
    alloc = engine_world(tmp_path, gpus_file, fake)
    assert not alloc.gather.engine_view().default_is_nvidia
    text = edit if isinstance(edit, str) else json.dumps(edit)
    (tmp_path / "daemon.json").write_text(text)  # no SIGHUP yet: /info still says runc
    assert alloc.gather.engine_view().default_is_nvidia is nvidia


def test_nvml_failing_is_named_in_the_refusal(tmp_path: Path, fake: FakeEngine) -> None:
    """No NVIDIA driver here: NVML fails, and only a GPU create hears about it."""
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": "nvml",
           "engine": {"socket": str(tmp_path / "none.sock")}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]
    facts = alloc.gather.facts()
    if facts.inventory is not None:
        pytest.skip("this host has a working NVML")
    assert isinstance(decide.shim_ask({"Image": "busybox", "HostConfig": {}}, facts), Ask)
    gpu = {"Image": "busybox", "HostConfig": {"DeviceRequests": [{"Driver": "nvidia", "Count": 1}]}}
    refused = decide.shim_ask(gpu, facts)
    assert isinstance(refused, decide.Deny) and "NVML" in refused.msg


def test_a_second_201_for_a_bound_lease_binds_nothing(alloc, fake) -> None:
    lease, token = leased(alloc)
    assert alloc.book.bind(lease.id, "c" * 64, token)
    with alloc.ledger.transaction():
        pass  # the journal folded in: the binding is in the state file now
    assert not alloc.book.bind(lease.id, "d" * 64, token)
    assert alloc.ledger.read().leases[lease.id].container == "c" * 64
