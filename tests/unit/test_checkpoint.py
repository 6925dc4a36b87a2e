"""allocator.core.timing.checkpoint: which signal a grant gets, and when the timekeeper sends
it before a time limit or idle reclaim; and the policy.signal keys of the config."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from allocator.core.api.signals import Signal
from allocator.core.leases.clock import Now
from allocator.core.leases.leases import Lease, Phase, State
from allocator.core.rules.policy import Owner, Rules
from allocator.core.timing import checkpoint
from allocator.host.config import ConfigError, parse

USR1, TERM, USR2 = Signal("SIGUSR1", 300), Signal("SIGTERM", 60), Signal("SIGUSR2", 600)
RULES = Rules(
    signal_default=USR1,
    signal_pools={"short": TERM},
    signal_users={"alice": TERM},
    signal_groups={"ml": USR2, "ops": TERM},
)
BOB = Owner(1001, "bob", ("ml", "ops"))


def test_the_most_specific_signal_wins_user_then_group_then_pool_then_default():
    alice = Owner(1000, "alice", ("ml",))
    assert checkpoint.policy_signal(RULES, alice, "short") == checkpoint.Chosen(
        TERM, "policy.signal.users.alice"
    )
    chosen = checkpoint.policy_signal(RULES, BOB, "short")
    assert chosen == checkpoint.Chosen(USR2, "policy.signal.groups.ml")  # the earliest
    carol = Owner(1002, "carol")
    assert checkpoint.policy_signal(RULES, carol, "short").rule == "policy.signal.pools.short"
    assert checkpoint.policy_signal(RULES, carol, None).rule == "policy.signal.default"
    assert checkpoint.policy_signal(Rules(), carol, None) is None


def test_the_label_wins_over_the_policy():
    asked = Signal("SIGINT", 5)
    assert checkpoint.signal_for(RULES, BOB, None, asked) == asked
    assert checkpoint.signal_for(RULES, BOB, None, None) == USR2
    assert checkpoint.signal_for(Rules(), BOB, None, None) is None


def lease(**changes) -> Lease:
    base = Lease("a", ("GPU-0",), "", Phase.BOUND.value, "c-a", time_limit=1000.0, started=0.0)
    return replace(base, **{"signal": "SIGUSR1", "signal_lead": 300.0, **changes})


def test_the_signal_before_a_time_limit_is_due_its_lead_before_the_end_once():
    le = lease()
    assert checkpoint.before_limit([le], {"c-a"}, Now(699)) == []
    assert checkpoint.before_limit([le], {"c-a"}, Now(700)) == [le]
    assert checkpoint.before_limit([le], set(), Now(700)) == []  # not running
    assert checkpoint.before_limit([lease(signalled=700.0)], {"c-a"}, Now(800)) == []
    assert (
        checkpoint.before_limit([lease(signalled=10.0)], {"c-a"}, Now(800)) != []
    )  # an idle one's
    assert checkpoint.before_limit([le], {"c-a"}, Now(1000)) == []  # past the end: the stop is due
    assert checkpoint.before_limit([lease(signal="")], {"c-a"}, Now(800)) == []
    assert checkpoint.before_limit([lease(started=None)], {"c-a"}, Now(800)) == []


def test_the_next_look_is_at_the_next_signal():
    assert checkpoint.next_signal([lease()], Now(600)) == 100
    assert checkpoint.next_signal([lease()], Now(800)) == 0
    assert checkpoint.next_signal([lease(signalled=700.0)], Now(800)) is None
    assert checkpoint.next_signal([lease(signal="")], Now(600)) is None


def reclaim_at(le: Lease, now: float, since: float = 100) -> tuple[list, list]:
    """`checkpoint.before_reclaim` for ``le`` idle since ``since`` (wall times alone)."""
    return checkpoint.before_reclaim([(le, now - since)], Now(now), 600)


def test_an_idle_container_is_signalled_before_reclaim_and_stopped_after_its_whole_lead():
    le = lease(time_limit=None)
    assert reclaim_at(le, 399) == ([], [])
    assert reclaim_at(le, 400) == ([le], [])
    warned = replace(le, signalled=400.0)
    assert reclaim_at(warned, 699) == ([], [])
    assert reclaim_at(warned, 700) == ([], [warned])
    late = replace(le, signalled=900.0)  # the shim was down at the signal's time
    assert reclaim_at(late, 1199) == ([], [])
    assert reclaim_at(late, 1200) == ([], [late])


def test_a_new_stretch_of_idleness_gets_a_new_signal():
    used_since = lease(time_limit=None, signalled=400.0)
    assert reclaim_at(used_since, 750, since=450) == ([used_since], [])


def test_without_a_signal_an_idle_container_is_stopped_at_reclaim_time():
    le = lease(signal="", time_limit=None)
    assert reclaim_at(le, 699) == ([], [])
    assert reclaim_at(le, 700) == ([], [le])


def test_the_signal_is_recorded_in_the_lease_and_written_only_when_set():
    st = State()
    plain, _ = st.new_lease(("GPU-0",), 0, 60)
    assert not {"signal", "signal_lead", "signalled"} & set(st.to_json()["leases"][plain.id])
    st.leases[plain.id] = replace(plain, container="c", signal="SIGUSR1", signal_lead=300.0)
    assert st.signalled(plain.id, "c", 42.0, ("b1", 7.0))
    assert not st.signalled(plain.id, "other", 43.0, None)
    written = st.to_json()
    assert "signalled_boot" not in written["leases"][plain.id]  # beside, as the other marks
    assert written["boot"][plain.id]["signalled"] == ["b1", 7.0]
    again = State.from_json(written, "f").leases[plain.id]
    assert (again.signal, again.signal_lead, again.signalled) == ("SIGUSR1", 300.0, 42.0)
    assert again.signalled_boot == ("b1", 7.0)


def test_the_config_keys_are_read_as_signals():
    text = yaml.safe_dump(
        {
            "policy": {
                "pools": {"short": {"gpus": [0]}},
                "signal": {"default": "USR1@5m", "pools": {"short": "TERM"},
                           "users": {"alice": "10@30s"}, "groups": {"ml": "USR2@10m"}},
            }
        }
    )  # fmt: skip
    rules = parse(text).policy.rules
    assert rules.signal_default == USR1
    assert rules.signal_pools == {"short": Signal("SIGTERM", 60)}
    assert rules.signal_users == {"alice": Signal("10", 30)}
    assert rules.signal_groups == {"ml": USR2}
    assert parse("policy: {}").policy.rules.signal_default is None


@pytest.mark.parametrize(
    ("signal", "key", "said"),
    [
        ({"default": "KILL@5m"}, "policy.signal.default", "SIGKILL cannot be caught"),
        ({"users": {"bob": "nope"}}, "policy.signal.users.bob", "does not name a signal"),
        ({"pools": {"nowhere": "USR1"}}, "policy.signal.pools.nowhere", "no pool 'nowhere'"),
        ({"default": ["USR1"]}, "policy.signal.default", "got ['USR1']"),
        ({"dflt": "USR1"}, "policy.signal.dflt", "did you mean 'policy.signal.default'?"),
    ],
)
def test_a_bad_signal_key_is_refused_naming_it(signal, key, said):
    with pytest.raises(ConfigError) as e:
        parse(yaml.safe_dump({"policy": {"signal": signal}}))
    assert f"key '{key}'" in str(e.value) and said in str(e.value)


def test_without_a_signal_the_owner_is_warned_at_80_and_90_percent_of_the_limit():
    plain = lease(signal="", signal_lead=0.0)
    assert checkpoint.time_warnings([plain], {"c-a"}, Now(799)) == []
    assert checkpoint.time_warnings([plain], {"c-a"}, Now(800)) == [(plain, 0.8)]
    assert checkpoint.time_warnings([plain], {"c-a"}, Now(950)) == [(plain, 0.9)]
    assert checkpoint.time_warnings([plain], {"c-a"}, Now(1000)) == []  # the stop is due
    assert checkpoint.time_warnings([plain], set(), Now(900)) == []  # not running
    assert checkpoint.time_warnings([lease()], {"c-a"}, Now(900)) == []  # its signal warns it


def test_without_a_signal_the_owner_is_warned_at_80_percent_of_the_idle_time_once_per_stretch():
    plain = lease(signal="", signal_lead=0.0, time_limit=None)
    assert checkpoint.idle_warnings([(plain, 479)], 600) == []
    assert checkpoint.idle_warnings([(plain, 480)], 600) == [(plain, 480)]
    assert checkpoint.idle_warnings([(plain, 600)], 600) == []  # the stop is due
    assert checkpoint.idle_warnings([(lease(), 480)], 600) == []  # its signal warns it
