"""Run the shim: the proxy transport with the create interceptor, from a config."""

from __future__ import annotations

from allocator.host import listener
from allocator.host.config import Config
from allocator.service import Allocator
from shim import server
from shim.create import CreateInterceptor


def serve(config: Config, allocator: Allocator, claim: listener.Claim | None = None) -> None:
    server.run(
        config.shim.socket,
        config.engine.socket,
        CreateInterceptor(allocator),
        mode=config.shim.mode,
        group=config.shim.group,
        forward_timeout=config.shim.create_timeout,
        claim=claim,
    )
