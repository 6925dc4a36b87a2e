"""Every number at every entry point, on a real dockerd: odd spellings (Unicode digits such
as ``²``, signs, 400 digits, NaN, infinity, dates out of range) get a clear refusal saying
what was expected (400, a plugin denial, explain's "invalid", exit 2), never a 500, a
plugin error or a traceback.  allocator/core/api/numbers.py is the one reader."""

from __future__ import annotations

import json
import urllib.parse

import docker
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from allocator.host import unixhttp
from allocator.ops import cli
from tests.support import engine
from tests.support.faults import IMAGE

ODD = st.one_of(
    st.sampled_from(["²", "٣", "１", "+1", "-1", "1e3", "nan", "inf", "-inf", "0x10", "1_000",
                     "", " ", "1.", ".5", "9" * 400, "1" * 19, "²g", "+99999999", "1\n2"]),
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=3).filter(
        lambda t: not t.isascii()
    ),
    st.integers(min_value=10**18, max_value=10**400).map(str),
)  # fmt: skip
SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


def EXAMPLES(check):
    """The settings, and the issue's own cases always among the examples."""
    return SETTINGS(example("²")(example("9" * 400)(example("nan")(check))))


LABELS = ("io.gpu-alloc.request.cpus", "io.gpu-alloc.request.memory",
          "io.gpu-alloc.request.min-memory", "io.gpu-alloc.time", "io.gpu-alloc.wait")  # fmt: skip


def create(sock: str, labels: dict[str, str], device_ids: list[str] | None = None) -> tuple:
    """(status, message) of a GPU create; a container made is removed again."""
    api = engine.engine_api(sock)
    req = docker.types.DeviceRequest(capabilities=[["gpu"]], count=0 if device_ids else 1,
                                     device_ids=device_ids)  # fmt: skip
    try:
        host_config = api.create_host_config(device_requests=[req])
        made = api.create_container(IMAGE, "true", labels=labels, host_config=host_config)
    except docker.errors.APIError as e:
        return e.status_code, str(e.explanation)
    api.remove_container(made["Id"], force=True)
    return 201, ""


def says_expected(message: str) -> bool:
    return "expected" in message or "such as" in message


def refused_clearly(status: int, message: str) -> bool:
    return (
        status in (400, 403, 409)
        and "internal error" not in message
        and ("plugin error" not in message.lower() or "denied" in message)
    )


@pytest.mark.parametrize("label", LABELS)
def test_an_odd_number_in_a_label_is_a_400_saying_what_was_expected(stack, label):
    @EXAMPLES
    @given(ODD)
    def check(text: str) -> None:
        status, message = create(stack.shim_sock, {label: text})
        assert status != 500 and "internal error" not in message, (text, message)
        if status != 201:
            assert refused_clearly(status, message) and says_expected(message), (text, message)

    check()


def test_an_odd_device_id_is_refused_on_the_shim_and_denied_on_the_real_socket(stack):
    @EXAMPLES
    @given(ODD)
    def check(text: str) -> None:
        status, message = create(stack.shim_sock, {}, [text])
        assert refused_clearly(status, message), (text, message)
        status, message = create(stack.engine_sock, {}, [text])
        assert status == 403 and "authorization denied by plugin" in message, (text, message)
        assert "plugin error" not in message.lower() or "denied" in message, message

    check()


def test_explain_and_report_answer_odd_query_parameters_with_what_was_expected(stack):
    def get(target: str) -> tuple[int, dict]:
        code, body = unixhttp.request(stack.shim_sock, "GET", target, timeout=30)
        return code, json.loads(body)

    @EXAMPLES
    @given(ODD)
    def check(text: str) -> None:
        for gpus in (text, f"device={text}", f"count={text}"):
            code, answer = get("/gpu-alloc/v1/explain?" + urllib.parse.urlencode({"gpus": gpus}))
            assert code == 200 and answer["verdict"] in ("invalid", "short", "fits"), answer
        for label in LABELS:  # explain answers what a create with the label gets: refused
            query = urllib.parse.urlencode({"gpus": "1", "label": f"{label}={text}"})
            code, answer = get("/gpu-alloc/v1/explain?" + query)
            assert code == 200 and answer["verdict"] == "invalid", (label, text, answer)
            assert says_expected(answer["message"]), answer
        for key in ("since", "until"):
            query = urllib.parse.urlencode({"since": "0", key: text})
            code, answer = get("/gpu-alloc/v1/report?" + query)
            assert code == 400 and says_expected(answer["message"]), answer

    check()


def test_reserve_answers_odd_gpus_and_windows_with_exit_2_or_a_refusal(stack, capsys):
    config = str(stack.config_path)

    @EXAMPLES
    @given(ODD)
    def check(text: str) -> None:
        for args in (
            ["--gpu", text, "--to", "+1h"],
            ["--gpus", text, "--to", "+1h"],
            ["--gpus", "1", "--to", f"+{text}d"],
            ["--gpus", "1", "--to", f"+{text}"],
        ):
            argv = ["--config", config, "reserve", "--for", "root", "--from", "now", *args]
            try:
                code = cli.main(argv)
            except SystemExit as e:  # argparse's own usage error
                code = e.code
            err = capsys.readouterr().err
            assert code in (1, 2) and "Traceback" not in err, (args, err)
            assert err.strip(), args

    check()
    for end in ("+99999999d", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+01:00"):
        argv = ["--config", config, "reserve", "--for", "root", "--from", "now", "--to", end]
        assert cli.main([*argv, "--gpus", "1"]) == 2, end  # a date out of any calendar
        assert "out of range" in capsys.readouterr().err
