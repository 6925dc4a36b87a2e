"""What a shim connection asks of its transport: the actions shim/connection.py returns.

Each is a ``(Do, argument)`` pair; shim/splice.py runs them in order.
"""

from __future__ import annotations

import enum
from typing import Any


class Do(enum.Enum):
    """What the transport does for the connection."""

    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    TO_ENGINE = "to engine"  # write these bytes upstream
    TO_CLIENT = "to client"  # write these bytes to the client
    CONNECT = "connect"  # open an upstream connection: then engine_opened (or engine_failed)
    INTERCEPT = "intercept"  # hand this `Intercepted` over: then answered, or passed_on
    SETTLE = "settle"  # `forward`'s answer: a Response, or the exception why there is none
    EOF_TO_ENGINE = "eof to engine"  # half-close upstream (write-EOF)
    EOF_TO_CLIENT = "eof to client"  # half-close the client (write-EOF)
    PIPE = "pipe"  # hijacked: from now on pass each side's bytes to the other as they come
    PAUSE = "pause"  # stop reading the client, for this `Pause` reason
    RESUME = "resume"  # the reason is gone
    GONE = "gone"  # the intercepted request's client went away
    DROP = "drop"  # abort the upstream connection: the next request opens a new one
    CLOSE = "close"  # end both sides
    ABORT = "abort"  # end both sides at once, unsent bytes dropped


Action = tuple[Do, Any]
