"""``gpu-alloc report`` from the command line: table, JSON and CSV, windows, bad input."""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import pytest

from allocator.core.leases import events
from allocator.core.machine.usage import Usage
from allocator.host.audit import AuditLog
from allocator.host.samples import Samples
from allocator.ops import cli
from allocator.service.views import report as report_view
from allocator.service.views import wire

A, B = "GPU-aaaa", "GPU-bbbb"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """alice held GPU 0 for the last two hours at 50 %; bob waited 30 s, then held GPU 1
    for the last hour at 0 %; carol was refused once."""
    now = time.time()
    log = AuditLog(str(tmp_path))
    for e in [
        events.record("grant", now - 7200, gpus=[A], indices={A: 0}, lease="L1", owner="alice"),
        events.record("release", now - 1, gpus=[A], lease="L1", owner="alice"),
        events.record("grant", now - 3600, gpus=[B], indices={B: 1}, lease="L2", owner="bob",
                      waited_s=30.0),
        events.record("refusal", now - 60, owner="carol", reason="not enough free GPUs"),
    ]:  # fmt: skip
        log.write(e)
    samples = Samples(str(tmp_path), bucket=3 * 3600)
    for at in (now - 7199, now - 3):  # the 3 h buckets are aligned: the held hours span two
        samples.add(at, {A: Usage(utilization=0.5), B: Usage(utilization=0.0)})
    path = tmp_path / "config.yaml"
    path.write_text(f"state_dir: {tmp_path}\n")
    return path


def report(config: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["--config", str(config), "report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_gpu_hours_held_used_idle_waits_and_refusals_per_user(config, capsys) -> None:
    code, out, _ = report(config, capsys, "--json")
    assert code == 0
    rows = {r["user"]: r for r in json.loads(out)["rows"]}
    assert rows["alice"]["gpu_hours_held"] == pytest.approx(2.0, abs=0.01)
    assert rows["alice"]["gpu_hours_used"] == pytest.approx(1.0, abs=0.01)
    assert rows["bob"]["gpu_hours_idle"] == pytest.approx(1.0, abs=0.01)
    assert (rows["bob"]["waits"], rows["bob"]["wait_seconds_longest"]) == (1, 30.0)
    assert rows["carol"]["refusals"] == {"short of GPUs": 1}


def test_the_table_and_csv_show_the_same_rows_by_gpu(config, capsys) -> None:
    code, out, _ = report(config, capsys, "--by", "gpu")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("GPU time from ") and lines[0].endswith("by gpu")
    assert lines[1].split()[:3] == ["GPU", "HELD", "GPU-h"]
    assert [line.split()[0] for line in lines[2:]] == ["0", "1", "-"]
    code, out, _ = report(config, capsys, "--by", "gpu", "--csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert [(r["gpu"], round(float(r["gpu_hours_held"]))) for r in table] == [
        ("0", 2),
        ("1", 1),
        ("-", 0),
    ]
    assert table[2]["refusals"] == "short of GPUs: 1"


def test_since_and_until_take_durations_and_rfc3339_times(config, capsys) -> None:
    code, out, _ = report(config, capsys, "--since", "90m", "--until", "30m", "--json")
    assert code == 0
    rows = {r["user"]: r for r in json.loads(out)["rows"]}
    assert rows["alice"]["gpu_hours_held"] == pytest.approx(1.0, abs=0.01)
    assert rows["bob"]["gpu_hours_held"] == pytest.approx(0.5, abs=0.01)
    code, out, _ = report(config, capsys, "--since", "2000-01-01T00:00:00+00:00", "--json")
    assert code == 0 and len(json.loads(out)["rows"]) == 3


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--since", "a week"), "--since 'a week': expected a duration such as 7d"),
        (("--until", "soon"), "--until 'soon': expected a duration such as 7d"),
        (("--since", "1h", "--until", "2h"), "--until must be later than --since"),
    ],
)
def test_a_malformed_duration_or_window_is_a_clean_error(config, capsys, args, said) -> None:
    code, out, err = report(config, capsys, *args)
    assert (code, out) == (cli.EXIT_CONFIG, "")
    assert err.startswith(f"gpu-alloc report: {said}") and err.count("\n") == 1


def test_an_empty_window_says_so(config, capsys) -> None:
    code, out, _ = report(config, capsys, "--since", "1001d", "--until", "1000d")
    assert code == 0 and out.startswith("no GPU use from ")


def test_a_user_who_cannot_read_the_state_dir_asks_the_shim(config, capsys, monkeypatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a docker-group user
    code, out, err = report(config, capsys)
    assert (code, out) == (cli.EXIT_FAIL, "")
    assert err.startswith("gpu-alloc: cannot read the audit trail in the state directory")
    assert "the shim at /run/gpu-alloc/docker.sock did not answer" in err


@pytest.mark.parametrize("since", [float("nan"), float("-inf"), -1e300, -1e18])
def test_a_window_no_calendar_holds_is_a_clean_error_for_the_shims_endpoint(config, since) -> None:
    """The shim's GET /gpu-alloc/v1/report reads since as a float: any the client sends."""
    target = wire.report_target(since, None, "user")
    with pytest.raises(ValueError, match="--since"):
        report_view.build(str(config.parent), time.time(), *wire.report_request(target), "bob")
