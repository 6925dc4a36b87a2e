"""Strict JSON decoding that refuses every body dockerd could read differently from us.

dockerd decodes request bodies with Go's encoding/json, which differs from Python's json:
object keys match struct fields under Unicode case folding ("hostconfig", "Privileged" with a
Kelvin sign for a K), unknown keys are ignored, a repeated key decodes again into the same
value (scalars: last wins, objects merge), json.Decoder.Decode stops after the first value,
invalid UTF-8 and lone surrogates become U+FFFD. Rather than emulate all that, `decode`
refuses anything on which the two could disagree, and the caller forwards `canonical(obj)`,
the bytes of exactly what it checked. The one emulation: in a `Recased` struct (a part
clients spell in other cases) an ASCII key of another case is read as its field, as Go
reads it, and a field set by two keys is refused. The field tables come from
allocator.fields.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast, overload

from allocator.core.api.fields import INT64, Int, ListOf, MapOf, Opaque, Recased, StrSlice, Struct

MAX_DEPTH = 64
T = TypeVar("T")

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class BodyError(ValueError):
    """The body is refused; the message names the JSON path and what to send instead."""


class Body:
    """A request's body, decoded once however often it is judged: a verdict made on the
    facts at hand and again on the facts read (the plugin's create: up to three times)
    reads the first decoding, or its `BodyError`, again.  One per request; what it
    returns is read, never changed."""

    __slots__ = ("_decoded", "raw")

    def __init__(self, raw: bytes | None):
        self.raw = raw
        self._decoded: dict[object, object] = {}

    @classmethod
    def of(cls, body: bytes | Body | None) -> Body:
        return body if isinstance(body, Body) else cls(body)

    def decoded(self, read: Callable[[bytes], T]) -> T:
        """``read(raw)`` (an empty body for none), the first time it is asked for."""
        if read not in self._decoded:
            try:
                self._decoded[read] = read(self.raw or b"")
            except BodyError as e:
                self._decoded[read] = e
        got = self._decoded[read]
        if isinstance(got, BodyError):
            raise got
        return cast(T, got)

    def as_(self, schema: object) -> object:
        """`decode` against ``schema`` (a module's constant: it is known by its id)."""
        key = ("schema", id(schema))
        if key not in self._decoded:
            self._decoded[key] = _Schema(schema)
        reader = self._decoded[key]
        assert isinstance(reader, _Schema)
        return self.decoded(reader)


class _Schema:
    """`decode` against one schema, as a reader `Body.decoded` keeps apart."""

    __slots__ = ("schema",)

    def __init__(self, schema: object):
        self.schema = schema

    def __call__(self, raw: bytes) -> object:
        return decode(raw, self.schema)


AnyBody = bytes | Body | None  # what a verdict is handed: the bytes, or the body kept


def go_fold(name: str) -> str:
    """Fold a key the way Go matches keys to struct fields, erring towards more matches.

    Go compares under Unicode simple case folding, so besides ASCII case only the Kelvin sign
    (U+212A) and the long s (U+017F) reach ASCII letters. For non-ASCII keys this applies NFKC
    and full case folding, which map those two and more: a key that may fold to a field name
    is refused rather than argued about.
    """
    if name.isascii():
        return name.lower()
    return unicodedata.normalize("NFKC", name).casefold()


def canonical(obj: object) -> bytes:
    """The bytes to forward: compact JSON, UTF-8, keys in their decoded order."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@overload
def decode(body: bytes, schema: Struct) -> dict[str, Any]: ...
@overload
def decode(body: bytes, schema: object) -> object: ...
def decode(body: bytes, schema: object) -> object:
    """Parse `body` strictly and check it against `schema` (a type from allocator.fields).

    Raises BodyError for: bytes that are not UTF-8, an empty body, invalid JSON, data after the
    first value, NaN/Infinity, numbers out of range, nesting deeper than MAX_DEPTH, a key
    repeated in any object, a lone surrogate in a \\u escape, a key that Go would match to a
    field of a modelled struct without being its exact name, and a value of the wrong JSON
    type for its field. Unknown keys and the insides of OPAQUE fields are kept unchecked.
    """
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"byte {exc.start} of the body is not UTF-8: send UTF-8 JSON") from None
    if not text.strip(" \t\r\n"):
        raise BodyError("the body is empty: send a JSON value")
    repeated: list[tuple[dict[str, object], str]] = []

    def pairs_hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    repeated.append((obj, key))
                    break
                seen.add(key)
        return obj

    decoder = json.JSONDecoder(
        object_pairs_hook=pairs_hook, parse_float=_parse_float, parse_constant=_parse_constant
    )
    try:
        obj = decoder.decode(text)
    except BodyError:
        raise
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        if exc.msg == "Extra data":
            raise BodyError(f"{where}: data after the JSON value: send exactly one value") from None
        raise BodyError(f"{where}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise BodyError(f"the JSON is nested too deeply (limit {MAX_DEPTH})") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise BodyError(f"a number cannot be read ({exc}): send a smaller number") from None
    if obj is None:
        raise BodyError("the body is null: send a JSON object")
    if text.count("{") + text.count("[") > MAX_DEPTH:
        _check_depth(obj)
    if repeated:
        target, key = repeated[0]
        path = _path_to(obj, lambda node: node is target)
        assert path is not None  # the hook saw target while decoding obj
        raise BodyError(f"{_at(path)}key {_show(key)} appears more than once: send it once")
    if _SURROGATE_ESCAPE.search(text):
        _check_surrogates(obj)
    try:
        _check(obj, schema)
    except _Mismatch as exc:
        raise BodyError(_at(exc.path[::-1]) + exc.msg) from None
    return obj


class _Mismatch(Exception):
    """Raised inside _check; collects the path segments (innermost first) on its way out."""

    def __init__(self, msg: str, path: list[str | int] | None = None):
        super().__init__(msg)
        self.msg = msg
        self.path = path or []


def _check(value: object, kind: object) -> None:
    """Check `value` against field type `kind`; raise _Mismatch where Go would differ."""
    if value is None:
        return
    if kind is str:
        if type(value) is not str:
            raise _Mismatch(f"expected a string, got {_show(value)}")
    elif kind is bool:
        if type(value) is not bool:
            raise _Mismatch(f"expected true or false, got {_show(value)}")
    elif kind is int or isinstance(kind, Int):
        bounds = kind if isinstance(kind, Int) else INT64
        if type(value) is not int:
            raise _Mismatch(f"expected an integer, got {_show(value)}")
        if not bounds.lo <= value <= bounds.hi:
            raise _Mismatch(f"{value} is out of range for a Go {bounds.name}")
    elif isinstance(kind, Struct):
        if type(value) is not dict:
            raise _Mismatch(f"expected an object, got {_show(value)}")
        _check_struct(value, kind)
    elif isinstance(kind, ListOf):
        if type(value) is not list:
            raise _Mismatch(f"expected an array, got {_show(value)}")
        for i, item in enumerate(value):
            try:
                _check(item, kind.item)
            except _Mismatch as exc:
                exc.path.append(i)
                raise
    elif isinstance(kind, MapOf):
        if type(value) is not dict:
            raise _Mismatch(f"expected an object, got {_show(value)}")
        for key, item in value.items():
            try:
                _check(item, kind.value)
            except _Mismatch as exc:
                exc.path.append(key)
                raise
    elif isinstance(kind, StrSlice):
        if type(value) is list:
            _check(value, ListOf(str))
        elif type(value) is not str:
            raise _Mismatch(f"expected a string or an array of strings, got {_show(value)}")
    elif not isinstance(kind, Opaque):
        raise TypeError(f"not a field type: {kind!r}")


def _check_struct(value: dict[str, object], struct: Struct) -> None:
    folded = None
    recased: dict[str, str] = {}
    for key, item in value.items():
        kind = struct.get(key)
        if kind is None:
            if folded is None:
                folded = _folded(struct)
            name = folded.get(go_fold(key))
            if name is None:
                continue
            if not (isinstance(struct, Recased) and key.isascii()):
                how = "only by letter case" if key.isascii() else "by Unicode folding"
                raise _Mismatch(
                    f"key {_show(key)} differs from {_show(name)} {how}: write {_show(name)}"
                )
            recased[key] = name
            kind = struct[name]
        try:
            _check(item, kind)
        except _Mismatch as exc:
            exc.path.append(key)
            raise
    if recased:
        _recase(value, recased)


def _recase(value: dict[str, object], recased: dict[str, str]) -> None:
    """``value`` with each key of ``recased`` named as its field, as Go reads it; refused
    where two keys set one field (Go reads both, and keeps the last)."""
    names = [recased.get(key, key) for key in value]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        keys = [key for key in value if recased.get(key, key) == twice]
        raise _Mismatch(
            f"keys {' and '.join(map(_show, keys))} both set {_show(twice)}, and dockerd "
            f"reads the last: write {_show(twice)} once"
        )
    renamed = [(recased.get(key, key), item) for key, item in value.items()]
    value.clear()
    value.update(renamed)


_FOLDED: dict[int, tuple[Struct, dict[str, str]]] = {}


def _folded(struct: Struct) -> dict[str, str]:
    """go_fold(name) -> name for a struct's fields, computed once per struct."""
    entry = _FOLDED.get(id(struct))
    if entry is None:
        entry = _FOLDED[id(struct)] = (struct, {go_fold(name): name for name in struct})
    return entry[1]


def _parse_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise BodyError(f"the number {text[:40]} is out of range: send a smaller number")
    return number


def _parse_constant(text: str) -> None:
    raise BodyError(f"{text} is not JSON (dockerd refuses it): send a number or null")


def _children(node: object) -> Iterable[tuple[str | int, object]]:
    if type(node) is dict:
        return node.items()
    if type(node) is list:
        return enumerate(node)
    return ()


def _check_depth(root: object) -> None:
    stack: list[tuple[object, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) in (dict, list):
            if depth > MAX_DEPTH:
                raise BodyError(f"the JSON is nested too deeply (limit {MAX_DEPTH})")
            stack.extend((child, depth + 1) for _, child in _children(node))


def _path_to(root: object, found: Callable[[object], bool]) -> list[str | int] | None:
    """The path of the first node (depth first) for which found(node) holds, or None."""
    stack: list[tuple[object, list[str | int]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if found(node):
            return path
        stack.extend((child, [*path, key]) for key, child in reversed(list(_children(node))))
    return None


def _check_surrogates(root: object) -> None:
    def bad(node: object) -> bool:
        if type(node) is str:
            return bool(_SURROGATE.search(node))
        return type(node) is dict and any(_SURROGATE.search(key) for key in node)

    path = _path_to(root, bad)
    if path is not None:
        raise BodyError(f"{_at(path)}a \\u escape encodes half a surrogate pair: send valid UTF-16")


def _at(path: list[str | int]) -> str:
    """'HostConfig.DeviceRequests[0].Count: ' for a path of keys and indices; '' at the top."""
    text = ""
    for seg in path:
        if isinstance(seg, int):
            text += f"[{seg}]"
        elif _PLAIN_KEY.match(seg):
            text += f".{seg}" if text else seg
        else:
            text += f"[{_show(seg)}]"
    return f"{text}: " if text else ""


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
