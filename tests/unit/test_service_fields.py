"""allocator.core.api.service_fields: the ServiceSpec tables keep the shape of moby's structs."""

import pytest

from allocator.core.api import gojson, service_fields
from allocator.core.api.fields import ListOf, MapOf, Struct
from allocator.core.api.gojson import go_fold


def structs_of(root: Struct) -> list[Struct]:
    found: dict[int, Struct] = {}
    todo: list[object] = [root]
    while todo:
        kind = todo.pop()
        if isinstance(kind, ListOf):
            todo.append(kind.item)
        elif isinstance(kind, MapOf):
            todo.append(kind.value)
        elif isinstance(kind, Struct) and id(kind) not in found:
            found[id(kind)] = kind
            todo.extend(kind.values())
    return list(found.values())


def test_no_two_fields_of_a_spec_struct_fold_to_the_same_name() -> None:
    for struct in structs_of(service_fields.SERVICE_SPEC):
        assert len({go_fold(name) for name in struct}) == len(struct), sorted(struct)


def test_the_device_relevant_container_spec_fields_are_known() -> None:
    for name in ("Env", "Mounts", "Privileges", "CapabilityAdd", "Sysctls", "Isolation"):
        assert name in service_fields.CONTAINER_SPEC_KEYS
    for name in ("ContainerSpec", "PluginSpec", "Resources", "Runtime"):
        assert name in service_fields.TASK_SPEC_KEYS


def test_a_generic_resource_reservation_decodes_field_by_field() -> None:
    body = (
        b'{"TaskTemplate":{"Resources":{"Reservations":{"GenericResources":'
        b'[{"DiscreteResourceSpec":{"Kind":"gpu","Value":2}}]}}}}'
    )
    spec = gojson.decode(body, service_fields.SERVICE_SPEC) or {}
    reserved = spec["TaskTemplate"]["Resources"]["Reservations"]["GenericResources"]
    assert reserved == [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": 2}}]


def test_a_count_that_is_no_integer_is_refused_like_dockerd() -> None:
    body = (
        b'{"TaskTemplate":{"Resources":{"Reservations":{"GenericResources":'
        b'[{"DiscreteResourceSpec":{"Kind":"gpu","Value":"2"}}]}}}}'
    )
    with pytest.raises(gojson.BodyError):
        gojson.decode(body, service_fields.SERVICE_SPEC)
