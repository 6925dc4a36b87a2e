"""What a verdict can be and the facts it is made against (allocator/core/judging/decisions.py)."""

from __future__ import annotations

import pytest

from allocator.core.access.facts import EngineView
from allocator.core.judging.decisions import HINT, Facts, context_hint
from allocator.core.machine.inventory import GPU, Inventory, InventoryError
from tests.support.table_host import TableHost

INVENTORY = Inventory((GPU("GPU-0", 0),))


def test_the_hint_names_the_gpu_alloc_socket_for_the_cli_and_compose_v1() -> None:
    hint = context_hint("/srv/ga.sock")
    assert "docker context create gpu-alloc --docker host=unix:///srv/ga.sock" in hint
    assert "DOCKER_HOST=unix:///srv/ga.sock" in hint
    assert "host=unix:///run/gpu-alloc/docker.sock" in HINT


def test_facts_with_an_inventory_grant_from_it() -> None:
    facts = Facts(INVENTORY, EngineView(), TableHost())
    assert facts.known_gpus is INVENTORY
    assert facts.require_inventory() is INVENTORY


def test_facts_without_an_inventory_know_no_gpu_and_refuse_a_grant_saying_why() -> None:
    facts = Facts(None, EngineView(), TableHost(), inventory_error="gpus.yaml: missing")
    assert facts.known_gpus.uuids == frozenset()
    with pytest.raises(InventoryError, match=r"gpus\.yaml: missing"):
        facts.require_inventory()
    with pytest.raises(InventoryError, match="cannot be read"):
        Facts(None, EngineView(), TableHost()).require_inventory()
