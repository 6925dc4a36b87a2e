"""allocator.gojson: refuse every body that dockerd (Go encoding/json) could read differently."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.core.api import fields
from allocator.core.api.gojson import MAX_DEPTH, BodyError, canonical, decode, go_fold

# A `docker run --gpus 1 x` create body, as the docker CLI writes it.
CLI_BODY = (
    b'{"Image":"x","Env":null,"HostConfig":{"DeviceRequests":[{"Driver":"","Count":1,'
    b'"DeviceIDs":null,"Capabilities":[["gpu"]],"Options":{}}]}}'
)
CLI_OBJ = json.loads(CLI_BODY)


def create(text: str) -> object:
    return decode(text.encode(), fields.CREATE_BODY)


def refused(text: str, schema: object = fields.CREATE_BODY) -> str:
    with pytest.raises(BodyError) as info:
        decode(text.encode() if isinstance(text, str) else text, schema)
    return str(info.value)


# --- what is accepted, and as what ------------------------------------------------------------

ACCEPTED = {
    "the docker CLI's GPU create body": (CLI_BODY.decode(), CLI_OBJ),
    "unknown keys are kept, as dockerd ignores them": (
        '{"Image":"x","FutureField":{"a":1},"HostConfig":{"NewThing":[1]}}',
        {"Image": "x", "FutureField": {"a": 1}, "HostConfig": {"NewThing": [1]}},
    ),
    "null where Go wants a scalar, slice, map or struct": (
        '{"Image":null,"HostConfig":{"Privileged":null,"DeviceRequests":[null,{"Count":null}]}}',
        {
            "Image": None,
            "HostConfig": {"Privileged": None, "DeviceRequests": [None, {"Count": None}]},
        },
    ),
    "an escaped key that is the exact field name": (
        '{"Host\\u0043onfig":{"Privileged":true}}',
        {"HostConfig": {"Privileged": True}},
    ),
    "map keys are data: any case, no folding": (
        '{"Labels":{"Foo":"1","foo":"2"},"HostConfig":{"DeviceRequests":[{"Options":{"a":"1","A":"2"}}]}}',
        {
            "Labels": {"Foo": "1", "foo": "2"},
            "HostConfig": {"DeviceRequests": [{"Options": {"a": "1", "A": "2"}}]},
        },
    ),
    "StrSlice fields take a plain string": (
        '{"Cmd":"ls","HostConfig":{"CapAdd":"ALL"}}',
        {"Cmd": "ls", "HostConfig": {"CapAdd": "ALL"}},
    ),
    "json tag names, not Go field names, are canonical": (
        '{"HostConfig":{"CpuCount":1,"NanoCpus":2,"Dns":["1.1.1.1"]}}',
        {"HostConfig": {"CpuCount": 1, "NanoCpus": 2, "Dns": ["1.1.1.1"]}},
    ),
    "HostConfig fields promoted to the top level (Engines up to 26)": (
        '{"Image":"x","Privileged":true,"DeviceRequests":[{"Count":-1}]}',
        {"Image": "x", "Privileged": True, "DeviceRequests": [{"Count": -1}]},
    ),
    "the insides of OPAQUE fields are not examined": (
        '{"NetworkingConfig":{"endpointsconfig":{"n":{"x":1}}},"Healthcheck":{"test":"x"}}',
        {"NetworkingConfig": {"endpointsconfig": {"n": {"x": 1}}}, "Healthcheck": {"test": "x"}},
    ),
    "trailing whitespace": (' {"Image":"x"} \r\n\t', {"Image": "x"}),
    "a surrogate pair escape": ('{"Image":"\\ud83d\\ude00"}', {"Image": "\U0001f600"}),
    "int64 extremes": (
        '{"Memory":-9223372036854775808,"ShmSize":9223372036854775807}',
        {"Memory": -(2**63), "ShmSize": 2**63 - 1},
    ),
    "nesting of exactly MAX_DEPTH": (
        '{"X":' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}",
        {"X": json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))},
    ),
}


@pytest.mark.parametrize("text, expected", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_bodies_decode_as_json_does(text, expected):
    assert create(text) == expected


# --- what is refused, and the message that says why ------------------------------------------

REFUSED = {
    "a key differing by case": (
        '{"hostconfig":{"Privileged":true}}',
        'key "hostconfig" differs from "HostConfig" only by letter case: write "HostConfig"',
    ),
    "a nested key differing by case": (
        '{"HostConfig":{"DeviceRequests":[{"count":1}]}}',
        'HostConfig.DeviceRequests[0]: key "count" differs from "Count" only by letter case',
    ),
    "a promoted top-level key differing by case": (
        '{"privileged":true}',
        'key "privileged" differs from "Privileged"',
    ),
    "an escaped key differing by case": (
        '{"host\\u0063onfig":{}}',
        'key "hostconfig" differs from "HostConfig"',
    ),
    "a Kelvin sign for K": (
        '{"HostConfig":{"\\u212aernelMemory":1}}',
        'HostConfig: key "\\u212aernelMemory" differs from "KernelMemory" by Unicode folding',
    ),
    "a long s for s": (
        '{"HostConfig":{"\u017fecurityOpt":["x"]}}',
        'key "\\u017fecurityOpt" differs from "SecurityOpt" by Unicode folding',
    ),
    "a repeated key at the top": (
        '{"Image":"a","Image":"b"}',
        'key "Image" appears more than once',
    ),
    "a repeated key deep down": (
        '{"HostConfig":{"DeviceRequests":[{"Count":1,"Count":-1}]}}',
        'HostConfig.DeviceRequests[0]: key "Count" appears more than once',
    ),
    "a repeated key spelled with an escape": (
        '{"HostConfig":{},"Host\\u0043onfig":{}}',
        'key "HostConfig" appears more than once',
    ),
    "a repeated key inside a map": ('{"Labels":{"a":"1","a":"2"}}', 'Labels: key "a" appears'),
    "a repeated key inside an opaque part": ('{"Healthcheck":{"x":1,"x":2}}', "Healthcheck: key"),
    "a repeated unknown key": ('{"Zz":1,"Zz":2}', 'key "Zz" appears more than once'),
    "Count as a string": (
        '{"HostConfig":{"DeviceRequests":[{"Count":"1"}]}}',
        'HostConfig.DeviceRequests[0].Count: expected an integer, got "1"',
    ),
    "Count as a fraction": ('{"DeviceRequests":[{"Count":1.5}]}', "expected an integer, got 1.5"),
    "Count with an exponent": ('{"DeviceRequests":[{"Count":1e0}]}', "expected an integer"),
    "Count as a bool": ('{"DeviceRequests":[{"Count":true}]}', "expected an integer, got true"),
    "an int64 overflow": ('{"Memory":9223372036854775808}', "out of range for a Go int64"),
    "a uint16 overflow": ('{"BlkioWeight":65536}', "BlkioWeight: 65536 is out of range"),
    "a negative uint": ('{"HostConfig":{"ConsoleSize":[-1,2]}}', "ConsoleSize[0]: -1 is out"),
    "Privileged as a string": ('{"HostConfig":{"Privileged":"true"}}', "expected true or false"),
    "Image as a bool": ('{"Image":true}', "Image: expected a string, got true"),
    "Env as a string": ('{"Env":"A=1"}', "Env: expected an array"),
    "DeviceRequests as an object": ('{"DeviceRequests":{}}', "expected an array, got {}"),
    "a capability that is not a string": (
        '{"DeviceRequests":[{"Capabilities":[["gpu",1]]}]}',
        "DeviceRequests[0].Capabilities[0][1]: expected a string, got 1",
    ),
    "an option value that is not a string": (
        '{"DeviceRequests":[{"Options":{"a b":1}}]}',
        'DeviceRequests[0].Options["a b"]: expected a string',
    ),
    "HostConfig as an array": ('{"HostConfig":[]}', "HostConfig: expected an object, got []"),
    "a create body that is an array": ("[]", "expected an object, got []"),
    "a null body": ("null", "the body is null"),
    "an empty body": ("", "the body is empty"),
    "a whitespace body": (" \n\t", "the body is empty"),
    "data after the value": ('{"Image":"x"}{"Privileged":true}', "data after the JSON value"),
    "a second value after whitespace": ('{"Image":"x"} 1', "data after the JSON value"),
    "a byte order mark": ("\ufeff{}", "invalid JSON"),
    "NaN": ('{"Memory":NaN}', "NaN is not JSON"),
    "Infinity": ('{"X":Infinity}', "Infinity is not JSON"),
    "-Infinity": ('{"X":-Infinity}', "-Infinity is not JSON"),
    "a float that overflows": ('{"X":1e400}', "out of range"),
    "a lone high surrogate": ('{"Image":"\\ud800"}', "Image: a \\u escape encodes half"),
    "a lone low surrogate in a key": ('{"\\udc00":1}', "half a surrogate pair"),
    "a reversed surrogate pair": ('{"Env":["\\ude00\\ud83d"]}', "Env[0]: a \\u escape"),
    "nesting deeper than MAX_DEPTH": ('{"X":' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}", "deeply"),
    "nesting far deeper than Python's recursion limit": ("[" * 100_000, "nested too deeply"),
    "a raw control character in a string": ('{"Image":"a\nb"}', "invalid JSON"),
    "a single-quoted string": ("{'Image':'x'}", "invalid JSON"),
    "a trailing comma": ('{"Image":"x",}', "invalid JSON"),
    "an integer of thousands of digits": ('{"X":' + "9" * 5000 + "}", "number cannot be read"),
}


@pytest.mark.parametrize("text, message", REFUSED.values(), ids=REFUSED.keys())
def test_refused_bodies_say_where_and_why(text, message):
    assert message in refused(text)


@pytest.mark.parametrize(
    "raw",
    [b"\xff{}", b'{"Image":"\xc3"}', b'{"Image":"\xc0\xaf"}', b'{"Image":"\xed\xa0\x80"}'],
    ids=["stray byte", "truncated sequence", "overlong encoding", "encoded surrogate"],
)
def test_bytes_that_are_not_utf8_are_refused(raw):
    assert "not UTF-8" in refused(raw)


def test_other_bodies_use_their_own_tables():
    assert decode(b'{"Privileged":true,"Cmd":["sh"]}', fields.EXEC_BODY) == {
        "Privileged": True,
        "Cmd": ["sh"],
    }
    assert "Cmd: expected an array" in refused('{"Cmd":"sh"}', fields.EXEC_BODY)
    assert 'write "DeviceRequests"' in refused('{"devicerequests":[]}', fields.UPDATE_BODY)
    assert 'key "name"' in refused('[{"name":"device"}]', fields.PLUGIN_PRIVILEGES_BODY)


MODE = fields.Recased(Replicated=fields.Recased(Replicas=int), Global=fields.Recased())


def test_a_recased_structs_keys_of_another_case_are_read_as_go_reads_them():
    obj = decode(b'{"x":1,"replicated":{"REPLICAS":2}}', MODE)
    assert canonical(obj) == b'{"x":1,"Replicated":{"Replicas":2}}'  # the order kept


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"Replicated":{"Replicas":1,"replicas":3}}', 'keys "Replicas" and "replicas" both'),
        ('{"replicated":{},"REPLICATED":{}}', 'both set "Replicated"'),
        ('{"Replicated":{"Replica\u017f":3}}', "by Unicode folding"),
        ('{"Replicated":{"replicas":"3"}}', "replicas: expected an integer"),
    ],
)
def test_a_recased_field_set_twice_or_folded_outside_ascii_is_refused(text, message):
    assert message in refused(text, MODE)


def test_go_fold_matches_go_for_the_two_non_ascii_letters_that_fold_to_ascii():
    assert go_fold("HostConfig") == "hostconfig"
    assert go_fold("\u212aernel") == "kernel"
    assert go_fold("\u017fecurity") == "security"
    assert go_fold("Privileged") != go_fold("Privilegéd")


def test_canonical_is_compact_utf8_in_the_decoded_order():
    obj = create('{ "Image" : "caf\\u00e9", "Env" : [ "A=1" ] , "Labels":{"b":"1","a":"2"}}')
    assert canonical(obj) == '{"Image":"café","Env":["A=1"],"Labels":{"b":"1","a":"2"}}'.encode()
    assert canonical(CLI_OBJ) == CLI_BODY


# --- properties -------------------------------------------------------------------------------

# Letters Go folds together: re-casing may use any of them.
VARIANTS = {"k": "kK\u212a", "s": "sS\u017f"}


def recase(key: str, data: st.DataObject) -> str:
    return "".join(
        data.draw(st.sampled_from(VARIANTS.get(c.lower(), c.lower() + c.upper()))) for c in key
    )


def rewrite_keys(node: object, data: st.DataObject) -> object:
    if isinstance(node, dict):
        return {recase(k, data): rewrite_keys(v, data) for k, v in node.items()}
    if isinstance(node, list):
        return [rewrite_keys(item, data) for item in node]
    return node


@settings(max_examples=300)
@given(st.data())
def test_recased_keys_are_either_canonical_or_refused(data):
    body = canonical(rewrite_keys(CLI_OBJ, data))
    try:
        obj = decode(body, fields.CREATE_BODY)
    except BodyError:
        return
    assert canonical(obj) == CLI_BODY


def dump_pairs(node: object) -> str:
    """Serialise a tree whose objects are lists of (key, value) pairs, repeats allowed."""
    if isinstance(node, tuple):
        return "{" + ",".join(f"{json.dumps(k)}:{dump_pairs(v)}" for k, v in node[0]) + "}"
    if isinstance(node, list):
        return "[" + ",".join(dump_pairs(item) for item in node) + "]"
    return json.dumps(node)


def as_pairs(node: object) -> object:
    if isinstance(node, dict):
        return ([(k, as_pairs(v)) for k, v in node.items()],)
    if isinstance(node, list):
        return [as_pairs(item) for item in node]
    return node


def objects_in(node: object) -> list:
    found = []
    if isinstance(node, tuple):
        found.append(node[0])
        for _, value in node[0]:
            found.extend(objects_in(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(objects_in(item))
    return found


@settings(max_examples=300)
@given(st.data(), st.sampled_from([None, True, 0, -1, "", "gpu", [], {}]))
def test_a_repeated_key_anywhere_is_refused(data, value):
    tree = as_pairs(CLI_OBJ)
    pairs = data.draw(st.sampled_from(objects_in(tree)))
    key = data.draw(st.sampled_from([k for k, _ in pairs])) if pairs else "New"
    if not pairs:
        pairs.append((key, value))
    pairs.insert(data.draw(st.integers(0, len(pairs))), (key, value))
    assert "appears more than once" in refused(dump_pairs(tree))


@settings(max_examples=500)
@given(st.data())
def test_mutated_bytes_raise_only_body_error_and_round_trip(data):
    body = bytearray(CLI_BODY)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body) - 1))
        how = data.draw(st.sampled_from(["replace", "insert", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if how == "replace":
            body[at] = byte
        elif how == "insert":
            body.insert(at, byte)
        else:
            del body[at]
    try:
        obj = decode(bytes(body), fields.CREATE_BODY)
    except BodyError:
        return
    assert decode(canonical(obj), fields.CREATE_BODY) == obj
    assert json.loads(canonical(obj)) == obj


@settings(max_examples=200)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=5), children, max_size=3)
        ),
        max_leaves=20,
    )
)
def test_any_json_round_trips_through_canonical_or_is_refused(value):
    try:
        obj = decode(canonical(value), fields.CREATE_BODY)
    except (BodyError, UnicodeEncodeError):
        return
    assert obj == value
