"""``policy.powers`` (allocator/core/rules/power_grants.py): a power outside the allow-list
granted to named owners, counted only where gpu-alloc knows the owner; the config key and
the host facts that answer for it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from allocator.core.access import socket_binds as binds
from allocator.core.access.facts import HOST_POLICY, EngineView, NotAsked
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.judging.service_marks import Signing
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.rules import power_grants
from allocator.core.rules.power_grants import Binders, PowerGrants
from allocator.host import apparmor, config
from allocator.host.filesystem import Host
from tests.support.table_host import TableHost

KEY = b"k" * 32
URI = "/v1.41/containers/create?name=clock"
TIME = PowerGrants({"SYS_TIME": Binders(users=("alice",)), "privileged": Binders(("dee",))})


def test_binders_are_named_users_and_members_of_named_groups():
    named = Binders(users=("alice",), groups=("ops",))
    assert named.allow("alice", ()) and named.allow("carol", ("staff", "ops"))
    assert not named.allow("bob", ("staff",)) and not named.allow("", ("ops",))
    assert not Binders() and named


@dataclass
class GrantingHost(TableHost):
    """A table host whose policy grants alice SYS_TIME, and dee privileged mode."""

    def may_use_power(self, user: str, power: str) -> bool:
        return TIME.allow(power, user, ())


def judge(spec: dict, headers: dict | None = None) -> decide.Decision:
    body = json.dumps(spec).encode()
    facts = decide.Facts(None, EngineView(), GrantingHost())
    route = decide.route_of("POST", URI)
    return decide.authz_request(route, "POST", URI, body, facts,  # type: ignore[arg-type]
                                headers=headers, signing=Signing(KEY))  # fmt: skip


def clock(owner: str = "") -> dict:
    spec: dict = {"Image": "ntp", "HostConfig": {"CapAdd": ["SYS_TIME"]}}
    return binds.labelled_as(spec, owner) if owner else spec


def marked(spec: dict) -> dict[str, str]:
    return {binds.HEADER: binds.mark(KEY, "POST", URI, json.dumps(spec).encode())}


def test_a_grant_names_users_and_groups_per_power():
    grants = PowerGrants({"pid-host": Binders(groups=("ops",)), "SYS_TIME": Binders(("bob",))})
    assert grants.allow("pid-host", "ann", ["ops"]) and not grants.allow("SYS_TIME", "ann", ["ops"])
    assert grants.any_for("bob", ()) and not grants.any_for("eve", ["users"])
    assert grants and not PowerGrants() and not power_grants.NO_GRANTS


def test_a_create_the_shim_labelled_for_a_granted_owner_holds_the_power():
    spec = clock(owner="alice")
    assert judge(spec, marked(spec)) == decide.ALLOW


def test_the_same_create_on_dockerds_own_socket_or_for_another_owner_is_refused():
    plain = judge(clock())
    assert isinstance(plain, decide.Deny) and "policy.powers: {SYS_TIME:" in plain.msg
    bob = clock(owner="bob")
    assert isinstance(judge(bob, marked(bob)), decide.Deny)
    forged = judge(clock(owner="alice"))  # the label without the shim's mark
    assert isinstance(forged, decide.Deny) and binds.LABEL in forged.msg


def test_a_privileged_grant_leases_every_gpu_to_its_owners_create_through_the_shim():
    """Docker-in-Docker for one owner: ``policy.powers.privileged`` is ``policy.privileged:
    lease-all`` for them alone, so their container still holds the whole host."""
    gpus = Inventory((GPU("GPU-a", 0), GPU("GPU-b", 1)))
    facts = decide.Facts(gpus, EngineView(), GrantingHost())
    dind = {"Image": "docker:dind", "HostConfig": {"Privileged": True}}
    every = decide.shim_ask(binds.labelled_as(dind, "dee"), facts)
    assert isinstance(every, Ask) and every.every
    for owner in ("alice", ""):  # another power's holder; nobody by name
        got = decide.shim_ask(binds.labelled_as(dind, owner) if owner else dind, facts)
        assert isinstance(got, decide.Deny) and "policy.powers: {privileged:" in got.msg


def test_a_judgement_without_the_hosts_facts_asks_for_them_before_granting():
    unasked = NotAsked(())
    assert not power_grants.may_use(unasked, "alice", "SYS_TIME")
    assert unasked.needs == HOST_POLICY
    assert not power_grants.may_use(GrantingHost(), "", "SYS_TIME")  # no owner: no grant


def test_the_host_asks_nss_for_a_holders_groups():
    host = Host(power_grants=PowerGrants({"SYS_TIME": Binders(groups=("root",))}))
    assert host.may_use_power("root", "SYS_TIME")
    assert not host.may_use_power("root", "SYS_ADMIN")
    assert not host.may_use_power("no-such-user-ga41p", "SYS_TIME")


def test_apparmor_counts_as_loaded_only_with_the_module_enabled_and_its_securityfs(tmp_path):
    params = tmp_path / "module/apparmor/parameters"
    params.mkdir(parents=True)
    (params / "enabled").write_text("Y\n")
    assert not apparmor.loaded(str(tmp_path))
    (tmp_path / "kernel/security/apparmor").mkdir(parents=True)
    assert apparmor.loaded(str(tmp_path))
    (params / "enabled").write_text("N\n")
    assert not apparmor.loaded(str(tmp_path))


def test_the_policy_key_grants_named_powers():
    cfg = config.parse(
        "policy:\n  powers: {SYS_ADMIN: {users: [a]}, pid-host: {groups: [g]}}\n", "/c"
    )
    rules = cfg.policy.rules
    assert rules.powers.allow("SYS_ADMIN", "a", ()) and rules.powers.allow("pid-host", "x", ["g"])
    assert rules.grants_owners and not config.parse("", "/c").policy.rules.grants_owners


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("powers: [SYS_ADMIN]", "policy.powers"),
        ("powers: {SYS_ADMN: {users: [a]}}", "policy.powers.SYS_ADMN"),
        ("powers: {SYS_ADMIN: [a]}", "policy.powers.SYS_ADMIN"),
        ("powers: {SYS_ADMIN: {users: a}}", "policy.powers.SYS_ADMIN.users"),
        ("powers: {SYS_ADMIN: {owners: [a]}}", "policy.powers.SYS_ADMIN.owners"),
    ],
)
def test_a_bad_policy_key_is_refused_by_name(text, key):
    with pytest.raises(config.ConfigError) as info:
        config.parse(f"policy:\n  {text}\n", "/c")
    assert key in str(info.value)
