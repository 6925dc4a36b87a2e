"""The adapters' questions of the Engine: a service write counted against its owner's limit
in swarm, from the manager's listing of services (`Lookups.service_over_limit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.core.judging import service_limits
from allocator.core.judging.decisions import ALLOW, Deny
from allocator.core.judging.service_marks import ChargeCheck
from allocator.core.rules.policy import Owner
from allocator.host import config as configmod
from allocator.host.engine import EngineError
from allocator.service.lookups import Lookups
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine

ANN = Owner(1001, "ann")
BEN = Owner(1002, "ben")


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def lookups(tmp_path: Path, fake: FakeEngine) -> Lookups:
    cfg = {"state_dir": str(tmp_path / "state"),
           "gpus": str(sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"limits": {"default": {"gpus": 2}}}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]
    return alloc.lookups


def spec(name: str, gpus: int, mode: dict[str, Any], owner: Owner | None = None) -> dict:
    out = {
        "Name": name,
        "Mode": mode,
        "TaskTemplate": {
            "Resources": {
                "Reservations": {
                    "GenericResources": [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": gpus}}]
                }
            }
        },
    }
    return service_limits.owned(out, owner) if owner else out


def replicas(n: int) -> dict[str, Any]:
    return {"Replicated": {"Replicas": n}}


def test_a_service_that_reserves_no_gpu_asks_the_engine_nothing(lookups, fake) -> None:
    fake.down = True
    assert lookups.service_over_limit(ANN, None, spec("web", 0, replicas(9), ANN)) is None
    assert fake.calls == []


def test_a_create_past_the_owner_s_limit_is_refused_and_another_owner_is_not(lookups, fake) -> None:
    fake.add_service(spec("a", 1, replicas(2), ANN))
    refused = lookups.service_over_limit(ANN, None, spec("b", 1, replicas(1), ANN))
    assert refused is not None and "would make 3 (now 2)" in refused.msg, refused
    assert lookups.service_over_limit(BEN, None, spec("b", 1, replicas(2), BEN)) is None


def test_an_update_replaces_the_service_s_old_count_found_by_name(lookups, fake) -> None:
    fake.add_service(spec("a", 1, replicas(2), ANN))
    assert lookups.service_over_limit(ANN, "a", spec("a", 2, replicas(1), ANN)) is None
    refused = lookups.service_over_limit(ANN, "a", spec("a", 1, replicas(3), ANN))
    assert refused is not None and "policy.limits.default" in refused.msg


def test_a_global_service_counts_the_ready_active_nodes(lookups, fake) -> None:
    fake.add_node()
    fake.add_node(availability="drain")
    fake.add_node(state="down")
    assert lookups.service_over_limit(ANN, None, spec("g", 2, {"Global": {}}, ANN)) is None
    fake.add_node()
    refused = lookups.service_over_limit(ANN, None, spec("g", 2, {"Global": {}}, ANN))
    assert refused is not None and "would make 4" in refused.msg


def test_a_manager_that_cannot_list_services_fails_closed(lookups, fake) -> None:
    fake.down = True
    with pytest.raises(EngineError):
        lookups.service_over_limit(ANN, None, spec("a", 1, replicas(1), ANN))


@pytest.fixture
def charging(tmp_path: Path, fake: FakeEngine) -> Allocator:
    """``swarm.engine_socket_services: {charge: ann}``: services without an owner label
    (made on dockerd's own socket) count for ann."""
    cfg = {"state_dir": str(tmp_path / "state"),
           "gpus": str(sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"limits": {"default": {"gpus": 2}}},
           "swarm": {"engine_socket_services": {"charge": "ann"}}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]


def test_a_charged_owner_counts_the_services_made_on_dockerds_socket(charging, fake) -> None:
    fake.add_service(spec("root-made", 1, replicas(2)))  # no owner label
    refused = charging.lookups.service_over_limit(ANN, None, spec("b", 1, replicas(1), ANN))
    assert refused is not None and "would make 3 (now 2)" in refused.msg, refused
    assert charging.lookups.service_over_limit(BEN, None, spec("b", 1, replicas(2), BEN)) is None


def test_a_service_on_dockerds_socket_is_judged_within_the_charged_owners_limit(
    charging, fake
) -> None:
    fake.add_service(spec("a", 1, replicas(1), ANN))
    assert charging.admission.resolve(ChargeCheck("ann", None, spec("r", 1, replicas(1)))) == ALLOW
    refused = charging.admission.resolve(ChargeCheck("ann", None, spec("r", 1, replicas(2))))
    assert isinstance(refused, Deny) and "would make 3 (now 1)" in refused.msg
    assert "counts for ann" in refused.msg and "engine_socket_services" in refused.msg
