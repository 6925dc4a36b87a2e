"""Mount sources as dockerd stores them (allocator/core/access/access_mounts.py)."""

from __future__ import annotations


def test_a_bind_source_is_read_as_dockerd_cleans_it_before_any_link():
    # dockerd stores /x/link/../../state as /state (Go's path.Clean), then mounts that:
    # walking the link first would judge another directory than the one mounted.
    from allocator.core.access.access_mounts import cleaned

    assert cleaned("/srv/ga/lnk/../state") == "/srv/ga/state"
    assert cleaned("//srv//ga/./state/") == "/srv/ga/state"
    assert cleaned("/tmp/x/link/../../marker") == "/tmp/marker"
