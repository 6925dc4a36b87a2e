"""allocator.core.rules.policy and the policy keys of the config: limits, pools, labels,
defaults."""

from __future__ import annotations

import pytest

from allocator.core.leases.leases import Claim, Lease, Phase, State
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.rules import policy
from allocator.core.rules.policy import Invalid, Owner, Pool, Refusal, Rules, Ulimit, Wanted
from allocator.core.timing.clock import Now
from allocator.host.config import ConfigError, parse

LAB = """
policy:
  limits:
    default: {gpus: 2}
    users: {alice: {gpus: 4}}
    groups: {ml-staff: {gpus: 8}}
  exempt: [root]
  pools:
    training: {gpus: [0, 1, 2, 3], groups: [ml-staff]}
    interactive: {gpus: [4, 5, 6, 7]}
  default_pool: interactive
  gpu_defaults:
    shm_size: 2g
    ulimits: {memlock: -1, stack: 67108864}
  release_stopped_after: 24h
"""
RULES = parse(LAB, "lab.yaml").policy.rules
ALICE = Owner(1000, "alice", ("alice",))
BOB = Owner(1001, "bob", ("bob", "ml-staff"))
CAROL = Owner(1002, "carol", ("carol",))
INVENTORY = Inventory(
    tuple(
        GPU(f"GPU-{k}", k, "NVIDIA A100 80GB" if k < 4 else "Tesla T4", 81920 if k < 4 else 16384)
        for k in range(8)
    )
)


def test_the_lab_policy_reads_as_written():
    assert RULES.default_limit == 2 and RULES.user_limits == {"alice": 4}
    assert RULES.group_limits == {"ml-staff": 8} and RULES.exempt == ("root",)
    assert RULES.pools["training"] == Pool((0, 1, 2, 3), (), ("ml-staff",))
    assert RULES.default_pool == "interactive"
    assert RULES.shm_size == 2 * 2**30
    assert RULES.ulimits == (Ulimit("memlock", -1, -1), Ulimit("stack", 67108864, 67108864))
    assert RULES.release_stopped_after == 86400


def test_no_policy_means_no_limits_no_pools_and_root_exempt():
    rules = parse("", "x.yaml").policy.rules
    assert rules == Rules() and rules.exempt == ("root",)
    assert policy.limit_of(CAROL, rules) is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("policy: {limits: {defualt: {gpus: 1}}}", "policy.limits.defualt"),
        ("policy: {limits: {default: {gpus: -1}}}", "policy.limits.default.gpus"),
        ("policy: {limits: {users: {alice: {gpus: two}}}}", "policy.limits.users.alice.gpus"),
        ("policy: {limits: {groups: {ml: 3}}}", "policy.limits.groups.ml"),
        ("policy: {exempt: [root, 0]}", "policy.exempt[1]"),
        ("policy: {pools: {a: {users: [x]}}}", "policy.pools.a.gpus"),
        ("policy: {pools: {a: {gpus: [0, one]}}}", "policy.pools.a.gpus[1]"),
        ("policy: {pools: {a: {gpus: [0]}}, default_pool: b}", "policy.default_pool"),
        ("policy: {gpu_defaults: {shm_size: lots}}", "policy.gpu_defaults.shm_size"),
        (
            "policy: {gpu_defaults: {ulimits: {memlock: big}}}",
            "policy.gpu_defaults.ulimits.memlock",
        ),
        ("policy: {gpu_defaults: {shm: 1g}}", "policy.gpu_defaults.shm"),
        ("policy: {release_stopped_after: soon}", "policy.release_stopped_after"),
        ("policy: {release_stopped_after: 0}", "policy.release_stopped_after"),
    ],
)
def test_each_mistake_names_the_file_and_dotted_key(text, key):
    with pytest.raises(ConfigError) as info:
        parse(text, "/etc/gpu-alloc/config.yaml")
    assert str(info.value).startswith(f"/etc/gpu-alloc/config.yaml: key '{key}'")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), (90, 90), ("30s", 30), ("15m", 900), ("2d", 172800)]
)
def test_durations(text, seconds):
    assert (
        parse(f"policy: {{release_stopped_after: {text}}}").policy.rules.release_stopped_after
        == seconds
    )


def test_the_largest_limit_that_applies_wins_and_the_exempt_have_none():
    assert policy.limit_of(CAROL, RULES) == (2, "policy.limits.default")
    assert policy.limit_of(ALICE, RULES) == (4, "policy.limits.users.alice")
    assert policy.limit_of(BOB, RULES) == (8, "policy.limits.groups.ml-staff")
    assert policy.limit_of(Owner(0, "root"), RULES) is None


def test_over_the_limit_is_refused_naming_the_rule():
    refused = policy.over_limit(CAROL, 2, 1, RULES)
    assert isinstance(refused, Refusal)
    assert "carol holds 2 of 2 GPUs allowed (policy.limits.default)" in refused.msg
    assert "docker rm" in refused.msg and "ask your operator" in refused.msg
    assert policy.over_limit(CAROL, 1, 1, RULES) is None
    assert refused.waitable  # one of carol's containers going makes room


def test_asking_for_more_than_the_limit_itself_says_so_never_remove_a_container():
    never = policy.over_limit(CAROL, 0, 3, RULES)
    assert never and "carol may hold 2 GPUs at once (policy.limits.default)" in never.msg
    assert "asked for 3; ask for 2 or fewer, or ask your operator to raise" in never.msg
    assert "docker rm" not in never.msg and not never.waitable
    assert "docker rm" not in (policy.over_limit(CAROL, 1, 3, RULES) or never).msg


def test_the_ledger_counts_an_owners_gpus_running_or_stopped():
    state = State()
    state.leases["a"] = Lease("a", ("GPU-0", "GPU-1"), "", Phase.BOUND.value, "c1", owner="carol")
    state.leases["b"] = Lease("b", ("GPU-2",), "", Phase.PENDING.value, owner="carol")
    state.leases["c"] = Lease("c", ("GPU-3",), "", Phase.BOUND.value, "c3", owner="dave")
    assert state.held_by("carol") == 3
    assert state.held_by("carol", besides="a") == 1  # a Compose predecessor hands them over


def test_a_request_without_a_pool_goes_to_the_default_pool():
    gpus, pool = policy.eligible(INVENTORY, Wanted(), CAROL, RULES)
    assert pool == "interactive" and [g.index for g in gpus.gpus] == [4, 5, 6, 7]


def test_a_pool_with_groups_is_open_to_its_members_only():
    gpus, pool = policy.eligible(INVENTORY, Wanted(pool="training"), BOB, RULES)
    assert pool == "training" and [g.index for g in gpus.gpus] == [0, 1, 2, 3]
    refused = policy.eligible(INVENTORY, Wanted(pool="training"), CAROL, RULES)
    assert isinstance(refused, Refusal)
    assert "pool 'training' is not open to carol (policy.pools.training)" in refused.msg
    assert "use one open to you with --label io.gpu-alloc.pool=NAME (interactive)" in refused.msg


def test_an_unknown_pool_is_an_invalid_request():
    unknown = policy.eligible(INVENTORY, Wanted(pool="gpu"), CAROL, RULES)
    assert isinstance(unknown, Invalid)
    assert "no GPU pool 'gpu' (pools: interactive, training); name one of them" in unknown.msg
    nowhere = policy.eligible(INVENTORY, Wanted(pool="gpu"), CAROL, Rules())
    assert isinstance(nowhere, Invalid)
    assert "this host has no pools; leave out --label io.gpu-alloc.pool" in nowhere.msg


def test_model_and_memory_labels_narrow_the_gpus():
    no_pools = Rules()
    want = policy.wanted({policy.MODEL: "t4"})
    gpus, _ = policy.eligible(INVENTORY, want, CAROL, no_pools)
    assert [g.index for g in gpus.gpus] == [4, 5, 6, 7]
    want = policy.wanted({policy.MIN_MEMORY: "40g"})
    gpus, _ = policy.eligible(INVENTORY, want, CAROL, no_pools)
    assert [g.index for g in gpus.gpus] == [0, 1, 2, 3]
    bad = policy.wanted({policy.MIN_MEMORY: "lots"})
    assert isinstance(bad, Invalid) and policy.MIN_MEMORY in bad.msg


def test_a_named_gpu_outside_the_pool_is_refused():
    refused = policy.eligible(INVENTORY, Wanted(), CAROL, RULES, required=("GPU-0",))
    assert isinstance(refused, Refusal)
    assert "GPU 0 is not in pool 'interactive' (policy.pools.interactive)" in refused.msg


@pytest.mark.parametrize(
    ("text", "size"),
    [("40g", 40 * 2**30), ("512MiB", 512 * 2**20), ("1.5G", 3 * 2**29), ("4096", 4096)],
)
def test_sizes_read_like_docker_shm_size(text, size):
    assert policy.parse_size(text) == size


def test_gpu_defaults_fill_only_what_the_client_left_unset():
    filled = policy.with_defaults({"HostConfig": {"ShmSize": 0}}, RULES)["HostConfig"]
    assert filled["ShmSize"] == 2 * 2**30
    assert [u["Name"] for u in filled["Ulimits"]] == ["memlock", "stack"]
    own = {"HostConfig": {"ShmSize": 2**30, "Ulimits": [{"Name": "memlock", "Soft": 1, "Hard": 1}]}}
    kept = policy.with_defaults(own, RULES)["HostConfig"]
    assert kept["ShmSize"] == 2**30
    assert kept["Ulimits"] == [
        {"Name": "memlock", "Soft": 1, "Hard": 1},
        {"Name": "stack", "Soft": 67108864, "Hard": 67108864},
    ]
    spec = {"Image": "x"}
    assert policy.with_defaults(spec, Rules()) is spec


def test_the_owner_label_reads_uid_then_user():
    assert policy.owner_label(ALICE) == "1000:alice"
    assert policy.owner_label(policy.NOBODY) == ":unknown"


def test_an_old_state_file_without_owners_still_loads():
    data = {
        "version": 1,
        "leases": {"a": {"id": "a", "gpus": ["GPU-0"], "token_sha256": "x", "state": "bound"}},
        "claims": {},
    }
    lease = State.from_json(data, "state.json").leases["a"]
    assert lease.owner == "" and lease.owner_uid is None and lease.pool is None
    (holder,) = State.from_json(data, "state.json").holders({"GPU-0"}).values()
    assert holder.owner == "unknown"


def test_a_shortage_names_each_holder_once_with_owner_and_age():
    from allocator.core.judging.ask import Ask
    from allocator.core.leases.holders import Holder
    from allocator.core.placement import POLICIES, Shortage, place

    inventory = Inventory(INVENTORY.gpus[:4])
    alice = Holder("c" * 64, "train", "leased", "l1", "bound", "alice", 1000, 1000.0)
    held = {g.uuid: alice for g in inventory.gpus}
    short = place(Ask((), 1, False, ("gpu",)), inventory, held, POLICIES["numa"], 1000.0 + 7200)
    assert isinstance(short, Shortage)
    assert short.msg.count("alice") == 1
    assert "GPUs 0,1,2,3: container cccccccccccc 'train' of alice, held 2h" in short.msg
    bob = Holder("b" * 64, "eval", "leased", "l2", "bound", "bob", 1001, 1000.0 + 7190)
    held = {g.uuid: alice if g.index < 2 else bob for g in inventory.gpus}
    short = place(Ask((), 1, False, ("gpu",)), inventory, held, POLICIES["numa"], 1000.0 + 7200)
    assert isinstance(short, Shortage)
    lines = short.msg.splitlines()  # one holder a line, between the count and the advice
    assert lines[0].endswith("0 of 4 free on this host, held by:")
    assert (
        lines[1] == "  GPUs 0,1: container cccccccccccc 'train' of alice, held 2h (lease l1, bound)"
    )
    assert (
        lines[2] == "  GPUs 2,3: container bbbbbbbbbbbb 'eval' of bob, held <1m (lease l2, bound)"
    )
    assert lines[3].startswith("Remove a container that holds GPUs, or ask for fewer")
    where = Wanted(pool="training", model="A100").where("training")
    assert where == "pool 'training', model containing 'A100'"
    more = place(Ask((), 5, False, ("gpu",)), inventory, {}, POLICIES["numa"], None, where)
    assert isinstance(more, Shortage)
    assert "asked for 5 GPUs but pool 'training', model containing 'A100' has only 4" in more.msg
    assert "Remove" not in more.msg
    model = Wanted(model="H100").where(None)
    none = place(Ask((), 1, False, ("gpu",)), Inventory(()), {}, POLICIES["numa"], None, model)
    assert isinstance(none, Shortage) and not none.waitable
    assert none.msg.startswith(
        "gpu-alloc: no GPU on this host is in the GPUs with model containing 'H100'"
    )
    assert "'gpu-alloc gpus' lists each GPU's model" in none.msg
    every = Ask((), 0, True, ("gpu",))  # --gpus all of no GPU is no lease of nothing
    nothing = place(every, Inventory(()), {}, POLICIES["numa"], None, model)
    assert isinstance(nothing, Shortage) and "no GPU on this host is in" in nothing.msg


def test_a_shortage_says_a_holder_is_stopped_and_how_its_gpus_come_back():
    from allocator.core.judging.ask import Ask
    from allocator.core.leases.reconcile import apply
    from allocator.core.placement import POLICIES, Shortage, place

    inventory = Inventory(INVENTORY.gpus[:3])
    state = State()
    for k, (cid, name) in enumerate((("a" * 64, "train"), ("b" * 64, "serve"))):
        state.leases[f"l{k}"] = Lease(f"l{k}", (f"GPU-{k}",), "x", Phase.BOUND.value, cid,
                                      name, 1000.0, owner="alice")  # fmt: skip
    state.claims["c" * 64] = Claim("c" * 64, "old", ("GPU-2",), "privileged")
    listed = {
        "a" * 64: {"State": "exited", "Status": "Exited (0) 2 hours ago"},
        "b" * 64: {"State": "running", "Status": "Up 2 hours"},
        "c" * 64: {"State": "running", "Status": "Up 3 days"},
    }
    report = apply(state.copy(), state, listed, {}, {}, Now(1000.0))
    assert report.stopped == {"a" * 64: "Exited (0) 2 hours ago"} and not report
    held = state.holders(inventory.uuids, report.stopped)
    assert held["GPU-0"].describe(1000.0 + 7200) == (
        "container aaaaaaaaaaaa 'train' of alice, held 2h "
        "(lease l0, bound; stopped: Exited (0) 2 hours ago)"
    )
    assert held["GPU-1"].describe(1000.0 + 7200) == (
        "container bbbbbbbbbbbb 'serve' of alice, held 2h (lease l1, bound)"
    )
    short = place(Ask((), 1, False, ("gpu",)), inventory, held, POLICIES["numa"], 1000.0 + 7200)
    assert isinstance(short, Shortage) and short.msg.count("stopped:") == 1
    assert short.msg.count("A stopped container") == 1
    assert short.msg.endswith(
        "shows who holds what. A stopped container keeps its GPUs until it is removed: its "
        "owner can 'docker rm' it, or the operator can set policy.release_stopped_after"
    )
    named = Ask(("GPU-1",), 0, False, ("gpu",))  # only what is in the way gets the hint
    in_the_way = place(named, inventory, held, POLICIES["numa"], 1000.0)
    assert isinstance(in_the_way, Shortage) and "stopped" not in in_the_way.msg
    unknown = place(Ask((), 1, False, ("gpu",)), inventory, state.holders(inventory.uuids),
                    POLICIES["numa"], 1000.0)  # fmt: skip
    assert isinstance(unknown, Shortage) and "stopped" not in unknown.msg
    # An adopted container is freed by its removal alone: no release_stopped_after.
    claimed = state.holders(inventory.uuids, {"c" * 64: "Exited (1) 3 days ago"})
    assert claimed["GPU-2"].describe() == (
        "container cccccccccccc 'old' (not leased: privileged; stopped: Exited (1) 3 days ago)"
    )
    left = place(Ask(("GPU-2",), 0, False, ("gpu",)), inventory, claimed, POLICIES["numa"])
    assert isinstance(left, Shortage)
    assert left.msg.endswith("its owner can 'docker rm' it")


@pytest.mark.parametrize(
    ("text", "stamp"),
    [
        ("2026-12-01T09:30:00.123456789Z", 1796117400.123456),
        ("2026-12-01T09:30:00Z", 1796117400.0),
        ("2026-12-01T09:30:00.5+01:00", 1796113800.5),
        ("0001-01-01T00:00:00Z", None),  # Go's zero time: never stopped
        ("yesterday", None),
    ],
)
def test_the_engines_times_read_as_go_writes_them(text, stamp):
    from allocator.host.engine import go_time

    assert go_time(text) == stamp


def test_only_leases_stopped_past_the_duration_expire():
    rules = Rules(release_stopped_after=60.0)
    leases = [("a", "c1"), ("b", "c2"), ("c", "c3")]
    stopped = {"c1": Now(0.0), "c2": Now(50.0)}
    assert policy.expired(leases, stopped, Now(100.0), rules) == ["a"]
    assert policy.expired(leases, {"c1": Now(0.0)}, Now(100.0), Rules()) == []


def test_the_shim_asks_nss_about_a_uid_again_only_after_its_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from allocator.core.judging.owners import Asker
    from allocator.host import owners

    asked: list[int] = []
    clock = [1000.0]
    monkeypatch.setattr(owners, "_named", {})
    monkeypatch.setattr(
        owners, "_lookup", lambda uid, gid, _: (asked.append(uid) or Owner(uid, "u"), True)
    )
    monkeypatch.setattr(owners, "_clock", lambda: clock[0])
    asker = Asker(1001, 1001)
    assert owners.person(asker) == owners.person(asker) == Owner(1001, "u")
    assert asked == [1001]
    clock[0] += owners.OWNER_TTL
    owners.person(asker)
    assert asked == [1001, 1001]  # a group change counts within the TTL


def test_an_nss_answer_given_only_in_part_is_asked_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A directory that did not answer may have left groups out: limits and pools by
    group would follow the gap for the whole TTL."""
    from allocator.core.judging.owners import Asker
    from allocator.host import owners

    asked: list[int] = []
    monkeypatch.setattr(owners, "_named", {})
    monkeypatch.setattr(
        owners, "_lookup", lambda uid, gid, _: (asked.append(uid) or Owner(uid, str(uid)), False)
    )
    asker = Asker(1002, 1002)
    owners.person(asker)
    owners.person(asker)
    assert asked == [1002, 1002]


def test_a_container_created_a_moment_ago_is_not_called_stopped_or_told_to_be_removed():
    from allocator.core.judging.ask import Ask
    from allocator.core.leases.reconcile import apply
    from allocator.core.placement import POLICIES, Shortage, place

    inventory = Inventory((GPU("GPU-0", 0),))
    state = State()
    state.leases["l0"] = Lease("l0", ("GPU-0",), "x", Phase.BOUND.value, "a" * 64, "job",
                               1000.0, owner="alice")  # fmt: skip
    listed = {"a" * 64: {"State": "created", "Status": "Created"}}
    report = apply(state.copy(), state, listed, {}, {}, Now(1000.0))
    held = state.holders(inventory.uuids, report.stopped)
    assert held["GPU-0"].describe(1001.0) == (
        "container aaaaaaaaaaaa 'job' of alice, held <1m "
        "(lease l0, bound; created, not started yet)"
    )
    short = place(Ask((), 1, False, ("gpu",)), inventory, held, POLICIES["numa"], 1001.0)
    assert isinstance(short, Shortage)
    assert "stopped" not in short.msg and "docker rm" not in short.msg


def test_a_request_larger_than_the_whole_host_names_the_host_not_the_pool():
    from allocator.core.judging.ask import Ask
    from allocator.core.placement import POLICIES, Shortage, place

    pool = Inventory(INVENTORY.gpus[4:])  # 'interactive': 4 of the host's 8
    where = Wanted().where("interactive")
    huge = place(Ask((), 99, False, ("gpu",)), pool, {}, POLICIES["numa"], None, where,
                 host_units=8)  # fmt: skip
    assert isinstance(huge, Shortage) and not huge.waitable
    assert huge.msg == "gpu-alloc: asked for 99 GPUs but this host has only 8; ask for fewer"
    five = place(Ask((), 5, False, ("gpu",)), pool, {}, POLICIES["numa"], None, where,
                 host_units=8)  # fmt: skip
    assert isinstance(five, Shortage) and "pool 'interactive' has only 4" in five.msg
