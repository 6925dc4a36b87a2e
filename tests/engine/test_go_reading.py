"""What dockerd stores is what gpu-alloc judged: a differential test against Go's reader.

dockerd reads a body with Go's encoding/json: keys match fields under simple case folding
(``privileged``, a Kelvin sign for ``K``, a long s for ``s``), a key given twice is read
twice (the last wins; an object given twice is merged), and an integer field refuses
``1.0``, ``1e0`` and ``"1"``.  Each field that decides a grant (a create's Privileged,
Binds, Devices, Env and device requests; a service's replicas, job concurrency and GPU
reservation) is spelt every such way and sent to a real dockerd behind gpu-alloc's
plugin.  Whatever gpu-alloc lets through is inspected: the field dockerd stored must be
the one gpu-alloc read (`createbody.decode_create`, `services.decode`), and whatever it
refuses must leave nothing behind.  The spellings are in `spellings`; each test also
checks that its plain spelling goes through, so that it is never vacuous.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import docker
import pytest

from allocator.core.api import gojson
from allocator.core.api.createbody import decode_create
from allocator.core.judging import services
from tests.support import engine
from tests.support.swarm import KIND, SwarmLab

CHARGE = "ga41charge"  # whom dockerd's own socket's GPU services count for: one GPU
_names = itertools.count()
Path = tuple[str | int, ...]  # keys and list indices from the body's top


def make_swarm_lab() -> SwarmLab:
    return SwarmLab(nodes=1, gpus_per_node=2, gpu_alloc=True,
                    policy={"limits": {"users": {CHARGE: {"gpus": 1}}}},
                    swarm={"engine_socket_services": {"charge": CHARGE}})  # fmt: skip


# ------------------------------------------------------------------ spellings


def _raw(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _object(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{_raw(k)}:{v}" for k, v in pairs) + "}"


def _folded(key: str) -> str:
    """``key`` with the letters Go's simple folding reaches from outside ASCII: the long s
    for ``s`` and the Kelvin sign for ``k``; ``key`` itself where it has neither."""
    return key.replace("s", "\u017f").replace("k", "\u212a").replace("K", "\u212a")


def _leaf_spellings(key: str, plain: str, other: str) -> dict[str, list[tuple[str, str]]]:
    """The pairs one object holds for ``key`` (values as raw JSON), by name."""
    lower, first = key.lower(), key[0].lower() + key[1:]
    found = {
        "plain": [(key, plain)],
        "other": [(key, other)],
        "lower": [(lower, other)],
        "first letter lower": [(first, other)],
        "twice": [(key, plain), (key, other)],
        "twice by case": [(key, plain), (lower, other)],
        "twice by case, reversed": [(lower, other), (key, plain)],
    }
    if _folded(key) != key:
        found["folded"] = [(_folded(key), other)]
        found["twice, folded"] = [(key, plain), (_folded(key), other)]
    return found


def _build(tree: Any, path: Path, leaf: list[tuple[str, str]]) -> str:
    """``tree`` as raw JSON, with the object at ``path`` holding ``leaf`` in place of the
    key that ends ``path``."""
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = [_build(v, rest, leaf) if i == head else _raw(v) for i, v in enumerate(tree)]
        return "[" + ",".join(items) + "]"
    if not rest:
        return _object([(k, _raw(v)) for k, v in tree.items() if k != head] + leaf)
    pairs = [(k, _build(v, rest, leaf) if k == head else _raw(v)) for k, v in tree.items()]
    return _object(pairs)


def spellings(base: Mapping[str, Any], path: Path, plain: Any, other: Any) -> dict[str, str]:
    """Raw bodies: ``base`` with the field at ``path`` spelt each way Go may read apart from
    Python; numbers also in the forms Go refuses for an integer; the field's first object
    given twice (merged by Go)."""
    tree = json.loads(json.dumps(base))
    key = str(path[-1])
    bodies = {
        name: _build(tree, path, pairs)
        for name, pairs in _leaf_spellings(key, _raw(plain), _raw(other)).items()
    }
    if isinstance(other, int) and not isinstance(other, bool):
        for text in (f"{other}.0", f"{other}e0", f"{other}E0", _raw(str(other))):
            bodies[f"number {text}"] = _build(tree, path, [(key, text)])
    low_tree, low_path = _lowered(tree, path)
    bodies["every key lower"] = _build(low_tree, low_path, [(key.lower(), _raw(other))])
    top = str(path[0])
    if len(path) > 1:
        rest = _build(tree[top], path[1:], [(key, _raw(other))])
        first = _build(tree, (top,), [(top, _raw(tree[top]))])
        bodies["object twice"] = first[:-1] + f",{_raw(top)}:{rest}}}"
        bodies["object twice by case"] = first[:-1] + f",{_raw(top.lower())}:{rest}}}"
    return bodies


def _lowered(tree: Any, path: Path) -> tuple[Any, Path]:
    """``tree`` with each key on ``path`` in lower case, and that path."""
    if not path:
        return tree, path
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        inner, low = _lowered(tree[head], rest)
        return [inner if i == head else v for i, v in enumerate(tree)], (head, *low)
    inner, low = _lowered(tree.get(head), rest) if rest else (tree.get(head), ())
    renamed = {
        (k.lower() if k == head else k): (inner if k == head else v) for k, v in tree.items()
    }
    return renamed, (head.lower(), *low)


def _at(tree: Any, path: Path) -> Any:
    for step in path:
        if isinstance(step, int):
            tree = tree[step] if isinstance(tree, list) and len(tree) > step else None
        else:
            tree = tree.get(step) if isinstance(tree, Mapping) else None
    return tree


def _plain(value: Any) -> Any:
    """An unset field, as either side may show it: absent, null, false, 0, empty."""
    return None if value in (None, False, 0, "", [], {}) else value


# ------------------------------------------------------------------ containers

# NVIDIA_VISIBLE_DEVICES=void: a device request that names no GPU reaches none (on Engines
# that still run the hook for one, the env decides).
VOID = "NVIDIA_VISIBLE_DEVICES=void"
BASE_CREATE = {"Image": engine.BUSYBOX_TAG, "Cmd": ["true"], "Env": ["A=1", VOID],
               "HostConfig": {}}  # fmt: skip
REQUEST = {"Driver": "nvidia", "Count": 0, "Capabilities": [["gpu"]]}
CREATE_FIELDS = {
    "Privileged": (("HostConfig", "Privileged"), False, True),
    "Binds": (("HostConfig", "Binds"), ["/srv:/srv"], ["/dev:/dev"]),
    "Devices": (("HostConfig", "Devices"), [],
                [{"PathOnHost": "/dev/nvidia0", "PathInContainer": "/dev/nvidia0",
                  "CgroupPermissions": "rwm"}]),
    "Env": (("Env",), ["A=1", VOID], ["NVIDIA_VISIBLE_DEVICES=all"]),
    "DeviceRequests": (("HostConfig", "DeviceRequests"), [], [REQUEST | {"Count": 1}]),
    "Count": (("HostConfig", "DeviceRequests", 0, "Count"), 0, 1),
    "DeviceIDs": (("HostConfig", "DeviceRequests", 0, "DeviceIDs"), [], ["0"]),
    "Driver": (("HostConfig", "DeviceRequests", 0, "Driver"), "nvidia", "cdi"),
    "Capabilities": (("HostConfig", "DeviceRequests", 0, "Capabilities"), [["gpu"]],
                     [["compute"]]),
}  # fmt: skip
# The request fields are spelt inside a request that reaches no GPU as written.
WITH_REQUEST = {"Count", "DeviceIDs", "Driver", "Capabilities"}


@pytest.fixture
def api(swarm_lab: SwarmLab) -> Iterator[Any]:
    client = engine.engine_api(swarm_lab.sock(1))
    yield client
    client.close()
    swarm_lab.clear()


def _post(api: Any, path: str, raw: str, **params: str) -> Any:
    return api.post(api._url(path), params=params, data=raw.encode(),
                    headers={"Content-Type": "application/json"})  # fmt: skip


@pytest.mark.parametrize("field", CREATE_FIELDS)
def test_a_create_field_is_stored_as_gpu_alloc_read_it(api, field: str) -> None:
    path, plain, other = CREATE_FIELDS[field]
    base = json.loads(json.dumps(BASE_CREATE))
    if field in WITH_REQUEST:
        base["HostConfig"]["DeviceRequests"] = [REQUEST | {path[-1]: plain}]
    admitted = []
    for how, raw in spellings(base, path, plain, other).items():
        name = f"gr{next(_names)}"
        answer = _post(api, "/containers/create", raw, name=name)
        stored = api.get(api._url(f"/containers/{name}/json"))
        if answer.status_code != 201:
            assert stored.status_code == 404, f"{how}: refused ({answer.text}), yet stored"
            continue
        admitted.append(how)
        judged = decode_create(raw.encode())
        got = stored.json()
        assert _plain(_stored_field(got, path)) == _plain(_at(judged, path)), (how, raw)
    assert "plain" in admitted, f"{field}: even its plain spelling was refused"


def _stored_field(inspect: Mapping[str, Any], path: Path) -> Any:
    """The field as inspect shows it: Env under Config, with the image's own after it."""
    if path == ("Env",):
        env = (inspect.get("Config") or {}).get("Env") or []
        return [e for e in env if not e.startswith("PATH=")]
    return _at(inspect, path)


# ------------------------------------------------------------------ services


def _service(name: str, mode: Mapping[str, Any]) -> dict[str, Any]:
    spec = {"Image": engine.BUSYBOX_TAG, "Command": ["sleep", "600"],
            "Env": [services.PIN, services.resource_pin(KIND)]}  # fmt: skip
    gpu = {"DiscreteResourceSpec": {"Kind": KIND, "Value": 1}}
    resources = {"Reservations": {"GenericResources": [gpu]}}
    return {"Name": name, "Mode": dict(mode),
            "TaskTemplate": {"ContainerSpec": spec, "Networks": [{"Target": "host"}],
                             "Resources": resources}}  # fmt: skip


RESERVED = ("TaskTemplate", "Resources", "Reservations", "GenericResources")
SERVICE_FIELDS = {
    "Replicas": ({"Replicated": {"Replicas": 1}}, ("Mode", "Replicated", "Replicas"), 1, 3),
    "MaxConcurrent": ({"ReplicatedJob": {"MaxConcurrent": 1}},
                      ("Mode", "ReplicatedJob", "MaxConcurrent"), 1, 3),
    "GenericResources": ({"Replicated": {"Replicas": 1}}, RESERVED, [],
                         [{"DiscreteResourceSpec": {"Kind": KIND, "Value": 2}}]),
    "Value": ({"Replicated": {"Replicas": 1}}, (*RESERVED, 0, "DiscreteResourceSpec", "Value"),
              1, 2),
    "Kind": ({"Replicated": {"Replicas": 3}}, (*RESERVED, 0, "DiscreteResourceSpec", "Kind"),
             "fpga", KIND),  # three tasks of another kind: no GPU; of the swarm's: three
}  # fmt: skip


@pytest.mark.parametrize("field", SERVICE_FIELDS)
def test_a_service_field_is_stored_as_gpu_alloc_read_it(api, field: str) -> None:
    """On dockerd's own socket, where GPU services count for `CHARGE`, one GPU at most: a
    count read lower than dockerd stores it would pass the limit."""
    mode, path, plain, other = SERVICE_FIELDS[field]
    admitted = []
    for how, raw in spellings(_service("", mode), path, plain, other).items():
        name = f"gr{next(_names)}"
        raw = raw.replace('"Name":""', f'"Name":{_raw(name)}', 1)
        answer = _post(api, "/services/create", raw)
        stored = api.get(api._url(f"/services/{name}"))
        if answer.status_code != 201:
            assert stored.status_code == 404, f"{how}: refused ({answer.text}), yet stored"
            continue
        admitted.append(how)
        judged = services.decode(raw.encode())
        spec = stored.json()["Spec"]
        api.delete(api._url(f"/services/{name}"))
        assert _plain(_at(spec, path)) == _plain(_at(judged, path)), (how, raw)
    assert "plain" in admitted, f"{field}: even its plain spelling was refused"


def test_a_mode_as_docker_py_spells_it_counts_its_replicas(api) -> None:
    """docker-py writes {"replicated": {"Replicas": n}}: read as dockerd reads it, and
    counted against the one GPU `CHARGE` may hold."""
    for replicas, allowed in ((1, True), (3, False)):
        name = f"gr{next(_names)}"
        mode = docker.types.ServiceMode("replicated", replicas=replicas)
        answer = _post(api, "/services/create", json.dumps(_service(name, mode)))
        assert (answer.status_code == 201) == allowed, answer.text
        if allowed:
            stored = api.get(api._url(f"/services/{name}")).json()["Spec"]["Mode"]
            assert stored == {"Replicated": {"Replicas": 1}}
            api.delete(api._url(f"/services/{name}"))
        else:
            assert "would make 3" in answer.text, answer.text


def test_the_spellings_cover_what_go_reads_apart() -> None:
    """The generator itself: each spelling is one JSON text, and the plain one is what
    gpu-alloc reads as written."""
    base = json.loads(json.dumps(BASE_CREATE))
    bodies = spellings(base, ("HostConfig", "Privileged"), False, True)
    assert decode_create(bodies["plain"].encode())["HostConfig"] == {"Privileged": False}
    assert '"HostConfig":{"Privileged":false,"privileged":true}' in bodies["twice by case"]
    assert '"Privileged":true}' in bodies["object twice"].split('"HostConfig":')[2]
    for how in ("lower", "twice", "twice by case", "object twice", "object twice by case"):
        with pytest.raises(gojson.BodyError):
            decode_create(bodies[how].encode())
    count = spellings(base | {"HostConfig": {"DeviceRequests": [REQUEST]}},
                      ("HostConfig", "DeviceRequests", 0, "Count"), 0, 1)  # fmt: skip
    assert {"number 1.0", "number 1e0", 'number "1"'} <= set(count) and "folded" not in count
    caps = spellings(base, ("HostConfig", "Capabilities"), [], [["gpu"]])
    assert '"Capabilitie\u017f":' in caps["folded"]
