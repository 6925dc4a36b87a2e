"""The Engine's error format: what the docker CLI, Compose and the SDK print as they are.

dockerd answers a failed call with ``{"message": "..."}`` and an HTTP status; every
refusal gpu-alloc answers itself (the shim's, the transport's) is built here, so a
user sees gpu-alloc's words exactly where the Engine's own would be.
"""

from __future__ import annotations

import json
from http import HTTPStatus

CONTENT_TYPE = "application/json"


def body(message: str) -> bytes:
    """The body of an Engine error answer."""
    return json.dumps({"message": message}).encode()


def reason(status: int) -> str:
    """The reason phrase for ``status`` ("Forbidden"); "Error" for one HTTP does not name."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def message_of(data: bytes) -> str | None:
    """The message of an Engine error answer; None when ``data`` is not one."""
    try:
        found = json.loads(data)
    except ValueError:
        return None
    message = found.get("message") if isinstance(found, dict) else None
    return message if isinstance(message, str) else None
