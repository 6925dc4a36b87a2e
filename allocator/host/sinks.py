"""Where notices are sent: an incoming webhook (an HTTP POST of JSON) and mail over SMTP.

Each send is one try that returns or raises `SinkError` saying what failed; the outbox
(allocator/host/outbox.py) keeps the notice and its worker tries again later.  The
notice's id travels as the webhook's ``Idempotency-Key`` header and in the mail's
``Message-ID``, so a receiver that saw it already can tell.
"""

from __future__ import annotations

import json
import smtplib
import ssl
import urllib.error
import urllib.request
from email.message import EmailMessage
from pathlib import Path

from allocator.core.timing import notices
from allocator.core.timing.notices import Notice
from allocator.host.config_notify import Smtp, Webhook

TIMEOUT = 10.0  # seconds for one webhook POST


class SinkError(Exception):
    """A send that failed: the text says which sink and why."""


def post(hook: Webhook, notice: Notice) -> None:
    """POST the notice to ``hook`` in its format; any 2xx answer is sent."""
    body = json.dumps(notices.payload(notice, hook.format)).encode()
    request = urllib.request.Request(
        hook.url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": notice.id},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            answer.read()
    except urllib.error.HTTPError as e:
        raise SinkError(f"webhook {_host(hook.url)} answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SinkError(f"webhook {_host(hook.url)}: {getattr(e, 'reason', e)}") from None


def mail(smtp: Smtp, notice: Notice) -> None:
    """Mail the notice to its addresses through ``smtp``: STARTTLS and login when set."""
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = smtp.sender, ", ".join(notice.to), notice.subject
    msg["Message-ID"] = f"<{notice.id}@gpu-alloc>"
    msg.set_content(notice.text + "\n")
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout) as client:
            if smtp.starttls:
                client.starttls(context=ssl.create_default_context())
            if smtp.username is not None and smtp.password_file is not None:
                password = Path(smtp.password_file).read_text().strip()
                client.login(smtp.username, password)
            client.send_message(msg)
    except (smtplib.SMTPException, OSError) as e:
        raise SinkError(f"mail through {smtp.host}:{smtp.port}: {e}") from None


def _host(url: str) -> str:
    """The URL without its path: a webhook's path is its secret."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"
