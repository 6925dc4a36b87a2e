"""The Engine's error format (allocator/core/api/errors.py): what the docker CLI, Compose and
the SDK print as they are."""

from __future__ import annotations

import json

from allocator.core.api import errors


def test_an_error_body_is_the_engines_message_object() -> None:
    assert json.loads(errors.body("no GPU free")) == {"message": "no GPU free"}
    assert errors.CONTENT_TYPE == "application/json"


def test_the_message_of_an_error_body_is_read_back() -> None:
    assert errors.message_of(errors.body("gpu-alloc: refused")) == "gpu-alloc: refused"


def test_what_is_no_engine_error_has_no_message() -> None:
    assert errors.message_of(b"not json") is None
    assert errors.message_of(b'["message"]') is None
    assert errors.message_of(b'{"message": 3}') is None
    assert errors.message_of(b'{"Err": "a plugin error"}') is None


def test_the_reason_phrase_is_http_s_and_error_for_a_status_it_does_not_name() -> None:
    assert errors.reason(403) == "Forbidden"
    assert errors.reason(409) == "Conflict"
    assert errors.reason(599) == "Error"
