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
    """Mail the notice to its addresses through ``smtp``: STARTTLS and login when set.

    With ``starttls`` the login and the mail go only over TLS to a server whose certificate
    ``ca_file`` (else the system's trust store) vouches for, so a server that offers no
    STARTTLS, or an impostor's certificate, never sees the password."""
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = smtp.sender, ", ".join(notice.to), notice.subject
    msg["Message-ID"] = f"<{notice.id}@gpu-alloc>"
    msg.set_content(notice.text + "\n")
    where = f"mail through {smtp.host}:{smtp.port}"
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout) as client:
            if smtp.starttls:
                client.ehlo()
                if not client.has_extn("starttls"):
                    raise SinkError(
                        f"{where}: the server offers no STARTTLS, which notify.smtp.starttls "
                        "asks for; nothing was sent, the login neither"
                    )
                client.starttls(context=ssl.create_default_context(cafile=smtp.ca_file))
            if smtp.username is not None and smtp.password_file is not None:
                password = Path(smtp.password_file).read_text().strip()
                try:
                    client.login(smtp.username, password)
                except smtplib.SMTPAuthenticationError as e:
                    raise SinkError(
                        f"{where}: login as {smtp.username} refused: {_said(e)}"
                    ) from None
            client.send_message(msg)
    except ssl.SSLCertVerificationError as e:
        raise SinkError(
            f"{where}: its certificate is not trusted ({e.verify_message}); "
            "name the CA that signed it in notify.smtp.ca_file"
        ) from None
    except (smtplib.SMTPException, OSError) as e:
        raise SinkError(f"{where}: {_said(e)}") from None


def _said(e: Exception) -> str:
    """An SMTP answer as the server put it (``535 5.7.8 ...``), else the error's text."""
    if isinstance(e, smtplib.SMTPResponseException):
        text = (
            e.smtp_error.decode(errors="replace")
            if isinstance(e.smtp_error, bytes)
            else e.smtp_error
        )
        return f"{e.smtp_code} {text}"
    return str(e)


def _host(url: str) -> str:
    """The URL without its path: a webhook's path is its secret."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"
