"""A reference to a container as dockerd reads it (allocator/core/api/refs.py)."""

from __future__ import annotations

from allocator.core.api import refs

ID = "c10c" + "0" * 60


def test_only_hex_short_of_a_full_id_may_be_read_as_an_id_prefix():
    assert refs.may_be_prefix("c10c") and refs.may_be_prefix("a" * 63)
    assert not refs.may_be_prefix("a" * 64)  # a full id is itself
    assert not refs.may_be_prefix("dind") and not refs.may_be_prefix("ABC")
    assert not refs.may_be_prefix("")


def test_a_reference_may_name_the_container_whose_id_it_is_or_begins():
    assert refs.may_name(ID, ID) and refs.may_name("c10c", ID) and refs.may_name("c", ID)
    assert not refs.may_name("c10d", ID) and not refs.may_name("C10C", ID)
    assert not refs.may_name("0000", ID)  # inside the id, as the Engine's id filter matches
