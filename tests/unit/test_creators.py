"""Who created each container the shim made (allocator/host/creators.py)."""

from __future__ import annotations

import json

from allocator.host import creators
from allocator.host.creators import Creators


def test_a_recorded_creator_is_found_and_nothing_else_is(tmp_path):
    book = Creators(tmp_path)
    book.record("c1", 1001, "alice")
    book.record("c2", None, "bob")
    assert book.of("c1") == (1001, "alice")
    assert book.of("c2") == (None, "bob")
    assert book.of("c3") is None
    assert (tmp_path / creators.FILE).stat().st_mode & 0o777 == 0o600


def test_the_oldest_records_go_beyond_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(creators, "KEEP", 2)
    book = Creators(tmp_path)
    for cid in ("a", "b", "c"):
        book.record(cid, 1, "u")
    assert book.of("a") is None and book.of("b") and book.of("c")


def test_an_unreadable_file_names_nobody(tmp_path):
    (tmp_path / creators.FILE).write_text("{not json")
    book = Creators(tmp_path)
    assert book.of("c1") is None
    book.record("c1", 7, "carol")  # and is written anew
    assert book.of("c1") == (7, "carol")


def test_a_destroyed_containers_record_goes(tmp_path):
    book = Creators(tmp_path)
    book.record("c1", 1001, "alice")
    book.record("c2", 1002, "bob")
    book.forget("c1")
    book.forget("c9")  # none: nothing written
    assert book.of("c1") is None and book.of("c2") == (1002, "bob")


def test_the_file_holds_the_records_as_json_writes_them_newest_last(tmp_path):
    book = Creators(tmp_path)
    for cid in ("a", "b", "c"):
        book.record(cid, 1, "u")
    book.record("b", 2, "v")  # again: moved to the end, written whole
    book.record("d", None, "w")
    path = tmp_path / creators.FILE
    want = {"a": [1, "u"], "c": [1, "u"], "b": [2, "v"], "d": [None, "w"]}
    assert path.read_bytes() == json.dumps(want).encode()


def test_a_file_another_process_wrote_is_read_again(tmp_path):
    book = Creators(tmp_path)
    book.record("a", 1, "u")
    other = Creators(tmp_path)
    other.record("b", 2, "v")
    other.forget("a")
    book.record("c", 3, "w")
    assert book.of("a") is None and book.of("b") == (2, "v") and book.of("c") == (3, "w")
    assert json.loads((tmp_path / creators.FILE).read_text()) == {"b": [2, "v"], "c": [3, "w"]}
