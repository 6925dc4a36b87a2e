"""allocator.core.timing.notices: which audit records make notices, to whom, saying what; the
webhook bodies and the backoff; and the notify: keys of the config."""

from __future__ import annotations

import pytest
import yaml

from allocator.core.leases import events
from allocator.core.timing import notices
from allocator.core.timing.notices import Choices
from allocator.host.config import ConfigError, parse

CHOICES = Choices(addresses={"alice": "alice.smith@lab.example"}, template="{user}@lab.example")


def record(kind: str, **fields) -> dict:
    base = {"gpus": ("GPU-1",), "indices": {"GPU-1": 1}, "container": "c" * 64, "name": "train",
            "owner": "bob", "lease": "l1"}  # fmt: skip
    return events.record(kind, 1_800_000_000.0, **{**base, **fields})


def test_a_grant_after_a_wait_is_told_with_how_long_and_a_grant_at_once_is_not():
    (n,) = notices.from_record(record("grant", waited_s=754.0), CHOICES)
    assert (n.kind, n.user, n.to) == ("granted", "bob", ("bob@lab.example",))
    assert n.subject == "gpu-alloc: container train was granted its GPUs"
    assert "waited 12m in line and was granted GPU 1" in n.text
    assert notices.from_record(record("grant"), CHOICES) == []


def test_the_checkpoint_signal_is_a_warning_saying_what_to_do():
    why = "sent SIGUSR1 5m before its time limit (label io.gpu-alloc.signal or policy.signal)"
    (n,) = notices.from_record(record("signal", reason=why), CHOICES)
    assert n.kind == "warning" and n.subject == "gpu-alloc: container train will be stopped soon"
    assert n.text.startswith(f"container train was {why}. Save your work now")


@pytest.mark.parametrize(
    ("kind", "then"),
    [("time-limit", "'docker rm' it and create it again"), ("idle-reclaim", "'docker start' it")],
)
def test_a_stop_is_told_with_its_reason_and_what_to_do_next(kind, then):
    (n,) = notices.from_record(record(kind, reason="ran past its time limit of 1h"), CHOICES)
    assert n.kind == "stopped" and n.name == "train" and n.container == "c" * 64
    assert "gpu-alloc stopped container train: ran past its time limit of 1h." in n.text
    assert then in n.text


def test_an_unhealthy_gpu_is_told_to_the_owners_on_it_and_the_operators():
    choices = Choices(template="{user}@lab.example", operators=("ops@lab.example",))
    turned = record("health", reason="GPU unhealthy: Xid 79; it is no longer granted",
                    owner=None, container=None, name="", lease=None)  # fmt: skip
    made = notices.from_record(turned, choices, {"GPU-1": {"bob", "carol"}, "GPU-2": {"dan"}})
    assert [(n.user, n.to) for n in made] == [
        ("bob", ("bob@lab.example",)),
        ("carol", ("carol@lab.example",)),
        ("", ("ops@lab.example",)),
    ]
    assert made[0].subject == "gpu-alloc: GPU 1 turned unhealthy"
    assert "GPU 1 is unhealthy: Xid 79" in made[0].text
    assert "Its leases' owners: bob, carol." in made[2].text
    healthy = record("health", reason="GPU healthy again (was: unhealthy: Xid 79)")
    assert notices.from_record(healthy, choices, {"GPU-1": {"bob"}}) == []


def test_each_user_gets_only_the_kinds_they_chose_at_their_own_address():
    choices = Choices(default=frozenset({"stopped"}), users={"bob": frozenset({"granted"})},
                      addresses={"bob": "b@x.example"})  # fmt: skip
    assert [n.to for n in notices.from_record(record("grant", waited_s=5.0), choices)] == [
        ("b@x.example",)
    ]
    assert notices.from_record(record("time-limit"), choices) == []  # bob chose grants only
    carol = notices.from_record(record("time-limit", owner="carol"), choices)
    assert [(n.user, n.to) for n in carol] == [("carol", ())]  # no address: webhooks only
    assert Choices(template="{user}@x").address("unknown") is None


def test_the_same_record_makes_the_same_id_and_another_another():
    one = notices.from_record(record("time-limit"), CHOICES)[0].id
    assert one == notices.from_record(record("time-limit"), CHOICES)[0].id
    assert one != notices.from_record(record("idle-reclaim"), CHOICES)[0].id


def test_webhook_bodies_for_slack_and_mattermost_teams_and_plain_json():
    (n,) = notices.from_record(record("time-limit", reason="ran past its limit"), CHOICES)
    slack = notices.payload(n, "slack")
    assert slack == {"text": f"*{n.subject}* (bob)\n{n.text}"}
    teams = notices.payload(n, "teams")
    assert (teams["@type"], teams["title"], teams["text"]) == ("MessageCard", n.subject, n.text)
    plain = notices.payload(n, "json")["gpu_alloc_notice"]
    assert notices.Notice.from_json(plain) == n and plain["to"] == ["bob@lab.example"]


def test_a_failing_sink_is_tried_again_later_each_time_up_to_an_hour():
    assert [notices.retry_after(n) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert notices.retry_after(40) == 3600


def test_the_test_notice_goes_to_the_users_address_or_the_operators():
    choices = Choices(template="{user}@lab.example", operators=("ops@lab.example",))
    assert notices.trial("bob", "t", choices).to == ("bob@lab.example",)
    assert notices.trial("", "t", choices).to == ("ops@lab.example",)
    assert notices.trial("bob", "t", Choices()).to == ()


NOTIFY = {
    "webhooks": [{"url": "https://hooks.example/T/1", "format": "slack"}],
    "smtp": {"host": "smtp.lab.example", "port": 587, "starttls": True, "username": "g",
             "password_file": "/etc/gpu-alloc/smtp", "from": "gpu-alloc@lab.example",
             "ca_file": "/etc/gpu-alloc/smtp-ca.pem"},
    "addresses": {"template": "{user}@lab.example", "users": {"alice": "a@x.example"}},
    "events": {"default": ["stopped", "warning"], "users": {"bob": ["granted"]}},
    "operators": ["ops@lab.example"],
}  # fmt: skip


def test_the_config_section_is_read():
    cfg = parse(yaml.safe_dump({"notify": NOTIFY})).notify
    assert cfg.on and cfg.webhooks[0].format == "slack"
    assert cfg.smtp is not None and (cfg.smtp.port, cfg.smtp.starttls) == (587, True)
    assert cfg.smtp.ca_file == "/etc/gpu-alloc/smtp-ca.pem"
    assert cfg.choices.address("alice") == "a@x.example"
    assert cfg.choices.address("carol") == "carol@lab.example"
    assert cfg.choices.wants("bob", "granted") and not cfg.choices.wants("bob", "stopped")
    assert cfg.choices.wants("carol", "warning") and not cfg.choices.wants("carol", "granted")
    assert not parse("{}").notify.on


@pytest.mark.parametrize(
    ("section", "key", "said"),
    [
        ({"webhooks": [{"url": "ftp://x"}]}, "notify.webhooks[0].url", "http:// or https://"),
        ({"webhooks": [{"url": "https://x", "format": "xml"}]}, "notify.webhooks[0].format",
         "slack, teams, json"),
        ({"smtp": {"host": "h"}}, "notify.smtp.from", "required"),
        ({"smtp": {"host": "h", "from": "f", "port": "x"}}, "notify.smtp.port", "TCP port"),
        ({"smtp": {"host": "h", "from": "f", "username": "u"}}, "notify.smtp.password_file",
         "go together"),
        ({"smtp": {"host": "h", "from": "f", "starttls": True, "ca_file": "ca.pem"}},
         "notify.smtp.ca_file", "absolute path"),
        ({"smtp": {"host": "h", "from": "f", "ca_file": "/ca.pem"}}, "notify.smtp.ca_file",
         "set starttls: true"),
        ({"addresses": {"template": "lab.example"}}, "notify.addresses.template", "{user}"),
        ({"events": {"default": ["everything"]}}, "notify.events.default", "a list of"),
        ({"operators": [""]}, "notify.operators", "a list of addresses"),
        ({"mail": {}}, "notify.mail", "unknown key"),
        ({"smtp": {"host": "h", "from": "f", "prot": 25}}, "notify.smtp.prot",
         "did you mean 'notify.smtp.port'?"),
    ],
)  # fmt: skip
def test_a_bad_notify_key_is_refused_naming_it(section, key, said):
    with pytest.raises(ConfigError) as e:
        parse(yaml.safe_dump({"notify": section}))
    assert f"key '{key}'" in str(e.value) and said in str(e.value)


def test_a_time_warning_says_when_the_stop_comes_once_per_share():
    from allocator.core.leases.leases import Lease

    le = Lease("l1", ("GPU-1",), "", "bound", "c" * 64, name="train", owner="bob",
               time_limit=36000.0, started=1_800_000_000.0)  # fmt: skip
    (n,) = notices.time_warning(le, 0.8, CHOICES)
    assert (n.kind, n.user, n.to, n.name) == ("warning", "bob", ("bob@lab.example",), "train")
    assert n.text.startswith(
        "container train has run 80% of its time limit of 10h: gpu-alloc stops it at "
        "2027-01-15T18:00:00Z (2h from the warning). Save your work now"
    )
    assert n.id == notices.time_warning(le, 0.8, CHOICES)[0].id
    assert n.id != notices.time_warning(le, 0.9, CHOICES)[0].id


def test_a_reservation_is_due_to_be_told_15_minutes_before_and_once_begun():
    from allocator.core.timing.reservations import Reservation

    r = Reservation("r1", "alice", ("GPU-1",), start=10_000.0, end=20_000.0, note="deadline")
    assert notices.reservations_due([r], 10_000 - 901) == []
    assert notices.reservations_due([r], 10_000 - 900) == [(r, False)]
    assert notices.reservations_due([r], 10_000) == [(r, True)]
    assert notices.reservations_due([r], 20_000) == []
    soon = notices.reservation(r, False, CHOICES, {"GPU-1": 1}, {"GPU-1": {"bob", "alice"}})
    assert [(n.user, n.kind) for n in soon] == [("alice", "reservation"), ("bob", "reservation")]
    assert soon[0].subject == "gpu-alloc: your reservation of GPU 1 begins soon"
    assert "(reservation r1, deadline). Create with --gpus N" in soon[0].text
    assert "may not start again into that window" in soon[1].text
    begun = notices.reservation(r, True, CHOICES, {"GPU-1": 1}, {})
    assert [n.subject for n in begun] == ["gpu-alloc: your reservation of GPU 1 began"]
    assert begun[0].id != soon[0].id
    group = Reservation("r2", "@ml", ("GPU-1",), start=10_000.0, end=20_000.0)
    assert notices.reservation(group, True, CHOICES, {}, {}) == []  # a group has no address


def test_an_idle_warning_says_when_the_stop_comes_unless_the_gpus_are_used():
    from allocator.core.leases.leases import Lease

    le = Lease("l1", ("GPU-1",), "", "bound", "c" * 64, name="train", owner="bob")
    (n,) = notices.idle_warning(le, 1_800_000_000.0, 7200.0, CHOICES)
    assert (n.kind, n.subject) == ("warning", "gpu-alloc: container train is idle")
    assert n.text == (
        "The GPUs of container train have run no process since 2027-01-15T08:00:00Z: "
        "gpu-alloc stops it at 2027-01-15T10:00:00Z (policy.reclaim_idle_after, 2h) unless "
        "they are used again. Use them, or 'docker rm' it to give them back."
    )
    later = notices.idle_warning(le, 1_800_000_500.0, 7200.0, CHOICES)[0]
    assert later.id != n.id  # another stretch of idleness, another notice
