"""gpu-alloc's labels and its lease header (allocator/core/api/labels.py): what a create asks by
label,
what a container was leased, and which keys under the prefix are refused."""

from __future__ import annotations

import pytest

from allocator.core.api import labels
from allocator.core.machine.cpus import Resources
from tests.support.sysfs import GIB

LABELS = {
    "nothing asked": ({}, Resources()),
    "cores": ({labels.REQUEST_CPUS: "8"}, Resources(cpus=8)),
    "memory in docker's format": ({labels.REQUEST_MEMORY: "4g"}, Resources(memory=4 * GIB)),
    "strict": (
        {labels.REQUEST_CPUS: "2", labels.REQUEST_TOPOLOGY: "strict"},
        Resources(2, 0, True),
    ),
    "a fraction of cores": ({labels.REQUEST_CPUS: "1.5"}, "expected a whole number"),
    "negative cores": ({labels.REQUEST_CPUS: "-1"}, "expected a whole number"),
    "a bad size": ({labels.REQUEST_MEMORY: "lots"}, "'lots' is not a size"),
    "a bad topology": ({labels.REQUEST_TOPOLOGY: "loose"}, "expected prefer or strict"),
}


@pytest.mark.parametrize(("given", "expected"), LABELS.values(), ids=LABELS.keys())
def test_request_labels(given: dict[str, str], expected: Resources | str) -> None:
    got = labels.resources(given)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got and got.startswith("io.gpu-alloc.request.")
    else:
        assert got == expected


def inspect_of(labels_: dict, **host_config) -> dict:
    return {"Config": {"Labels": labels_}, "HostConfig": host_config}


LEASED = {labels.LEASE: "1a2b3c"}


@pytest.mark.parametrize(
    ("container", "held"),
    [
        (inspect_of({**LEASED, labels.PLACED: "cpus"}, CpusetCpus="2-3"), {"cpus": (2, 3)}),
        (
            inspect_of(
                {**LEASED, labels.PLACED: "cpus,memory"},
                CpusetCpus="0",
                Memory=GIB,
                CpusetMems="1",
            ),
            {"cpus": (0,), "memory": GIB, "mems": (1,)},
        ),
        # an image's label on a container no lease made: nothing
        (inspect_of({labels.PLACED: "cpus,memory"}, CpusetCpus="0-63", Memory=GIB), {}),
        # the shim's own empty label over an image's: nothing
        (inspect_of({**LEASED, labels.PLACED: ""}, CpusetCpus="0-63"), {}),
        # one unreadable value costs only itself
        (
            inspect_of(
                {**LEASED, labels.PLACED: "cpus,memory"},
                CpusetCpus="x",
                Memory=GIB,
                CpusetMems="0",
            ),
            {"memory": GIB, "mems": (0,)},
        ),
        (inspect_of({**LEASED, labels.PLACED: "memory"}, Memory=GIB), {}),  # on no node
    ],
)
def test_an_adopted_container_holds_what_its_placed_label_says(container, held) -> None:
    assert labels.placed_of(container) == held


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
