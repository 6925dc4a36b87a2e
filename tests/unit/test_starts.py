"""The start verdict and the Compose hand-over rule, as pure functions: no dockerd, no root.

Host facts come from tables: a directory's contents and a path's target are what
they are *at start*, whatever they were at create.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from allocator.core.access import privileged
from allocator.core.access.facts import EngineView, Node
from allocator.core.access.mounts import Mount
from allocator.core.judging import verdicts as decide
from allocator.core.judging.starts import refusal
from allocator.core.leases import outcomes
from allocator.core.leases.leases import Lease, Phase, State
from allocator.core.machine.inventory import GPU, Inventory

UUIDS = [f"GPU-{k}" for k in range(4)]
INVENTORY = Inventory(tuple(GPU(u, k, minor=k) for k, u in enumerate(UUIDS)))
OWN = "a" * 64
OLD = "b" * 64


@dataclass
class Table:
    """HostFacts from dicts: nodes by path, links by path, directory listings."""

    nodes: dict[str, Node] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, list[str]] = field(default_factory=dict)
    protected: tuple[str, ...] = ("/dev", "/proc", "/sys")

    def resolve(self, path: str) -> str:
        return self.links.get(path, path)

    def node(self, path: str) -> Node | None:
        return Node("dir") if path in self.dirs else self.nodes.get(path)

    def walk(self, top: str) -> Iterable[str]:
        return self.dirs.get(top, [])

    def drm_bus_id(self, minor: int) -> str | None:
        return None

    def dynamic_majors(self) -> frozenset[int]:
        return frozenset()

    def mounts(self) -> Iterable[Mount]:
        return (Mount("/", "ext4"), Mount("/dev", "devtmpfs"), Mount("/proc", "proc"))

    def may_use_power(self, user: str, power: str) -> bool:
        return (user, power) == ("ci", "privileged")  # policy.powers: {privileged: [ci]}


def inspect(cid: str = OWN, name: str = "job", running: bool = False, **host_config) -> dict:
    return {"Id": cid, "Name": "/" + name, "State": {"Running": running},
            "Config": {"Env": []}, "HostConfig": host_config, "Mounts": []}  # fmt: skip


def leased(*gpus: str, phase: Phase = Phase.BOUND, container: str = OWN, **kw) -> Lease:
    return Lease(f"l-{container[:2]}", tuple(gpus), "", phase.value, container, **kw)


def state_of(*leases: Lease) -> State:
    return State(leases={le.id: le for le in leases})


def pinned(*uuids: str) -> dict:
    return {"DeviceRequests": [{"Driver": "", "DeviceIDs": list(uuids),
                                "Capabilities": [["gpu"]]}]}  # fmt: skip


def judge(info, state, host=None, old=None, owner="", mode=privileged.LEASE_ALL) -> str | None:
    return refusal(
        "job", info, state, EngineView(), INVENTORY, host or Table(), old, None, owner, mode
    )


DEVICE_DIR = {"Devices": [{"PathOnHost": "/dev/ga-devs", "PathInContainer": "/dev/x"}]}
GPU_NODE = Node("chr", 195, 2)


def test_a_device_directory_empty_at_create_is_judged_by_what_it_holds_at_start():
    empty = Table(dirs={"/dev/ga-devs": []})
    assert judge(inspect(**DEVICE_DIR), State(), empty) is None
    filled = Table(dirs={"/dev/ga-devs": ["/dev/ga-devs/n"]}, nodes={"/dev/ga-devs/n": GPU_NODE})
    why = judge(inspect(**DEVICE_DIR), State(), filled)
    assert why and "without a gpu-alloc lease" in why and "HostConfig.Devices[0]" in why


def test_a_bind_source_that_became_a_link_to_dev_is_refused_at_start():
    binds = {"Binds": ["/srv/data:/data"]}
    assert judge(inspect(**binds), State(), Table(nodes={"/srv/data": Node("dir")})) is None
    why = judge(inspect(**binds), State(), Table(links={"/srv/data": "/dev"}))
    assert why and "exposes /dev" in why


def test_the_containers_own_lease_covers_its_gpus_and_no_more():
    own = state_of(leased(UUIDS[1], UUIDS[2]))
    assert judge(inspect(**pinned(UUIDS[1], UUIDS[2])), own) is None
    assert judge(inspect(**pinned(UUIDS[1])), own) is None  # a subset
    why = judge(inspect(**pinned(UUIDS[1], UUIDS[3])), own)
    assert why and "GPU-3 beyond its lease" in why
    grown = Table(dirs={"/dev/ga-devs": ["/dev/ga-devs/n"]}, nodes={"/dev/ga-devs/n": GPU_NODE})
    hc = {**pinned(UUIDS[1]), **DEVICE_DIR}
    assert "GPU-2" not in (judge(inspect(**hc), own, grown) or "")  # GPU-2 is leased
    assert judge(inspect(**hc), state_of(leased(UUIDS[1])), grown)  # GPU-2 is not


def test_another_containers_lease_covers_nothing():
    theirs = state_of(leased(UUIDS[0], container=OLD))
    assert "without a gpu-alloc lease" in judge(inspect(**pinned(UUIDS[0])), theirs)


def test_unpinned_access_is_refused_even_with_a_lease():
    own = state_of(leased(*UUIDS))
    assert "every GPU" in judge(inspect(DeviceCgroupRules=["c 195:* rwm"]), own)
    assert "every GPU" in judge(inspect(Privileged=True), state_of(leased(*UUIDS[:3])))


def test_a_privileged_container_starts_while_its_lease_holds_every_gpu():
    # policy.privileged: lease-all leased it the whole host at create
    assert judge(inspect(Privileged=True), state_of(leased(*UUIDS))) is None
    both = inspect(Privileged=True, DeviceCgroupRules=["c 195:* rwm"])
    assert "every GPU" in judge(both, state_of(leased(*UUIDS)))  # other unpinned access: no


def test_a_privileged_container_starts_only_while_the_policy_still_lets_its_owner():
    """policy.powers.privileged taken away (or policy.privileged turned back to refuse):
    the container keeps its lease, and its next start is refused saying why."""
    whole, dind = state_of(leased(*UUIDS)), inspect(Privileged=True)
    assert judge(dind, whole, owner="ci", mode=privileged.REFUSE) is None
    revoked = judge(dind, whole, owner="eve", mode=privileged.REFUSE)
    assert revoked is not None and "no longer lets eve run privileged" in revoked
    assert "policy.powers.privileged" in revoked


def test_no_gpu_starts_even_when_the_ledger_is_unreadable():
    assert judge(inspect(), "state.json: corrupt") is None
    assert "cannot be read" in judge(inspect(**pinned(UUIDS[0])), "state.json: corrupt")


def test_a_missing_container_is_left_to_dockerd():
    assert judge(None, State()) is None


# ------------------------------------------------------------- the hand-over rule


def handed(old_name: str = "job") -> State:
    old = leased(UUIDS[0], phase=Phase.HANDED_OVER, container=OLD, name=old_name,
                 handed_to="l-aa")  # fmt: skip
    return state_of(old, leased(UUIDS[0]))


def test_a_container_that_lent_its_gpus_never_starts_again():
    why = judge(inspect(OLD, running=False, **pinned(UUIDS[0])), handed())
    assert why and "handed to the container replacing it" in why


def test_the_replacement_starts_once_its_predecessor_is_gone():
    assert judge(inspect(**pinned(UUIDS[0])), handed(), old=None) is None


def test_the_replacement_waits_while_its_predecessor_runs():
    old = inspect(OLD, name="job", running=True)
    assert "still runs on its GPUs" in judge(inspect(**pinned(UUIDS[0])), handed(), old=old)


def test_compose_v1s_stopped_and_renamed_predecessor_lets_the_replacement_start():
    old = inspect(OLD, name=f"{OLD[:12]}_job")
    assert judge(inspect(**pinned(UUIDS[0])), handed(), old=old) is None


def test_a_stopped_predecessor_without_the_v1_rename_keeps_the_replacement_down():
    """The forgery: copied labels claim a running victim's GPUs; the victim stops."""
    old = inspect(OLD, name="victim")
    why = judge(inspect(**pinned(UUIDS[0])), handed(), old=old)
    assert why and "remove that one first" in why


# ------------------------------------------------------------------ the routes


def test_restart_is_judged_like_start():
    facts = decide.Facts(INVENTORY, EngineView(), Table())
    for uri in ("/v1.41/containers/job/restart", "/containers/job/restart?t=0"):
        route = decide.route_of("POST", uri)
        assert not isinstance(route, decide.Deny) and not decide.cleared(route)
        verdict = decide.authz_request(route, "POST", uri, None, facts)
        assert verdict == decide.StartCheck("job")


def test_a_delete_by_any_reference_asks_about_the_lease():
    """A name, a short prefix or a full id: dockerd resolved it; the service proves it."""
    for ref in ("decoy", "abc", OWN[:12], OWN):
        uri = f"/v1.41/containers/{ref}?force=1"
        assert outcomes.authz_response("DELETE", uri, 204, None) == outcomes.Forget(ref)
    assert outcomes.authz_response("DELETE", "/containers/x", 404, None) is None
