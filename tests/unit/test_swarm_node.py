"""A node that gives GPUs to Docker Swarm (the config's ``swarm:`` section).

Its GPUs of ``swarm.gpus`` are swarm's alone (never leased locally), and nvidia is its
default runtime, made safe: a create through the shim that asks for no GPU is pinned to
``NVIDIA_VISIBLE_DEVICES=void``, and the real socket refuses one that is not.
"""

from __future__ import annotations

import pytest

from allocator.core.access import access
from allocator.core.access.facts import EngineView
from allocator.core.judging import verdicts
from allocator.core.judging.decisions import Deny, Facts
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.rules import policy
from allocator.core.rules.policy import Owner, Refusal, Wanted
from allocator.host.config import ConfigError, parse
from allocator.ops.cli import StartupError, check_default_runtime
from tests.support.table_host import TableHost

UUIDS = [f"GPU-0000000{k}-0000-0000-0000-000000000000" for k in range(4)]
INVENTORY = Inventory(tuple(GPU(u, k, minor=k) for k, u in enumerate(UUIDS)))
ALICE = Owner(1000, "alice", ("alice",))
SWARM = f"swarm:\n  kind: gpu\n  gpus: [{UUIDS[2]}, {UUIDS[3]}]\n"
NVIDIA_DEFAULT = EngineView(default_runtime="nvidia", version=(20, 10, 24))


# ------------------------------------------------------------------ the config


def test_the_swarm_section_reads_as_written() -> None:
    cfg = parse(SWARM, "node.yaml")
    assert cfg.swarm.kind == "gpu" and cfg.swarm.gpus == (UUIDS[2], UUIDS[3])
    assert cfg.swarm.variable == "DOCKER_RESOURCE_GPU" and cfg.swarm.configured
    assert cfg.policy.rules.withheld == {UUIDS[2], UUIDS[3]}


def test_no_swarm_section_gives_swarm_nothing() -> None:
    cfg = parse("", "node.yaml")
    assert not cfg.swarm.configured and cfg.policy.rules.withheld == frozenset()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("swarm: {kind: NVIDIA-GPU}", "swarm.kind"),
        ("swarm: {gpus: [0, 1]}", "swarm.gpus"),
        (f"swarm: {{gpus: [{UUIDS[0]}, {UUIDS[0]}]}}", "swarm.gpus"),
        ("swarm: {toolkit_config: config.toml}", "swarm.toolkit_config"),
        ("swarm: {nodes: 3}", "swarm.nodes"),
    ],
)
def test_each_swarm_mistake_names_the_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse(text, "node.yaml")


# ------------------------------------------------------------------ never leased locally


def test_gpus_given_to_swarm_are_never_placed_locally() -> None:
    rules = parse(SWARM, "node.yaml").policy.rules
    scope = policy.eligible(INVENTORY, Wanted(), ALICE, rules)
    assert isinstance(scope, tuple)
    assert [g.uuid for g in scope[0].gpus] == UUIDS[:2]


def test_a_create_naming_a_swarm_gpu_is_refused_saying_so() -> None:
    rules = parse(SWARM, "node.yaml").policy.rules
    refused = policy.eligible(INVENTORY, Wanted(), ALICE, rules, (UUIDS[3],))
    assert isinstance(refused, Refusal) and "given to Docker Swarm" in refused.msg


# ------------------------------------------------------------------ default runtime nvidia


def test_a_swarm_node_accepts_nvidia_as_the_default_runtime() -> None:
    info = {"DefaultRuntime": "nvidia", "Runtimes": {"nvidia": {"path": "/usr/bin/x"}}}
    check_default_runtime(parse(SWARM, "node.yaml"), info)
    with pytest.raises(StartupError, match="swarm"):
        check_default_runtime(parse("", "node.yaml"), info)


def facts() -> Facts:
    return Facts(INVENTORY, NVIDIA_DEFAULT, TableHost())


def test_the_shim_pins_a_plain_create_under_the_nvidia_default() -> None:
    ask = verdicts.shim_ask({"Image": "cuda", "HostConfig": {}}, facts())
    assert not isinstance(ask, Deny) and not ask.required and ask.count == 0


def test_the_real_socket_refuses_a_create_the_image_env_would_decide() -> None:
    refused = verdicts.grants_of_create({"Image": "cuda", "HostConfig": {}}, facts())
    assert not isinstance(refused, Deny) and refused.refused()
    pinned = {"Image": "cuda", "Env": ["NVIDIA_VISIBLE_DEVICES=void"], "HostConfig": {}}
    allowed = verdicts.grants_of_create(pinned, facts())
    assert not isinstance(allowed, Deny) and allowed.none


def test_an_explicit_nvidia_runtime_without_the_variable_stays_refused_in_the_shim() -> None:
    spec = {"Image": "cuda", "HostConfig": {"Runtime": "nvidia"}}
    assert isinstance(verdicts.shim_ask(spec, facts()), Deny)


# ------------------------------------------------------------------ swarm tasks as holders


def task(env: list[str]) -> dict:
    """`docker inspect` of a task container swarm started on this node."""
    labels = {"com.docker.swarm.service.name": "st_train",
              "com.docker.swarm.task.name": "st_train.1.x1y2"}  # fmt: skip
    return {"Name": "/st_train.1.x1y2", "Config": {"Env": env, "Labels": labels},
            "HostConfig": {}, "Mounts": []}  # fmt: skip


def test_a_swarm_task_holds_exactly_the_gpus_swarm_gave_it() -> None:
    env = [f"DOCKER_RESOURCE_GPU={UUIDS[3]},{UUIDS[2]}", "NVIDIA_VISIBLE_DEVICES=void"]
    found = access.of_container(task(env), NVIDIA_DEFAULT, INVENTORY, TableHost())
    assert found.gpus(INVENTORY) == {UUIDS[2], UUIDS[3]}


def test_a_task_holds_what_swarm_appended_after_the_specs_void_pin() -> None:
    """The toolkit reads the env as a map: the last DOCKER_RESOURCE_GPU is the one."""
    env = ["NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU=void",
           f"DOCKER_RESOURCE_GPU={UUIDS[1]}"]  # fmt: skip
    found = access.of_container(task(env), NVIDIA_DEFAULT, INVENTORY, TableHost())
    assert found.gpus(INVENTORY) == {UUIDS[1]} and found.pinned


def test_a_task_without_a_reservation_holds_nothing_under_the_void_pins() -> None:
    env = [f"DOCKER_RESOURCE_GPU={UUIDS[1]}", "NVIDIA_VISIBLE_DEVICES=void",
           "DOCKER_RESOURCE_GPU=void"]  # fmt: skip
    assert access.of_container(task(env), NVIDIA_DEFAULT, INVENTORY, TableHost()).none


def test_a_task_given_an_unknown_device_holds_every_gpu() -> None:
    found = access.of_container(task(["DOCKER_RESOURCE_GPU=7"]), NVIDIA_DEFAULT, INVENTORY,
                                TableHost())  # fmt: skip
    assert found.gpus(INVENTORY) == set(UUIDS)


def test_a_create_setting_the_swarm_variable_is_still_refused() -> None:
    spec = {
        "Image": "cuda",
        "Env": [f"DOCKER_RESOURCE_GPU={UUIDS[0]}", "NVIDIA_VISIBLE_DEVICES=void"],
    }
    refused = verdicts.grants_of_create(spec, facts())
    assert isinstance(refused, Deny) and "DOCKER_RESOURCE_GPU" in refused.msg
