"""One effective-access decision's ground (allocator/core/access/access_ctx.py): how its rows add
grants, refuse, resolve paths and name GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from allocator.core.access.access_ctx import Ctx, View, resolve_ids
from allocator.core.access.facts import EngineView, Unresolvable
from allocator.core.access.grants import Refusal
from allocator.core.machine.inventory import GPU, Inventory
from tests.support.table_host import TableHost

UUIDS = [f"GPU-{k}0000000-0000-0000-0000-000000000000" for k in range(2)]
INVENTORY = Inventory(tuple(GPU(u, k) for k, u in enumerate(UUIDS)))


@dataclass
class CountingHost(TableHost):
    asked: int = 0

    def resolve(self, path: str) -> str:
        if path.startswith("/loop"):
            raise Unresolvable("a link loop")
        return path

    def dynamic_majors(self) -> frozenset[int]:
        self.asked += 1
        return frozenset({511})


def ctx(strict: bool, host: TableHost | None = None) -> Ctx:
    view = View(env=(), env_complete=not strict, host_config={})
    return Ctx(view, EngineView(), INVENTORY, host or TableHost(), strict)


def test_ids_name_gpus_by_uuid_and_index_and_all_is_every_gpu() -> None:
    assert resolve_ids(ctx(True), "f", [UUIDS[0], "1"]) == set(UUIDS)
    assert resolve_ids(ctx(True), "f", ["0", "all"]) is None


def test_a_create_naming_a_gpu_the_host_lacks_is_refused() -> None:
    with pytest.raises(Refusal, match=r"^HostConfig\.DeviceRequests\[0\]: GPU '7'"):
        resolve_ids(ctx(True), "HostConfig.DeviceRequests[0]", ["7"])


def test_a_container_naming_an_unknown_index_holds_every_gpu_and_a_departed_uuid_none() -> None:
    assert resolve_ids(ctx(False), "f", ["7"]) is None
    assert resolve_ids(ctx(False), "f", ["GPU-deadbeef-gone"]) == set()


def test_a_refusal_raises_for_a_create_and_is_an_unpinned_grant_for_a_container() -> None:
    with pytest.raises(Refusal, match=r"^HostConfig\.Devices\[0\]: bad$"):
        ctx(True).refuse("HostConfig.Devices[0]", "bad")
    seen = ctx(False)
    seen.refuse("HostConfig.Devices[0]", "bad")
    (grant,) = seen.grants
    assert (grant.field, grant.gpus, grant.leasable) == ("HostConfig.Devices[0]", None, False)


def test_a_path_that_cannot_be_resolved_is_refused_naming_it() -> None:
    seen = ctx(False, CountingHost())
    assert seen.resolved("HostConfig.Binds[0]", "bind source", "/srv") == "/srv"
    assert seen.resolved("HostConfig.Binds[1]", "bind source", "/loop/x") is None
    assert seen.grants[0].detail == "bind source /loop/x cannot be judged: a link loop"


def test_the_hosts_dynamic_majors_are_asked_once_per_decision() -> None:
    host = CountingHost()
    seen = ctx(False, host)
    assert seen.dynamic_majors() == seen.dynamic_majors() == frozenset({511})
    assert host.asked == 1
