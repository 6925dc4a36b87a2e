"""The ``notify:`` section of the config: where notices go (allocator/core/timing/notices.py).

::

    notify:
      webhooks:                       # each gets every notice
        - {url: https://hooks.slack.com/services/..., format: slack}  # or teams, json
      smtp:                           # mail to each owner's address
        host: smtp.lab.example
        port: 587                     # default 25
        starttls: true                # default false (a local relay)
        ca_file: /etc/gpu-alloc/smtp-ca.pem  # trust this CA for the relay (default: the system's)
        username: gpu-alloc           # with password_file: login after STARTTLS
        password_file: /etc/gpu-alloc/smtp-password
        from: gpu-alloc@lab.example
      addresses:
        template: "{user}@lab.example"
        users: {alice: alice.smith@lab.example}
      events:                         # which notices each user wants (unset: all)
        default: [granted, warning, stopped, reservation, unhealthy]
        users: {bob: [stopped]}
      operators: [gpu-admins@lab.example]  # told of every GPU turning unhealthy

A password is read from its file when a mail is sent, never kept in the config; so is
``ca_file``, for a relay whose certificate no CA in the system's trust store signed.  The
section is read at the shim's start (a change waits for a restart, as the log says).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocator.core.api import numbers
from allocator.core.timing import notices
from allocator.host import config_keys

KEYS: dict[str, type | tuple[type, ...]] = {
    "webhooks": (list, type(None)),
    "smtp": (dict, type(None)),
    "addresses": (dict, type(None)),
    "events": (dict, type(None)),
    "operators": (list, type(None)),
}
_SMTP = ("host", "port", "starttls", "ca_file", "username", "password_file", "from", "timeout")


@dataclass(frozen=True)
class Webhook:
    url: str
    format: str = "json"


@dataclass(frozen=True)
class Smtp:
    host: str
    sender: str
    port: int = 25
    starttls: bool = False
    username: str | None = None
    password_file: str | None = None
    timeout: float = 10.0
    ca_file: str | None = None


@dataclass(frozen=True)
class NotifyConfig:
    webhooks: tuple[Webhook, ...] = ()
    smtp: Smtp | None = None
    choices: notices.Choices = field(default_factory=notices.Choices)

    @property
    def on(self) -> bool:
        """Whether any sink is set: with none, no notice is made at all."""
        return bool(self.webhooks or self.smtp)


def parse(raw: dict[str, Any]) -> NotifyConfig | tuple[str, str]:
    """The section, or (dotted key, why) for the first bad value."""
    try:
        return NotifyConfig(
            tuple(
                _webhook(f"notify.webhooks[{i}]", w)
                for i, w in enumerate(raw.get("webhooks") or ())
            ),
            None if raw.get("smtp") is None else _smtp(raw["smtp"]),
            _choices(raw),
        )
    except _Bad as e:
        return e.key, e.why


class _Bad(ValueError):
    def __init__(self, key: str, why: str) -> None:
        super().__init__(key, why)
        self.key, self.why = key, why


def _webhook(key: str, value: Any) -> Webhook:
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        raise _Bad(key, "expected {url: https://..., format: slack|teams|json}")
    unknown = sorted(set(value) - {"url", "format"})
    if unknown:
        dotted = f"{key}.{unknown[0]}"
        raise _Bad(dotted, config_keys.unknown(dotted, ("url", "format")))
    if not value["url"].startswith(("http://", "https://")):
        raise _Bad(f"{key}.url", f"expected an http:// or https:// URL, got '{value['url'][:60]}'")
    fmt = value.get("format", "json")
    if fmt not in notices.FORMATS:
        raise _Bad(f"{key}.format", f"must be one of {', '.join(notices.FORMATS)}")
    return Webhook(value["url"], fmt)


def _smtp(value: dict[str, Any]) -> Smtp:
    for k in value:
        if k not in _SMTP:
            raise _Bad(f"notify.smtp.{k}", config_keys.unknown(f"notify.smtp.{k}", _SMTP))
    for k in ("host", "from"):
        if not isinstance(value.get(k), str) or not value[k]:
            raise _Bad(
                f"notify.smtp.{k}", "required: " + ("a host name" if k == "host" else "an address")
            )
    try:
        port = int(numbers.read(value.get("port", 25), numbers.PORT))
    except numbers.BadNumber as e:
        raise _Bad("notify.smtp.port", str(e)) from None
    if not isinstance(value.get("starttls", False), bool):
        raise _Bad("notify.smtp.starttls", "expected true or false")
    username, password_file = value.get("username"), value.get("password_file")
    if (username is None) != (password_file is None):
        raise _Bad("notify.smtp.password_file", "username and password_file go together")
    if password_file is not None and not str(password_file).startswith("/"):
        raise _Bad("notify.smtp.password_file", f"must be an absolute path, got '{password_file}'")
    ca_file = value.get("ca_file")
    if ca_file is not None and not str(ca_file).startswith("/"):
        raise _Bad("notify.smtp.ca_file", f"must be an absolute path, got '{ca_file}'")
    if ca_file is not None and value.get("starttls") is not True:
        raise _Bad("notify.smtp.ca_file", "is the CA for STARTTLS: set starttls: true as well")
    timeout = value.get("timeout", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise _Bad("notify.smtp.timeout", "must be a number of seconds greater than zero")
    return Smtp(
        value["host"], value["from"], port, value.get("starttls", False),
        None if username is None else str(username),
        None if password_file is None else str(password_file), float(timeout),
        None if ca_file is None else str(ca_file),
    )  # fmt: skip


def _choices(raw: dict[str, Any]) -> notices.Choices:
    addresses = _keys("notify.addresses", raw.get("addresses") or {}, ("template", "users"))
    template = addresses.get("template")
    if template is not None and (not isinstance(template, str) or "{user}" not in template):
        raise _Bad(
            "notify.addresses.template", "expected a text with {user}, such as {user}@lab.example"
        )
    users = _keys("notify.addresses.users", addresses.get("users") or {}, None)
    events = _keys("notify.events", raw.get("events") or {}, ("default", "users"))
    wanted = _keys("notify.events.users", events.get("users") or {}, None)
    operators = raw.get("operators") or []
    if not all(isinstance(a, str) and a for a in operators):
        raise _Bad("notify.operators", "expected a list of addresses")
    return notices.Choices(
        notices.Choices.default
        if events.get("default") is None
        else _kinds("notify.events.default", events["default"]),
        {str(u): _kinds(f"notify.events.users.{u}", v) for u, v in wanted.items()},
        {str(u): _address(f"notify.addresses.users.{u}", a) for u, a in users.items()},
        template,
        tuple(operators),
    )


def _keys(key: str, value: Any, known: tuple[str, ...] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(key, "must be a mapping")
    for k in value:
        if known is not None and k not in known:
            raise _Bad(f"{key}.{k}", config_keys.unknown(f"{key}.{k}", known))
    return value


def _kinds(key: str, value: Any) -> frozenset[str]:
    kinds = [k for k in notices.KINDS if k != "test"]
    if not isinstance(value, list) or not all(v in kinds for v in value):
        raise _Bad(key, f"expected a list of {', '.join(kinds)}, got {value!r}")
    return frozenset(value)


def _address(key: str, value: Any) -> str:
    if not isinstance(value, str) or "@" not in value:
        raise _Bad(key, f"expected an e-mail address, got {value!r}")
    return value
