"""doctor's powers line (allocator/ops/powers_doctor.py): every grant beyond the
allow-list listed, and a SYS_ADMIN grant this host refuses anyway said as a warning."""

from __future__ import annotations

from allocator.host import config as configmod
from allocator.ops import powers_doctor


def check(policy: str, apparmor: bool = False) -> tuple[str, str, str]:
    cfg = configmod.parse(f"policy: {policy}")
    return powers_doctor.check(cfg, lambda: apparmor)


def test_without_grants_the_allow_list_alone_is_ok():
    assert check("{}") == ("ok", "powers: the allow-list alone (policy.powers grants none)", "")


def test_each_grant_is_listed_with_its_holders_and_lease_all_as_everyones():
    status, what, _ = check(
        "{powers: {privileged: {users: [ci]}, pid-host: {groups: [prof]}}, privileged: lease-all}"
    )
    assert status == "ok"
    assert what == (
        "powers: pid-host to @prof; privileged to ci; "
        "privileged to everyone (policy.privileged: lease-all)"
    )


def test_sys_admin_granted_without_apparmor_warns_that_it_is_refused_anyway():
    status, what, fix = check("{powers: {SYS_ADMIN: {users: [ann]}}}")
    assert status == "warn" and "AppArmor is not loaded here" in what
    assert "take SYS_ADMIN out of policy.powers" in fix
    assert check("{powers: {SYS_ADMIN: {users: [ann]}}}", apparmor=True)[0] == "ok"
