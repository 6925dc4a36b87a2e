"""What ``policy.gpu_defaults`` added to a GPU create (allocator/core/judging/defaults.py), and the
note a start that failed on one of them gets."""

from __future__ import annotations

from allocator.core.api import labels
from allocator.core.judging import defaults

BEFORE = {"HostConfig": {"Ulimits": [{"Name": "nofile", "Soft": 1024, "Hard": 1024}]}}
AFTER = {
    "HostConfig": {
        "ShmSize": 2147483648,
        "Ulimits": [
            {"Name": "nofile", "Soft": 1024, "Hard": 1024},
            {"Name": "memlock", "Soft": -1, "Hard": -1},
        ],
    }
}
LEASED = {labels.LEASE: "l1", labels.DEFAULTS: "shm_size=2147483648,ulimit memlock=-1:-1"}


def test_what_was_added_is_named_and_what_the_user_set_is_not() -> None:
    assert defaults.added(BEFORE, AFTER) == "shm_size=2147483648,ulimit memlock=-1:-1"


def test_nothing_added_is_an_empty_label() -> None:
    assert defaults.added(AFTER, AFTER) == ""


def test_a_start_failing_on_a_limit_gpu_alloc_added_says_so_and_how_to_override() -> None:
    note = defaults.start_note("error setting rlimit type 8: operation not permitted", LEASED)
    assert "gpu-alloc added shm_size=2147483648, ulimit memlock=-1:-1" in note
    assert "--shm-size or --ulimit" in note


def test_other_failures_and_containers_without_a_lease_get_no_note() -> None:
    assert defaults.start_note("exec: no such file", LEASED) == ""
    unleased = {labels.DEFAULTS: LEASED[labels.DEFAULTS]}
    assert defaults.start_note("error setting rlimit", unleased) == ""
    assert defaults.start_note("error setting rlimit", None) == ""
