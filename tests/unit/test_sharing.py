"""Shared GPUs as plain data: the policy, a share's ask, where shares go, what they get,
how they count, and how the ledger keeps them (allocator/core/rules/sharing.py and
allocator/core/placement/shares.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from allocator.core.access import access
from allocator.core.access.facts import EngineView
from allocator.core.api import labels
from allocator.core.leases import events
from allocator.core.leases.leases import State
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.placement import Shortage
from allocator.core.placement.shares import Out, Placed, out_of, place
from allocator.core.rules import policy, queue, sharing
from allocator.core.rules.sharing import ShareAsk, Sharing
from allocator.core.timing import report
from allocator.core.timing.uses import uses
from allocator.host import config
from allocator.host import mps as host_mps
from allocator.ops import gpus as gpus_view
from allocator.ops import sharing_doctor
from allocator.service.views import shares as shared_view
from shim import metrics_server
from tests.support.table_host import TableHost

GPUS = tuple(GPU(f"GPU-{i}", i, memory_mib=81920, minor=i) for i in range(4))
QUARTERS = Sharing(gpus=(0, 1), shares=4)
SPREAD = Sharing(gpus=(0, 1), shares=4, spread=True)
TIMESLICE = Sharing(gpus=(0, 1), shares=4, mode=sharing.TIMESLICE)
QUARTER = ShareAsk(1, 4)
MPS_DIR = "/run/gpu-alloc/mps"


@pytest.mark.parametrize(
    ("labels", "got"),
    [
        ({}, None),
        ({sharing.SHARE: "1/4"}, ShareAsk(1, 4)),
        ({sharing.SHARE: " 3/8 "}, ShareAsk(3, 8)),
        ({sharing.MEMORY: "20GiB"}, ShareAsk(memory=20 << 30)),
    ],
)
def test_a_share_is_asked_as_a_fraction_or_a_memory_size(labels, got) -> None:
    assert sharing.share_ask(labels) == got


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({sharing.SHARE: "1/1"}, "a fraction of one GPU"),
        ({sharing.SHARE: "quarter"}, "a fraction of one GPU"),
        ({sharing.SHARE: "0/4"}, "a fraction of one GPU"),
        ({sharing.SHARE: "²/4"}, "a fraction of one GPU"),  # str.isdigit, and int() fails
        ({sharing.SHARE: "١/٤"}, "a fraction of one GPU"),  # int() reads it as 1/4
        ({sharing.SHARE: "1/４"}, "a fraction of one GPU"),
        ({sharing.SHARE: "1/4/8"}, "a fraction of one GPU"),
        ({sharing.SHARE: "1/" + "9" * 30}, "a fraction of one GPU"),
        ({sharing.MEMORY: "lots"}, "is not a size"),
        ({sharing.SHARE: "1/4", sharing.MEMORY: "1g"}, "give one of them"),
    ],
)
def test_a_share_ask_that_cannot_be_read_says_why(labels, why) -> None:
    got = sharing.share_ask(labels)
    assert isinstance(got, str) and why in got


def test_the_share_labels_are_known_to_gpu_alloc() -> None:
    assert labels.unknown({sharing.SHARE: "1/4", sharing.MEMORY: "1g"}) is None


def test_a_quarter_is_one_of_four_shares_and_a_size_the_shares_it_fills() -> None:
    assert QUARTER.slots(QUARTERS, GPUS[0]) == 1
    assert ShareAsk(memory=20 << 30).slots(QUARTERS, GPUS[0]) == 1  # 80 GiB / 4 = 20 GiB
    assert ShareAsk(1, 2).slots(TIMESLICE, GPUS[0]) == 2  # timeslice: accounting only
    assert ShareAsk(memory=30 << 30).slots(TIMESLICE, GPUS[0]) == 2
    assert "not a whole number of its 4 shares" in str(ShareAsk(1, 3).slots(QUARTERS, GPUS[0]))
    # MPS caps are one share's on the daemon, and a client can only lower them
    assert "cannot be raised" in str(ShareAsk(1, 2).slots(QUARTERS, GPUS[0]))
    assert "more than its 4 shares" in str(ShareAsk(memory=90 << 30).slots(TIMESLICE, GPUS[0]))


def test_mps_serves_one_user_at_a_time_unless_the_rule_says_any() -> None:
    out = {u: Out(1, frozenset({"1000"})) for u in ("GPU-0", "GPU-1")}
    root = ShareAsk(1, 4, user="0")
    got = place(root, GPUS, [QUARTERS], out, ())
    assert isinstance(got, Shortage) and "MPS serves one user at a time" in got.msg
    assert place(ShareAsk(1, 4, user="1000"), GPUS, [QUARTERS], out, ()).gpu.uuid == "GPU-0"
    anyone = Sharing(gpus=(0, 1), shares=4, users=sharing.ANY_USER)
    assert isinstance(place(root, GPUS, [anyone], out, ()), Placed)
    assert isinstance(place(root, GPUS, [TIMESLICE], out, ()), Placed)


def test_the_container_user_is_compared_as_mps_sees_it() -> None:
    assert sharing.user_of("", "") == "0"
    assert sharing.user_of("root:root", "") == "0"
    assert sharing.user_of("", "1000:1000") == "1000"
    assert sharing.user_of("alice", "1000") == "alice"


def test_the_daemon_gets_one_shares_caps_by_index_and_timeslice_none() -> None:
    assert sharing.daemon_commands(QUARTERS, GPUS[0]) == [
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_active_thread_percentage 25",
    ]
    sized = Sharing(gpus=(0,), shares=3, memory=10 << 30, threads=20)
    assert sharing.daemon_commands(sized, GPUS[0]) == [
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_active_thread_percentage 20",
    ]
    assert sharing.daemon_commands(TIMESLICE, GPUS[0]) == []
    assert "no memory or compute caps, no isolation" in TIMESLICE.said(GPUS[0])


def test_a_share_gets_its_pipe_its_shm_and_its_caps_as_environment() -> None:
    assert sharing.client_binds(MPS_DIR, "GPU-0", sharing.MPS) == [
        f"{MPS_DIR}/GPU-0/pipe:{sharing.CLIENT_PIPE}",
        f"{MPS_DIR}/GPU-0/shm:/dev/shm",
    ]
    assert sharing.client_env(QUARTERS, GPUS[0], 1) == [
        f"CUDA_MPS_PIPE_DIRECTORY={sharing.CLIENT_PIPE}",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
    ]
    assert sharing.client_binds(MPS_DIR, "GPU-0", sharing.TIMESLICE) == []
    assert sharing.client_env(TIMESLICE, GPUS[0], 1) == []


SHARE_LABELS = {labels.LEASE: "0123abcd", sharing.SHARE: "1/4"}
SHARE_BINDS = sharing.client_binds(MPS_DIR, "GPU-0", sharing.MPS)


@pytest.mark.parametrize(
    ("given", "binds", "rule", "held"),
    [
        (SHARE_LABELS, SHARE_BINDS, QUARTERS, (1, 4)),
        (SHARE_LABELS, [*SHARE_BINDS, "/data:/data"], QUARTERS, (1, 4)),
        ({**SHARE_LABELS, sharing.SHARE: "2/2"}, [], TIMESLICE, (2, 2)),
        (SHARE_LABELS, [], TIMESLICE, (1, 4)),
        (SHARE_LABELS, SHARE_BINDS[:1], QUARTERS, None),
        (SHARE_LABELS, [], QUARTERS, None),
        ({sharing.SHARE: "1/4"}, SHARE_BINDS, QUARTERS, None),
        ({**SHARE_LABELS, sharing.SHARE: "5/4"}, SHARE_BINDS, QUARTERS, None),
        ({**SHARE_LABELS, sharing.SHARE: "half"}, SHARE_BINDS, QUARTERS, None),
        (SHARE_LABELS, SHARE_BINDS, None, None),
    ],
    ids=[
        "mps",
        "mps-and-more",
        "timeslice-all",
        "timeslice",
        "pipe-only",
        "image-label",
        "no-lease",
        "too-many",
        "unreadable",
        "not-shared",
    ],
)
def test_a_share_is_read_back_from_its_container_only_with_what_the_shim_gave_it(
    given, binds, rule, held
) -> None:
    """A reset lost its lease: the share label with the lease label says which share, and
    an MPS share must have its GPU's binds too (an image's label alone is no share)."""
    assert sharing.held_share(given, binds, "GPU-0", rule, MPS_DIR) == held


@pytest.mark.parametrize(
    ("env", "ipc", "why"),
    [
        (["CUDA_MPS_PIPE_DIRECTORY=/elsewhere"], "", "CUDA_MPS_PIPE_DIRECTORY"),
        (["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"], "", "raise them"),
        ([], "host", "--ipc host"),
        ([], "container:db", "--ipc container:db"),
    ],
)
def test_a_clients_own_mps_settings_and_host_ipc_are_refused(env, ipc, why) -> None:
    assert why in str(sharing.client_refusal(env, ipc))


def test_private_and_unset_ipc_pass() -> None:
    assert sharing.client_refusal(["PATH=/bin"], "") is None
    assert sharing.client_refusal([], "private") is None


def test_a_bind_of_one_gpus_pipe_or_shm_directory_is_that_gpu() -> None:
    known = {"GPU-0", "GPU-1"}
    assert sharing.share_dir_gpu(f"{MPS_DIR}/GPU-0/pipe", MPS_DIR, known) == "GPU-0"
    assert sharing.share_dir_gpu(f"{MPS_DIR}/GPU-1/shm", MPS_DIR, known) == "GPU-1"
    assert sharing.share_dir_gpu(f"{MPS_DIR}/GPU-1/log", MPS_DIR, known) is None
    assert sharing.share_dir_gpu(f"{MPS_DIR}/GPU-9/pipe", MPS_DIR, known) is None
    assert sharing.share_dir_gpu(MPS_DIR, MPS_DIR, known) is None
    assert sharing.share_dir_gpu(f"{MPS_DIR}/GPU-0/pipe", "", known) is None


def test_effective_access_pins_a_pipe_bind_to_its_gpu_and_the_rest_of_the_dir_to_every_gpu():
    host = TableHost(protected=(*TableHost().protected, MPS_DIR), mps_dir=MPS_DIR)
    inventory = Inventory(GPUS)
    view = EngineView(version=(28, 5, 2))
    pipe = {"HostConfig": {"Binds": [f"{MPS_DIR}/GPU-1/pipe:/p"]}}
    (grant,) = access.of_create(pipe, view, inventory, host).grants
    assert grant.gpus == frozenset({"GPU-1"}) and grant.leasable
    whole_dir = {"HostConfig": {"Binds": [f"{MPS_DIR}:/mps"]}}
    (grant,) = access.of_create(whole_dir, view, inventory, host).grants
    assert grant.gpus is None and not grant.leasable  # refused: it reaches every pipe


def test_a_share_counts_as_its_fraction_in_limits() -> None:
    st = State()
    for _ in range(3):
        lease, _ = st.new_lease(("GPU-0",), 0, 60)
        st.leases[lease.id] = replace_share(lease, "alice")
    assert st.held_by("alice") == 0.75
    rules = policy.Rules(default_limit=1, exempt=())
    alice = policy.Owner(1000, "alice")
    assert policy.over_limit(alice, st.held_by("alice"), 0.25, rules) is None
    refused = policy.over_limit(alice, 1.0, 0.25, rules)
    assert refused is not None and "holds 1 of 1 GPU allowed" in refused.msg
    assert "asked for 0.25 more" in refused.msg


def test_thirds_add_up_to_a_whole_gpu() -> None:
    rules = policy.Rules(default_limit=1, exempt=())
    assert policy.over_limit(policy.Owner(1, "bob"), 1 / 3 + 1 / 3, 1 / 3, rules) is None


def test_out_of_counts_each_gpus_shares_and_users() -> None:
    st = State()
    for user in ("0", "0", "1000"):
        lease, _ = st.new_lease(("GPU-0",), 0, 60)
        st.leases[lease.id] = replace_share(lease, "alice", user)
    st.new_lease(("GPU-2",), 0, 60)  # a whole lease: no shares out
    assert out_of(st.leases.values()) == {"GPU-0": Out(3, frozenset({"0", "1000"}))}


def test_the_ledger_writes_share_fields_only_for_shares_and_reads_old_files() -> None:
    st = State()
    whole, _ = st.new_lease(("GPU-2",), 0, 60)
    share, _ = st.new_lease(("GPU-0",), 0, 60)
    st.leases[share.id] = replace_share(share, "alice")
    data = json.loads(json.dumps(st.to_json()))
    assert "share_of" not in data["leases"][whole.id]  # an older gpu-alloc reads it
    assert data["leases"][share.id]["share_of"] == 4
    back = State.from_json(data, "ledger")
    assert back.leases[share.id].share_slots == 1 and back.leases[whole.id].share_of == 0


def test_policy_sharing_is_read_strictly() -> None:
    got = config.parse(
        "policy:\n  pools: {nb: {gpus: [2, 3]}}\n  sharing:\n"
        "    - {pool: nb, shares: 8, memory: 8GiB, threads: 10, placement: spread}\n"
        "    - {gpus: [0], shares: 2, mode: timeslice}\n"
    )
    nb, ts = got.policy.rules.sharing
    assert (nb.gpus, nb.shares, nb.memory, nb.threads, nb.spread) == ((2, 3), 8, 8 << 30, 10, True)
    assert (ts.gpus, ts.mode) == ((0,), sharing.TIMESLICE)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("{gpus: [0], shares: 1}", "policy.sharing[0].shares"),
        ("{gpus: [0]}", "policy.sharing[0].shares"),
        ("{shares: 2}", "policy.sharing[0]'"),
        ("{gpus: [0], pool: x, shares: 2}", "policy.sharing[0]'"),
        ("{pool: nope, shares: 2}", "policy.sharing[0].pool"),
        ("{gpus: [0], shares: 2, mode: mig}", "policy.sharing[0].mode"),
        ("{gpus: [0], shares: 2, mode: timeslice, threads: 50}", "policy.sharing[0].mode"),
        ("{gpus: [0], shares: 2, threads: 101}", "policy.sharing[0].threads"),
        ("{gpus: [0], shares: 2, memory: lots}", "policy.sharing[0].memory"),
        ("{gpus: [0], shares: 2, placement: random}", "policy.sharing[0].placement"),
        ("{gpus: [0], shares: 2, slices: 2}", "policy.sharing[0].slices"),
    ],
)
def test_a_bad_sharing_entry_names_its_key(text, key) -> None:
    with pytest.raises(config.ConfigError) as e:
        config.parse(f"policy:\n  sharing: [{text}]\n")
    assert key in str(e.value)


def test_a_gpu_shared_twice_is_refused() -> None:
    with pytest.raises(config.ConfigError, match=r"sharing\[1\].gpus.*GPU 0 is shared"):
        config.parse("policy:\n  sharing: [{gpus: [0], shares: 2}, {gpus: [0, 1], shares: 4}]\n")


def replace_share(lease, owner: str, user: str = "0"):
    return replace(lease, owner=owner, share_slots=1, share_of=4, share_user=user)


PAIRS = (("GPU-0", "a"), ("GPU-1", "b"))


def test_reports_and_fair_share_count_a_share_as_its_fraction_of_a_gpu() -> None:
    grant = events.record("grant", 0.0, gpus=("GPU-0",), lease="a", owner="al", share="1/4")
    whole = events.record("grant", 0.0, gpus=("GPU-1",), lease="b", owner="bo")
    ended = [events.record("release", 3600.0, gpus=(g,), lease=k) for g, k in PAIRS]
    assert "share" not in whole  # a whole GPU's audit line is as before
    rows = uses([grant, whole, *ended])
    parts = {h.owner: h.part for h in report.held(rows)}
    assert parts == {"al": 0.25, "bo": 1.0}
    used = report.decayed(report.held(rows), 3600.0, 1e12)
    assert used["al"] == pytest.approx(900.0) and used["bo"] == pytest.approx(3600.0)


def test_a_gpu_in_mig_mode_is_never_shared() -> None:
    mig = GPU("GPU-9", 0, memory_mib=81920, mig_mode=True)
    assert sharing.rule_for(mig, [QUARTERS]) is None


def test_status_and_metrics_show_each_shared_gpu_and_each_share() -> None:
    st = State()
    lease, _ = st.new_lease(("GPU-0",), 0, 60)
    st.leases[lease.id] = replace_share(lease, "alice", "1000")
    inventory = Inventory(GPUS)
    rules = policy.Rules(sharing=(QUARTERS, Sharing(gpus=(2,), shares=2, mode="timeslice")))
    snap = {
        "shared": shared_view.shared(inventory, rules, st),
        "shares": shared_view.shares(inventory, st, {}),
    }
    assert shared_view.lines(snap) == [
        "GPU 0 shared: 1 of 4 out; 4 MPS shares of 20480 MiB and 25% each",
        f"  share 1/4: - of alice (lease {lease.id})",
        "GPU 1 shared: 0 of 4 out; 4 MPS shares of 20480 MiB and 25% each",
        "GPU 2 shared: 0 of 2 out; 2 timeslice shares (no memory or compute caps, no isolation)",
    ]
    (sample,) = metrics_server.share_family(snap).samples
    assert sample.name == "gpu_alloc_share_info" and sample.value == 1
    assert sample.labels == {"uuid": "GPU-0", "index": "0", "owner": "alice", "container": "",
                             "lease": lease.id, "share": "1/4"}  # fmt: skip


def test_the_line_counts_a_served_share_as_its_fraction() -> None:
    waiters = [queue.Waiter("a", "al", 0, 1, 1), queue.Waiter("b", "bo", 0, 2, 1),
               queue.Waiter("c", "al", 0, 3, 1)]  # fmt: skip

    def attempt(w: queue.Waiter, blocked: frozenset[str]) -> queue.Placed:
        return queue.Placed(("GPU-0",), w.id, 0.25)

    served = queue.serve(waiters, {"al": 0.0, "bo": 0.5}, attempt)
    # al holds a quarter after "a", less than bo's half: al's next share goes first
    assert [w.id for w, _ in served] == ["a", "c", "b"]


def test_doctor_names_a_missing_mps_control_and_says_timeslice_has_no_isolation(tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("[{uuid: GPU-0, index: 0, memory_mib: 81920}]\n")
    base = f"gpus: {gpus}\nmps: {{dir: {tmp_path}/mps, control: {tmp_path}/none}}\n"
    mps = config.parse(base + "policy: {sharing: [{gpus: [0], shares: 2}]}\n")
    status, what, fix = sharing_doctor.check(mps)
    assert status == "FAIL" and "is not found" in what and "mode: timeslice" in fix
    ts = config.parse(base + "policy: {sharing: [{gpus: [0], shares: 2, mode: timeslice}]}\n")
    status, what, _ = sharing_doctor.check(ts)
    assert status == "ok" and "2 timeslice shares (no caps, no isolation)" in what
    far = config.parse(base + "policy: {sharing: [{gpus: [7], shares: 2, mode: timeslice}]}\n")
    assert "names GPU 7" in sharing_doctor.check(far)[1]


def test_gpus_shows_each_share_under_its_gpu() -> None:
    row = {"index": 0, "uuid": "GPU-0", "model": "H200", "state": "leased", "holder": {},
           "container_state": "running", "idle": False, "utilization": None,
           "memory_used_bytes": None, "memory_total_bytes": None, "temperature_c": None,
           "power_w": None, "owner": "al", "container_name": "nb1", "processes": [],
           "healthy": True}  # fmt: skip
    shown = [{"uuid": "GPU-0", "share": "1/4", "owner": o, "name": n, "container": None}
             for o, n in (("al", "nb1"), ("bo", "nb2"))]  # fmt: skip
    table = gpus_view.render_table({"gpus": [row], "shares": shown}).splitlines()
    assert [line.split() for line in table[2:]] == [
        ["share", "1/4", "al", "nb1"], ["share", "1/4", "bo", "nb2"]
    ]  # fmt: skip


class FakeDaemons:
    """`allocator.host.mps.Daemons` as a table: which GPUs' daemons run, and each call."""

    def __init__(self) -> None:
        self.up: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def running(self) -> set[str]:
        return set(self.up)

    def start(self, uuid: str, commands: list[str]) -> None:
        self.calls.append(("start", uuid))
        self.up.add(uuid)

    def stop(self, uuid: str) -> None:
        self.calls.append(("stop", uuid))
        self.up.discard(uuid)


def test_the_mps_part_keeps_one_daemon_per_gpu_with_shares_out(tmp_path) -> None:
    from allocator.service.wiring import Allocator

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("[{uuid: GPU-0, index: 0, memory_mib: 81920}, {uuid: GPU-1, index: 1}]\n")
    cfg = config.parse(
        f"gpus: {gpus}\nstate_dir: {tmp_path}/state\n"
        "policy: {sharing: [{gpus: [0, 1], shares: 4}]}\n"
    )
    alloc = Allocator(cfg)
    fake = FakeDaemons()
    alloc.mps.daemons = fake  # type: ignore[assignment]
    with alloc.ledger.transaction() as st:
        st.adopted_at = 0.0  # as the shim's start leaves it
        lease, _ = st.new_lease(("GPU-0",), 0, 600)
        st.leases[lease.id] = lease = replace_share(lease, "al")
    assert alloc.mps.ensure(lease) is None and alloc.mps.ensure(lease) is None
    assert fake.calls == [("start", "GPU-0")]  # one daemon, however many shares
    fake.up.clear()  # a reboot emptied the run directory; the share lives on
    alloc.mps.sync()
    assert fake.calls[-1] == ("start", "GPU-0")
    with alloc.ledger.transaction() as st:
        st.release(lease.id)
    alloc.mps.sync()
    assert fake.calls[-1] == ("stop", "GPU-0") and fake.up == set()


def share_container(fake, uuid: str, mps_dir: str) -> str:
    """A share's container as the shim makes it (allocator/service/creates.py `_shared`)."""
    gpu = GPU(uuid, 0, memory_mib=81920)
    cid = fake.add("nb", gpus=(uuid,), lease="0123abcd",
                   labels_={sharing.SHARE: "1/4", policy.OWNER: "1000:al"},
                   env=tuple(sharing.client_env(QUARTERS, gpu, 1)))  # fmt: skip
    fake.by_id[cid]["HostConfig"]["Binds"] = sharing.client_binds(mps_dir, uuid, sharing.MPS)
    fake.by_id[cid]["Config"]["User"] = "1000"
    return cid


def test_a_reset_adopts_a_running_share_as_its_share_and_keeps_its_daemon(
    tmp_path, monkeypatch
) -> None:
    """`gpu-alloc repair --reset` while a share runs: the share is its GPU's share again
    (not a claim of the whole GPU), and the GPU's MPS daemon is never told to quit under
    it, not even by the shim's look between the ledger's move and the adoption."""
    from allocator.host.filesystem import Host
    from allocator.ops.repair import repair
    from allocator.service.wiring import Allocator
    from tests.support.fake_engine import FakeEngine

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("[{uuid: GPU-0, index: 0, memory_mib: 81920}, {uuid: GPU-1, index: 1}]\n")
    cfg = config.parse(
        f"gpus: {gpus}\nstate_dir: {tmp_path}/state\nmps: {{dir: {tmp_path}/mps}}\n"
        "policy: {sharing: [{gpus: [0, 1], shares: 4}]}\n"
    )
    fake = FakeEngine()
    alloc = Allocator(cfg, fake, Host())  # type: ignore[arg-type]  # paths as we see them
    alloc.mps.daemons = daemons = FakeDaemons()  # type: ignore[assignment]
    cid = share_container(fake, "GPU-0", f"{tmp_path}/mps")
    with alloc.ledger.transaction() as st:
        st.adopted_at = 0.0
        lease, _ = st.new_lease(("GPU-0",), 0, 600)
        st.leases[lease.id] = replace_share(lease, "al")
        st.bind(lease.id, cid)
    daemons.up.add("GPU-0")
    adopting = alloc.reconciler.reconcile

    def after_a_look(adopt: bool = False):
        alloc.mps.sync()  # the shim's background work, on the ledger just moved aside
        return adopting(adopt=adopt)

    monkeypatch.setattr(alloc.reconciler, "reconcile", after_a_look)
    assert "adopted 1 container(s)" in repair(alloc, reset=True)
    state = alloc.ledger.read()
    (share,) = state.leases.values()
    assert state.claims == {}
    assert (share.id, share.container, share.gpus) == ("0123abcd", cid, ("GPU-0",))
    assert (share.share_slots, share.share_of, share.share_user, share.owner) == (
        1,
        4,
        "1000",
        "al",
    )
    alloc.mps.sync()
    assert daemons.calls == [] and daemons.up == {"GPU-0"}
    fake.remove(cid)  # its last share ends: now its daemon goes
    monkeypatch.undo()
    alloc.reconciler.reconcile()
    alloc.mps.sync()
    assert daemons.calls == [("stop", "GPU-0")]


def test_a_daemon_runs_as_a_transient_unit_under_systemd_and_in_its_own_namespace_elsewhere():
    top = Path("/run/gpu-alloc/mps/GPU-0")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-0", "CUDA_MPS_PIPE_DIRECTORY": f"{top}/pipe",
           "CUDA_MPS_LOG_DIRECTORY": f"{top}/log", "HOME": "/root"}  # fmt: skip
    unit = host_mps.launch("GPU-0", top, "/usr/bin/nvidia-cuda-mps-control", env, systemd=True)
    assert unit[:3] == ["systemd-run", "--unit=gpu-alloc-mps-GPU-0", "--collect"]
    assert f"--property=BindPaths={top}/shm:/dev/shm" in unit
    assert f"--setenv=CUDA_MPS_PIPE_DIRECTORY={top}/pipe" in unit
    assert not [a for a in unit if "HOME" in a]  # only the daemon's own settings
    assert unit[-2:] == ["/usr/bin/nvidia-cuda-mps-control", "-d"]
    bare = host_mps.launch("GPU-0", top, "/usr/bin/nvidia-cuda-mps-control", env, systemd=False)
    assert bare[:2] == ["unshare", "--mount"] and f"{top}/shm" in bare
