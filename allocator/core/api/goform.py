"""A request's form values as dockerd's handlers read them (Go's ``r.FormValue`` under
``httputils.BoolValue``), where a value decides what a call may do: an attach's stdin.

Rules
-----
1. ``r.FormValue(k)`` is the first value of ``k`` in ``r.Form``: the values of a body of
   type ``application/x-www-form-urlencoded`` (POST, PUT, PATCH) or
   ``multipart/form-data`` come before the query's.  No body is read here, so a request
   whose body may hold form values is read as setting every key to true.  Go lower-cases
   the type rune by rune (``İ`` is ``i`` to it, ``i̇`` to Python), so a type that is not
   ASCII is taken to be a form's.
2. ``BoolValue``: true unless the value, trimmed of Unicode white space
   (``strings.TrimSpace``) and lower-cased, is "", "0", "no", "false" or "none".
3. Go's ``url.ParseQuery`` skips a pair it cannot read (a ';', a bad %-escape), where
   Python keeps it; and only the first value counts there.  Here any value that reads
   true makes the answer true: this may say true where dockerd reads false, never the
   other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

_FALSE = frozenset({"", "0", "no", "false", "none"})
# unicode.IsSpace: what strings.TrimSpace trims (Python's str.strip also trims \x1c-\x1f)
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"  # noqa: E501
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def bool_value(uri: str, headers: Mapping[str, Any] | None, key: str) -> bool:
    """Whether dockerd's ``httputils.BoolValue(r, key)`` may read true on this request."""
    if body_may_hold_form(headers):
        return True
    query = uri.partition("?")[2]
    return any(
        v.strip(_GO_SPACE).lower() not in _FALSE
        for k, v in parse_qsl(query, keep_blank_values=True)
        if k == key
    )


def body_may_hold_form(headers: Mapping[str, Any] | None) -> bool:
    """A Content-Type under which Go's ParseForm or ParseMultipartForm may read the body."""
    return any(
        str(k).lower() == "content-type" and _form_type(str(v)) for k, v in (headers or {}).items()
    )


def _form_type(value: str) -> bool:
    return not value.isascii() or any(t in value.lower() for t in _FORM_TYPES)
