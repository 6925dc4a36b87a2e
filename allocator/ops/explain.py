"""``gpu-alloc explain`` rendered: the message, or the whole answer as JSON."""

from __future__ import annotations

from typing import Any

from allocator.views.wire import encode


def render(answer: dict[str, Any], as_json: bool) -> str:
    return encode(answer) if as_json else answer["message"]
