"""allocator.fields: the tables keep the shape of moby's structs that decisions rely on."""

from allocator.core.api import fields
from allocator.core.api.fields import ListOf, MapOf, Struct
from allocator.core.api.gojson import go_fold


def all_structs() -> list[Struct]:
    found: dict[int, Struct] = {}
    todo = [value for value in vars(fields).values() if isinstance(value, Struct | ListOf | MapOf)]
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


def test_no_two_fields_of_a_struct_fold_to_the_same_name():
    for struct in all_structs():
        assert len({go_fold(name) for name in struct}) == len(struct), sorted(struct)


def test_every_host_config_field_is_also_promoted_to_the_top_of_the_create_body():
    for name, kind in fields.HOST_CONFIG.items():
        assert fields.CREATE_BODY[name] is kind, name


def test_create_body_holds_config_and_the_inner_host_config():
    assert all(fields.CREATE_BODY[name] is kind for name, kind in fields.CONFIG.items())
    assert fields.CREATE_BODY["HostConfig"] is fields.HOST_CONFIG
    assert not set(fields.CONFIG) & set(fields.HOST_CONFIG)  # else Go would drop both


def test_resources_are_promoted_into_host_config_and_the_update_body():
    for name, kind in fields.RESOURCES.items():
        assert fields.HOST_CONFIG[name] is kind
        assert fields.UPDATE_BODY[name] is kind
    assert fields.UPDATE_BODY["RestartPolicy"] is fields.RESTART_POLICY


def test_json_tag_names_replace_go_field_names():
    for tag, go_name in [("CpuCount", "CPUCount"), ("NanoCpus", "NanoCPUs"), ("Dns", "DNS")]:
        assert tag in fields.HOST_CONFIG
        assert go_name not in fields.HOST_CONFIG


def test_device_granting_fields_are_modelled_not_opaque():
    request = fields.HOST_CONFIG["DeviceRequests"].item
    assert set(request) == {"Driver", "Count", "DeviceIDs", "Capabilities", "Options"}
    assert set(fields.HOST_CONFIG["Devices"].item) == {
        "PathOnHost",
        "PathInContainer",
        "CgroupPermissions",
    }
    for name in ["Privileged", "Runtime", "Binds", "Mounts", "Annotations", "DeviceCgroupRules"]:
        assert not isinstance(fields.HOST_CONFIG[name], fields.Opaque), name
    assert fields.EXEC_BODY["Privileged"] is bool
