"""Form values as dockerd reads them (allocator/core/api/goform.py): httputils.BoolValue
over Go's r.FormValue, where a value reading true may only be said true more often here,
never less."""

from __future__ import annotations

import pytest

from allocator.core.api import goform

# (query, BoolValue as dockerd reads it)
SPELLINGS = {
    "absent": ("stream=1", False),
    "1": ("stdin=1", True),
    "true": ("stdin=true", True),
    "any other word": ("stdin=yes", True),
    "0": ("stdin=0", False),
    "FALSE in any case": ("stdin=FaLsE", False),
    "no": ("stdin=no", False),
    "none": ("stdin=none", False),
    "empty": ("stdin=", False),
    "a bare key": ("stdin", False),
    "spaces Go trims, + as a space": ("stdin=+%09none%0A", False),
    "no-break space is Unicode space to Go": ("stdin=%C2%A00", False),
    "\\x1c is no space to Go, though Python strips it": ("stdin=%1C0", True),
    "an encoded key": ("%73tdin=1", True),
    "a key in another case is another key": ("STDIN=1", False),
    "a second value that reads true": ("stdin=0&stdin=1", True),
}


@pytest.mark.parametrize(("query", "expected"), SPELLINGS.values(), ids=SPELLINGS.keys())
def test_bool_value_reads_a_query_as_dockerd_does(query: str, expected: bool) -> None:
    assert goform.bool_value(f"/containers/x/attach?{query}", {}, "stdin") is expected


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "application/x-www-form-urlencoded; charset=utf-8",
        "multipart/form-data; boundary=xyz",
        "Multipart/Form-Data",
        "appl\u0130cation/x-www-form-urlencoded",  # Go lowers a dotted capital I to i
        "text/pl\u0101in",  # no type of Go's that is not ASCII is safe to call not a form
    ],
)
def test_a_body_that_may_hold_form_values_sets_every_key(content_type: str) -> None:
    for name in ("Content-Type", "content-type"):
        assert goform.bool_value("/a?stdin=0", {name: content_type}, "stdin")


def test_a_body_of_another_type_holds_no_form_values() -> None:
    assert not goform.bool_value("/a?stdin=0", {"Content-Type": "application/json"}, "stdin")
    assert not goform.bool_value("/a", None, "stdin")
