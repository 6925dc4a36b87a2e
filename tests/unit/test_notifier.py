"""Notices end to end on this host: audit records into the outbox, sent by the notifier to
a local webhook receiver and a local SMTP server (aiosmtpd), each once, with the right
owner and text; with a sink down nothing is lost, and the outbox drains once it is back,
also after a restart; mail over STARTTLS with a login to a relay with a throwaway
self-signed certificate, and never the login in clear.  `gpu-alloc notify test` and
doctor's row."""

from __future__ import annotations

import argparse
import email.policy
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from allocator.core.leases import events
from allocator.host.config import Config, parse
from allocator.ops import notify
from allocator.service.notifier import Notifier
from allocator.service.wiring import Allocator
from tests.support import engine as sim

T0 = 1_800_000_000.0


class Webhook(ThreadingHTTPServer):
    """A local incoming webhook: keeps each POST's key and body; answers ``status``."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.status = 200
        self.tried = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler) -> None:  # the server is `self`
                body = handler.rfile.read(int(handler.headers["Content-Length"]))
                self.tried += 1
                if self.status == 200:
                    self.got.append((handler.headers["Idempotency-Key"], json.loads(body)))
                handler.send_response(self.status)
                handler.send_header("Content-Length", "0")
                handler.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hooks/secret"


class Inbox:
    """aiosmtpd's handler: keeps each mail, (recipients, message), and each login tried,
    (user, password, over TLS); `login` is its authenticator, for user g with password pw."""

    def __init__(self) -> None:
        self.mails: list[tuple[list[str], Any]] = []
        self.logins: list[tuple[bytes, bytes, bool]] = []

    def login(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        self.logins.append((data.login, data.password, session.ssl is not None))
        ok = (data.login, data.password) == (b"g", b"pw")
        return AuthResult(success=ok, handled=False)  # not handled: aiosmtpd answers 535

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        mail = message_from_bytes(envelope.content, policy=email.policy.default)
        self.mails.append((envelope.rcpt_tos, mail))
        return "250 OK"


@pytest.fixture
def hook() -> Iterator[Webhook]:
    server = Webhook()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    """A plain SMTP server that takes a login in clear: no STARTTLS."""
    handler, port = Inbox(), free_port()
    server = Controller(handler, hostname="127.0.0.1", port=port, authenticator=handler.login,
                        auth_require_tls=False)  # fmt: skip
    server.start()
    yield handler, port
    server.stop()


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[Inbox, int, Path]]:
    """An SMTP relay as a lab's: STARTTLS before anything, then a login; its certificate
    (the third item) is self-signed, so only a client told to trust it does."""
    cert, key = tmp_path / "relay.pem", tmp_path / "relay.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    handler, port = Inbox(), free_port()
    server = Controller(handler, hostname="127.0.0.1", port=port, authenticator=handler.login,
                        tls_context=tls, require_starttls=True, auth_require_tls=True)  # fmt: skip
    server.start()
    yield handler, port, cert
    server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(
    tmp_path: Path,
    hook: Webhook | None,
    port: int,
    smtp: dict[str, Any] | None = None,
    **extra: Any,
) -> Config:
    """Notices to ``hook`` (None: no webhook) and mail on ``port``, logging in as g with pw;
    ``smtp``: more of notify.smtp's keys."""
    (tmp_path / "smtp-password").write_text("pw\n")
    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)
    notify = {
        "webhooks": [] if hook is None else [{"url": hook.url, "format": "slack"}],
        "smtp": {"host": "127.0.0.1", "port": port, "from": "gpu-alloc@lab.example",
                 "username": "g", "password_file": str(tmp_path / "smtp-password"),
                 **(smtp or {})},
        "addresses": {"template": "{user}@lab.example"},
        "operators": ["ops@lab.example"],
        **extra,
    }  # fmt: skip
    text = yaml.safe_dump(
        {"state_dir": str(tmp_path / "state"), "gpus": str(gpus), "notify": notify}
    )
    return parse(text)


def notifier(cfg: Config) -> Notifier:
    return Allocator(cfg).notifier


def record(kind: str, owner: str = "bob", **fields: Any) -> dict[str, Any]:
    return events.record(kind, T0, gpus=("GPU-1",), indices={"GPU-1": 1}, lease="l1",
                         container="c" * 64, name="train", owner=owner, **fields)  # fmt: skip


EVERY = [
    record("grant", waited_s=90.0),
    record("signal", reason="sent SIGUSR1 5m before its time limit"),
    record("time-limit", reason="ran past its time limit of 1h"),
    record("idle-reclaim", owner="carol", reason="its GPUs ran no process for 2h"),
]


def test_every_notice_arrives_once_at_the_webhook_and_in_the_owners_mail(tmp_path, hook, inbox):
    mails, port = inbox
    n = notifier(config(tmp_path, hook, port))
    for r in EVERY:
        n.heard(r)
        n.heard(r)  # the same record again: the same notice, kept once
    assert len(n.outbox.entries()) == 4
    n.drain(T0)
    n.drain(T0 + 60)  # nothing is sent twice
    assert len(hook.got) == 4 and len({key for key, _ in hook.got}) == 4
    said = {body["text"].partition("\n")[0]: body["text"] for _, body in hook.got}
    granted = said["*gpu-alloc: container train was granted its GPUs* (bob)"]
    assert "waited 1m in line" in granted
    assert "Save your work now" in said["*gpu-alloc: container train will be stopped soon* (bob)"]
    assert "ran past its time limit of 1h" in said["*gpu-alloc: container train was stopped* (bob)"]
    assert "'docker start' it" in said["*gpu-alloc: container train was stopped* (carol)"]
    assert sorted(to[0] for to, _ in mails.mails) == ["bob@lab.example"] * 3 + ["carol@lab.example"]
    [mail] = [m for _, m in mails.mails if "granted" in m["Subject"]]
    assert mail["Subject"] == "gpu-alloc: container train was granted its GPUs"
    assert mail["From"] == "gpu-alloc@lab.example" and mail["To"] == "bob@lab.example"
    assert "waited 1m in line" in mail.get_content()
    assert n.outbox.entries() == []


def test_an_unhealthy_gpu_reaches_its_leases_owner_and_the_operators(tmp_path, hook, inbox):
    mails, port = inbox
    cfg = config(tmp_path, hook, port)
    n = notifier(cfg)
    n.ledger.ensure_dir()
    with n.ledger.transaction() as state:
        lease, _ = state.new_lease(("GPU-1",), T0, 60)
        state.leases[lease.id] = replace(lease, owner="dan")
    n.heard(events.record("health", T0, gpus=("GPU-1",), indices={"GPU-1": 1},
                          reason="GPU unhealthy: Xid 79; it is no longer granted"))  # fmt: skip
    n.drain(T0)
    assert sorted(to[0] for to, _ in mails.mails) == ["dan@lab.example", "ops@lab.example"]
    assert all("GPU 1 turned unhealthy" in body["text"] for _, body in hook.got)


def test_with_a_sink_down_nothing_is_lost_and_it_drains_once_back_even_after_a_restart(
    tmp_path, hook, inbox
):
    mails, port = inbox
    cfg = config(tmp_path, hook, port)
    n = notifier(cfg)
    hook.status = 503
    n.heard(EVERY[2])
    n.heard(EVERY[3])
    assert n.drain(T0) == 5  # the webhook's retry comes first
    assert hook.got == [] and len(mails.mails) == 2  # the mail went; the webhook did not
    assert hook.tried == 1  # a sink that failed is not tried again in the same round
    assert [e.sinks["webhook-0"].failures for e in n.outbox.entries()] == [1, 1]
    entry = n.outbox.entries()[0]
    assert "answered 503" in entry.sinks["webhook-0"].error
    assert "/hooks/secret" not in entry.sinks["webhook-0"].error  # a webhook's path is a secret
    status, what, _ = notify.check(cfg)
    assert status == "warn" and "2 waiting in the outbox" in what and "503" in what
    n.drain(T0 + 1)  # before its backoff: not tried
    assert hook.tried == 1
    hook.status = 200
    again = notifier(cfg)  # the shim restarted
    again.drain(T0 + 6)
    assert len(hook.got) == 2 and len(mails.mails) == 2  # the mail was not sent again
    assert again.outbox.entries() == [] and notify.check(cfg)[0] == "ok"
    again.heard(EVERY[2])  # told again after it was sent: not sent twice
    again.drain(T0 + 7)
    assert len(hook.got) == 2


def test_a_notice_is_mailed_over_starttls_after_a_login_to_a_relay_trusted_by_ca_file(
    tmp_path, relay
):
    mails, port, cert = relay
    n = notifier(config(tmp_path, None, port, smtp={"starttls": True, "ca_file": str(cert)}))
    n.heard(EVERY[2])
    n.drain(T0)
    assert mails.logins == [(b"g", b"pw", True)]  # over TLS
    [(to, mail)] = mails.mails  # the relay answered the mail only once it was kept
    assert to == ["bob@lab.example"] and mail["Subject"] == "gpu-alloc: container train was stopped"
    assert n.outbox.entries() == []


def test_a_wrong_password_is_kept_for_retry_and_its_error_names_the_refusal_not_the_password(
    tmp_path, relay
):
    mails, port, cert = relay
    n = notifier(config(tmp_path, None, port, smtp={"starttls": True, "ca_file": str(cert)}))
    (tmp_path / "smtp-password").write_text("hunter2-wrong\n")
    n.heard(EVERY[2])
    n.drain(T0)
    [entry] = n.outbox.entries()
    error = entry.sinks["mail"].error
    assert entry.sinks["mail"].failures == 1 and mails.mails == []
    assert error.startswith(f"mail through 127.0.0.1:{port}: login as g refused: 535 ")
    assert "hunter2" not in error
    (tmp_path / "smtp-password").write_text("pw\n")  # the operator fixes it
    n.drain(T0 + 6)  # after the first backoff
    assert [to for to, _ in mails.mails] == [["bob@lab.example"]]
    assert n.outbox.entries() == []


def test_without_ca_file_the_relays_self_signed_certificate_is_refused_before_the_login(
    tmp_path, relay
):
    mails, port, _ = relay
    n = notifier(config(tmp_path, None, port, smtp={"starttls": True}))
    n.heard(EVERY[2])
    n.drain(T0)
    [entry] = n.outbox.entries()
    error = entry.sinks["mail"].error
    assert "certificate is not trusted (self-signed certificate)" in error
    assert "notify.smtp.ca_file" in error
    assert mails.logins == [] and mails.mails == []


def test_a_server_without_starttls_is_refused_when_asked_for_and_never_sees_the_login(
    tmp_path, inbox
):
    mails, port = inbox  # it would take a login in clear
    n = notifier(config(tmp_path, None, port, smtp={"starttls": True}))
    n.heard(EVERY[2])
    n.drain(T0)
    [entry] = n.outbox.entries()
    assert "the server offers no STARTTLS, which notify.smtp.starttls asks for" in (
        entry.sinks["mail"].error
    )
    assert mails.logins == [] and mails.mails == []


def test_a_user_without_an_address_is_told_on_the_webhook_alone(tmp_path, hook, inbox):
    mails, port = inbox
    cfg = config(tmp_path, hook, port, addresses={"users": {"bob": "bob@x.example"}})
    n = notifier(cfg)
    n.heard(record("time-limit", owner="erin"))
    n.drain(T0)
    assert len(hook.got) == 1 and mails.mails == []


def test_notify_test_sends_through_each_sink_and_says_what_each_answered(
    tmp_path, hook, inbox, capsys
):
    mails, port = inbox
    cfg = config(tmp_path, hook, port)
    assert notify.cmd_notify(cfg, argparse.Namespace(user="bob")) == 0
    assert capsys.readouterr().out == "webhook-0: sent\nmail: sent\n"
    assert [to for to, _ in mails.mails] == [["bob@lab.example"]]
    assert "A test notice from gpu-alloc for bob" in hook.got[0][1]["text"]
    hook.status = 500
    assert notify.cmd_notify(cfg, argparse.Namespace(user="")) == 1
    out = capsys.readouterr().out
    assert "webhook-0: FAILED: webhook http://127.0.0.1:" in out and "answered 500" in out
    assert "mail: sent" in out and mails.mails[-1][0] == ["ops@lab.example"]
    assert notifier(cfg).outbox.entries() == []


def test_without_a_sink_no_notice_is_made_and_doctor_says_off(tmp_path):
    cfg = parse(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "gpus": "/nonexistent"}))
    n = notifier(cfg)
    n.heard(EVERY[2])
    assert n.outbox.entries() == []
    assert notify.check(cfg) == ("ok", "notices: off (no notify.webhooks or notify.smtp)", "")


def test_a_reservation_is_told_to_its_holder_before_it_begins_and_as_it_begins_once_each(
    tmp_path, hook, inbox
):
    mails, port = inbox
    n = notifier(config(tmp_path, hook, port))
    n.ledger.ensure_dir()
    gpu = n.gather.inventory().gpus[1]
    with n.ledger.transaction() as state:  # erin's container holds the GPU before the window
        lease, _ = state.new_lease((gpu.uuid,), T0, 60)
        state.leases[lease.id] = replace(lease, owner="erin")
    start = time.time() + 600  # within SOON (15 min) of now: about to begin
    made = n.reservations.reserve("alice", (start, start + 3600), gpus=("1",), note="deadline")
    assert not isinstance(made, str), made
    n.drain(start - 600)
    n.drain(start - 590)  # made again: kept once
    n.drain(start + 1)  # begun
    told = sorted((to[0], m["Subject"]) for to, m in mails.mails)
    assert told == [
        ("alice@lab.example", "gpu-alloc: your reservation of GPU 1 began"),
        ("alice@lab.example", "gpu-alloc: your reservation of GPU 1 begins soon"),
        ("erin@lab.example", f"gpu-alloc: GPU 1 is reserved for alice {window(start)}"),
        ("erin@lab.example", f"gpu-alloc: GPU 1 is reserved for alice {window(start)}"),
    ]
    assert len(hook.got) == 4
    erin = next(m for to, m in mails.mails if to == ["erin@lab.example"])
    assert "may not start again into that window" in erin.get_content()


def window(start: float) -> str:
    return f"from {events.rfc3339(start)[:16]}Z to {events.rfc3339(start + 3600)[:16]}Z"
