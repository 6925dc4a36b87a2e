"""What the Engine's answer to a create or a removal means for the ledger
(allocator/core/leases/outcomes.py): one rule on both sockets."""

from __future__ import annotations

import json

from allocator.core.api import labels
from allocator.core.leases.outcomes import Bind, Forget, Unanswered, authz_response, create_outcome

CID = "c0ffee" + "1" * 58
HEADER = {labels.LEASE_HEADER: labels.lease_header("l1", "tok")}
CREATED = json.dumps({"Id": CID, "Warnings": []}).encode()


def test_a_201_binds_the_lease_to_the_new_container() -> None:
    assert create_outcome("l1", "tok", 201, CREATED) == Bind("l1", CID, "tok")


def test_any_other_answer_proves_nothing_and_leaves_the_lease_to_be_looked_for() -> None:
    assert create_outcome("l1", "tok", 500, None) == Unanswered("l1", "l1", "tok")
    assert create_outcome("l1", "tok", 409, b'{"message": "name in use"}') == Unanswered(
        "l1", "l1", "tok"
    )


def test_a_201_whose_id_cannot_be_read_leaves_the_lease_pending() -> None:
    assert create_outcome("l1", "tok", 201, b"not json") is None
    assert create_outcome("l1", "tok", 201, b'{"Id": ""}') is None


def test_the_plugin_settles_a_leased_create_by_its_header_as_admitted() -> None:
    got = authz_response("POST", "/v1.41/containers/create?name=job", 201, CREATED, HEADER)
    assert got == Bind("l1", CID, "tok", admitted=True)


def test_the_plugin_settles_nothing_for_a_create_without_a_lease_or_another_call() -> None:
    assert authz_response("POST", "/v1.41/containers/create", 201, CREATED, {}) is None
    assert authz_response("POST", "/v1.41/containers/job/start", 204, None, HEADER) is None
    assert authz_response("GET", "/v1.41/containers/json", 200, b"[]", HEADER) is None


def test_a_removal_answered_204_asks_about_the_reference_it_named() -> None:
    assert authz_response("DELETE", "/v1.41/containers/job?force=1", 204, None) == Forget("job")
    assert authz_response("DELETE", "/v1.41/containers/job", 404, None) is None
    assert authz_response("DELETE", "/v1.41/images/busybox", 200, b"[]") is None
