"""A service's replicas × GPUs count for its owner, against their policy limit."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.core.api import gojson, labels
from allocator.core.judging import service_limits, services
from allocator.core.rules.policy import Owner, Rules

ALICE = Owner(1001, "alice", ("ml",))
BOB = Owner(1002, "bob")
RULES = Rules(user_limits={"alice": 2}, group_limits={"ml": 1})


def spec(gpus: int = 1, mode: Any = None, owner: Owner | None = None, kind: str = "gpu") -> dict:
    out: dict[str, Any] = {
        "Name": "train",
        "TaskTemplate": {
            "Resources": {
                "Reservations": {
                    "GenericResources": [{"DiscreteResourceSpec": {"Kind": kind, "Value": gpus}}]
                }
            }
        },
    }
    if mode is not None:
        out["Mode"] = mode
    return service_limits.owned(out, owner) if owner else out


def replicas(n: int) -> dict:
    return {"Replicated": {"Replicas": n}}


def test_a_service_holds_its_replicas_times_its_gpus_per_task() -> None:
    assert service_limits.gpus(spec(2, replicas(3)), "gpu", nodes=5) == 6


def test_a_service_without_a_mode_is_one_replica_as_dockerd_makes_it() -> None:
    assert service_limits.gpus(spec(2), "gpu", nodes=5) == 2


@pytest.mark.parametrize(
    "mode",
    [
        '{"Replicated":{"Replicas":1,"replicas":3}}',  # Go takes both, the last: 3
        '{"Replicated":{"Replicas":1},"replicated":{"Replicas":3}}',
        '{"Replicated":{"Replica\u017f":3}}',  # the long s folds to s in Go
        '{"ReplicatedJob":{"MaxConcurrent":1,"maxConcurrent":3}}',
        '{"Replicated":{"Replicas":1},"Replicated":{"Replicas":3}}',
        '{"Replicated":{"Replicas":1.0}}',  # Go refuses a fraction for a uint64
        '{"Replicated":{"Replicas":1e0}}',
        '{"Replicated":{"Replicas":-1}}',
        '{"Replicated":{"Replicas":"3"}}',
    ],
)
def test_a_count_dockerd_could_read_otherwise_is_refused(mode: str) -> None:
    body = '{"Name":"train","Mode":' + mode + "}"
    with pytest.raises(gojson.BodyError):
        services.decode(body.encode())


@pytest.mark.parametrize(
    ("mode", "tasks"),
    [
        ('{"ReplicatedJob":{"MaxConcurrent":3}}', 3),
        ('{"replicated":{"Replicas":4}}', 4),  # docker-py's ServiceMode("replicated")
        ('{"REPLICATED":{"replicas":2}}', 2),
        ('{"replicatedjob":{"maxconcurrent":2,"TotalCompletions":9}}', 2),
        ('{"global":{}}', 5),
    ],
)
def test_a_count_is_read_as_go_reads_its_keys(mode: str, tasks: int) -> None:
    got = services.decode(('{"Name":"t","Mode":' + mode + "}").encode())
    assert service_limits.tasks(got, nodes=5) == tasks


def test_a_global_service_counts_one_task_per_ready_node() -> None:
    assert service_limits.gpus(spec(1, {"Global": {}}), "gpu", nodes=3) == 3
    assert service_limits.is_global(spec(1, {"GlobalJob": {}}))


def test_a_replicated_job_counts_the_tasks_it_runs_at_once() -> None:
    job = {"ReplicatedJob": {"MaxConcurrent": 2, "TotalCompletions": 10}}
    assert service_limits.gpus(spec(1, job), "gpu", nodes=1) == 2
    assert service_limits.gpus(spec(1, {"ReplicatedJob": {}}), "gpu", nodes=1) == 1


def test_only_the_swarm_kind_counts_and_named_resources_count_one_each() -> None:
    assert service_limits.gpus(spec(4, replicas(2), kind="fpga"), "gpu", nodes=1) == 0
    named = spec(0)
    named["TaskTemplate"]["Resources"]["Reservations"]["GenericResources"] += [
        {"NamedResourceSpec": {"Kind": "gpu", "Value": "GPU-1"}},
        {"NamedResourceSpec": {"Kind": "gpu", "Value": "GPU-2"}},
    ]
    assert service_limits.per_task(named, "gpu") == 2


def test_owned_labels_the_spec_with_its_owner_and_drops_a_client_s_own_label() -> None:
    given = {"Name": "x", "Labels": {labels.OWNER: "0:root", labels.POOL: "a", "team": "ml"}}
    got = service_limits.owned(given, ALICE)
    assert got["Labels"] == {labels.OWNER: "1001:alice", "team": "ml"}
    assert service_limits.owner_of(got) == "alice"
    assert service_limits.owner_of(given | {"Labels": {}}) == ""


def test_totals_count_the_owner_s_services_with_the_updated_one_replaced() -> None:
    stored = [
        ("s1", spec(1, replicas(2), ALICE)),
        ("s2", spec(1, replicas(1), ALICE)),
        ("s3", spec(4, replicas(4), BOB)),
        ("s4", spec(1, replicas(9))),  # no owner label: made on dockerd's own socket
    ]
    assert service_limits.totals(stored, "alice", None, spec(1), "gpu", 1) == (3, 4)
    assert service_limits.totals(stored, "alice", "s1", spec(1, replicas(3)), "gpu", 1) == (3, 4)
    # a service of another owner, updated by alice, becomes hers
    assert service_limits.totals(stored, "alice", "s3", spec(1), "gpu", 1) == (3, 4)


def test_a_write_past_the_owner_s_limit_is_refused_naming_the_rule_and_the_count() -> None:
    refused = service_limits.refusal(ALICE, 2, 3, RULES)
    assert refused is not None
    assert "alice may hold 2 GPUs in swarm at once (policy.limits.users.alice)" in refused.msg
    assert "would make 3 (now 2)" in refused.msg
    assert service_limits.refusal(ALICE, 0, 2, RULES) is None


def test_a_write_that_does_not_raise_the_total_passes_even_over_the_limit() -> None:
    assert service_limits.refusal(ALICE, 5, 5, RULES) is None
    assert service_limits.refusal(ALICE, 5, 3, RULES) is None


def test_the_exempt_and_owners_without_a_limit_are_never_refused() -> None:
    assert service_limits.refusal(Owner(0, "root"), 0, 99, RULES) is None
    assert service_limits.refusal(BOB, 0, 99, RULES) is None
