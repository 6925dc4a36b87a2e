"""Compose's replacements (allocator/core/judging/compose.py): which container a create replaces,
and when the replacement may start on the GPUs it took over."""

from __future__ import annotations

from allocator.core.judging import compose
from allocator.core.leases.leases import Lease

OLD = "a" * 64
LABELS = {compose.PROJECT: "shop", compose.SERVICE: "trainer"}


def listed(state: str, name: str, **labels: str) -> dict:
    return {"Id": OLD, "Names": [f"/{name}"], "State": state, "Labels": LABELS | labels}


def lease() -> Lease:
    return Lease("l0", ("GPU-0",), "", "bound", OLD, "shop_trainer_1")


def test_compose_v1_replaces_the_stopped_container_it_renamed() -> None:
    renamed = compose.v1_name(OLD, "shop_trainer_1")
    assert renamed == "aaaaaaaaaaaa_shop_trainer_1"
    found = compose.predecessor("shop_trainer_1", LABELS, [listed("exited", renamed)])
    assert found == (OLD, renamed)


def test_compose_v2_names_the_replaced_container_in_a_label() -> None:
    given = LABELS | {compose.REPLACE: OLD}
    running = listed("running", "shop-trainer-1")
    assert compose.predecessor("aaaaaaaaaaaa_shop-trainer-1", given, [running]) == (
        OLD, "shop-trainer-1",
    )  # fmt: skip


def test_another_service_or_a_create_without_compose_labels_replaces_nothing() -> None:
    other = listed("exited", compose.v1_name(OLD, "shop_trainer_1"), **{compose.SERVICE: "web"})
    assert compose.predecessor("shop_trainer_1", LABELS, [other]) is None
    assert compose.predecessor("shop_trainer_1", {}, [listed("exited", "x")]) is None


def test_a_replacement_waits_while_its_predecessor_runs() -> None:
    running = {"Name": "/shop_trainer_1", "State": {"Running": True}}
    why = compose.replacement_refusal("start", {"Name": "/new"}, lease(), running)
    assert why is not None and "still runs on its GPUs" in why


def test_a_replacement_starts_once_compose_v1_stopped_and_renamed_its_predecessor() -> None:
    old_info = {"Name": "/" + compose.v1_name(OLD, "shop_trainer_1"), "State": {}}
    info = {"Name": "/shop_trainer_1"}
    assert compose.replacement_refusal("start", info, lease(), old_info) is None
    assert compose.replacement_refusal("start", info, lease(), None) is None  # gone


def test_a_stopped_predecessor_not_renamed_the_compose_way_must_be_removed() -> None:
    why = compose.replacement_refusal("start", {"Name": "/shop_trainer_1"}, lease(),
                                      {"Name": "/keep", "State": {}})  # fmt: skip
    assert why is not None and "(keep) still exists" in why and "remove that one first" in why
