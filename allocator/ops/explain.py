"""``gpu-alloc explain`` rendered: the message, or the whole answer as JSON."""

from __future__ import annotations

from typing import Any

from allocator.ops.status import fair_share_line
from allocator.service.views.wire import encode


def render(answer: dict[str, Any], as_json: bool) -> str:
    """The message, with the asker's fair share under it when policy.fair_share is on."""
    if as_json:
        return encode(answer)
    if not answer.get("fair_share"):
        return answer["message"]
    return answer["message"] + "\n" + fair_share_line(answer["fair_share"])
