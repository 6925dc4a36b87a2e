"""Audit records as data (allocator/core/leases/events.py): fixed keys, the time passed in."""

from __future__ import annotations

import pytest

from allocator.core.leases import events


def test_a_record_has_every_key_and_the_gpus_indices_in_order() -> None:
    got = events.record("grant", 0.25, gpus=("GPU-b", "GPU-a"), indices={"GPU-a": 0, "GPU-b": 1},
                        lease="l1", container="c" * 64, name="train", owner="alice",
                        waited_s=2.5004, pool="a100")  # fmt: skip
    assert got == {
        "time": "1970-01-01T00:00:00.250+00:00",
        "event": "grant",
        "owner": "alice",
        "container": "c" * 64,
        "name": "train",
        "lease": "l1",
        "gpus": ["GPU-b", "GPU-a"],
        "indices": [1, 0],
        "reason": "",
        "waited_s": 2.5,
        "pool": "a100",
    }


def test_a_gpu_the_inventory_does_not_index_has_no_index() -> None:
    assert events.record("release", 0, gpus=["GPU-x"])["indices"] == [None]


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown audit event 'granted'"):
        events.record("granted", 0)


def test_times_round_trip_through_rfc3339() -> None:
    assert events.parse_time(events.rfc3339(1700000000.125)) == 1700000000.125


def test_field_labels_drop_indices_so_metrics_stay_bounded() -> None:
    assert events.field_label("HostConfig.DeviceRequests[3]") == "HostConfig.DeviceRequests"
    assert (
        events.field_label("HostConfig.Binds[0] (volume devs)") == "HostConfig.Binds (volume devs)"
    )
    assert events.field_label("") == "other"
