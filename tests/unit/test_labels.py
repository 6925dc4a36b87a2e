"""gpu-alloc's labels and its lease header (allocator/core/api/labels.py): which keys under the
prefix are refused, and what a label or the header names."""

from __future__ import annotations

from allocator.core.api import labels


def test_the_profile_label_is_read_before_client_labels_are_stripped() -> None:
    given = {labels.MIG_REQUEST: " 1g.10gb ", "team": "a"}
    assert labels.mig_profile(given) == "1g.10gb"
    assert labels.strip(given) == {"team": "a"}


def test_a_label_far_from_any_known_one_is_listed_without_a_guess():
    why = labels.unknown({"io.gpu-alloc.colour": "red", "app": "x"})
    assert why is not None and "did you mean" not in why
    assert why.startswith("label io.gpu-alloc.colour is not a gpu-alloc label")


def test_the_lease_header_is_read_whatever_the_case_of_its_name() -> None:
    value = labels.lease_header("l1", "secret")
    assert labels.parse_lease_header({"x-gpu-alloc-lease": value}) == ("l1", "secret")
    assert labels.parse_lease_header({labels.LEASE_HEADER: value}) == ("l1", "secret")
    assert labels.parse_lease_header({"User-Agent": "docker"}) == ("", "")
    assert labels.parse_lease_header(None) == ("", "")


def test_a_containers_lease_is_the_id_before_any_token_an_older_label_carried() -> None:
    assert labels.lease_of({labels.LEASE: "l1"}) == "l1"
    assert labels.lease_of({labels.LEASE: "l1.token"}) == "l1"
    assert labels.lease_of({}) == labels.lease_of(None) == ""
