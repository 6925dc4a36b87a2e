"""A create body as dockerd reads it (allocator/core/api/createbody.py): decoded once for both
sockets, refused where gpu-alloc would read it otherwise."""

from __future__ import annotations

import pytest

from allocator.core.api.createbody import decode_create
from allocator.core.api.gojson import BodyError


def test_a_create_is_decoded_with_its_host_config() -> None:
    spec = decode_create(b'{"Image": "busybox", "HostConfig": {"ShmSize": 1024}}')
    assert spec["Image"] == "busybox"
    assert spec["HostConfig"]["ShmSize"] == 1024


def test_a_body_that_is_no_object_is_refused() -> None:
    with pytest.raises(BodyError, match="expected an object"):
        decode_create(b'["busybox"]')


def test_host_config_fields_at_the_top_level_are_refused_by_name() -> None:
    with pytest.raises(BodyError) as refused:
        decode_create(b'{"Image": "busybox", "Privileged": true, "Binds": ["/dev:/d"]}')
    assert "top-level Binds, Privileged" in str(refused.value)
    assert 'put them inside "HostConfig"' in str(refused.value)


def test_a_mistyped_gpu_alloc_label_is_refused_with_the_label_meant() -> None:
    body = b'{"Image": "busybox", "Labels": {"io.gpu-alloc.requst.model": "H100"}}'
    with pytest.raises(BodyError, match=r"did you mean io\.gpu-alloc\.request\.model\?"):
        decode_create(body)
