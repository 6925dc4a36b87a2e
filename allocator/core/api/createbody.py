"""A create body as dockerd reads it, refused where gpu-alloc would read it otherwise.

Both sockets decode a create here, so the shim's 400 and the plugin's refusal say the
same thing: the old top-level HostConfig shapes, and labels under gpu-alloc's prefix
that it does not know (a typo such as ``io.gpu-alloc.requst.model`` would otherwise
be dropped, and the container placed as if the request had not been made).
"""

from __future__ import annotations

from typing import Any

from allocator.core.api import fields, gojson, labels


def decode_create(body: bytes) -> dict[str, Any]:
    """The create's body decoded as dockerd decodes it; `gojson.BodyError` says why not."""
    spec = gojson.decode(body, fields.CREATE_BODY)
    if not isinstance(spec, dict):
        raise gojson.BodyError("the create body must be a JSON object")
    promoted = sorted(k for k in spec if k in fields.HOST_CONFIG and k not in fields.CONFIG)
    if promoted:
        raise gojson.BodyError(
            f'top-level {", ".join(promoted)}: HostConfig fields outside "HostConfig" are '
            'read differently by different Engine versions; put them inside "HostConfig"'
        )
    unknown = labels.unknown(spec.get("Labels"))
    if unknown:
        raise gojson.BodyError(unknown)
    return spec
