"""Reservations through the service and the CLI, on simulated GPUs and the fake Engine."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import yaml

from allocator.core.judging.ask import Ask
from allocator.core.placement import Shortage
from allocator.core.rules import policy
from allocator.core.rules.policy import Owner, Wanted
from allocator.host import config as configmod
from allocator.host import ledger, unixhttp
from allocator.host.audit import AuditLog
from allocator.ops import cli
from allocator.service.placer import LeaseRequest
from allocator.service.views import wire
from allocator.service.views.explain import explain
from allocator.service.views.gpus import LiveView
from allocator.service.wiring import Allocator
from shim.admin import Admin
from shim.create import CreateInterceptor
from shim.framing import Request, Response
from shim.waitline import Waitline
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine

UUIDS = [sim.sim_gpu_uuid(k) for k in range(2)]
ALICE, BOB = Owner(0, "root"), Owner(1, "daemon")  # users every host's NSS has


def one(n: int = 1) -> Ask:
    return Ask(required=(), count=n, every=False, caps=("gpu",))


def write_config(tmp_path: Path, gpus: int = 2) -> Path:
    cfg = {"state_dir": str(tmp_path / "state"),
           "gpus": str(sim.write_sim_gpus(tmp_path / "gpus.yaml", gpus)),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"placement": "first-fit"}}  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path)


@pytest.fixture
def alloc(config: Path) -> Allocator:
    return Allocator(configmod.load(str(config)), FakeEngine())  # type: ignore[arg-type]


def lease(alloc: Allocator, owner: Owner, n: int = 1, time: str | None = None):
    want = policy.wanted({"io.gpu-alloc.time": time} if time else None)
    assert not isinstance(want, policy.Invalid)
    return alloc.book.lease(LeaseRequest(one(n), "job", owner, want))


def test_an_unlimited_create_is_placed_beside_a_reservation_starting_soon(alloc) -> None:
    now = ledger.now()
    made = alloc.reservations.reserve("root", (now + 10, now + 60), gpus=("0",))
    assert not isinstance(made, str), made
    got = lease(alloc, BOB)
    assert not isinstance(got, Shortage) and got[0].gpus == (UUIDS[1],)
    refused = lease(alloc, BOB)
    assert isinstance(refused, Shortage)
    assert "GPU 0: reserved for root from " in refused.msg and made.id in refused.msg
    assert "io.gpu-alloc.time=DURATION" in refused.msg


def test_a_window_begun_two_days_ago_is_reserved_from_now_to_its_end(alloc) -> None:
    """docs/reservations.md's first example, run after its --from: the rest of it is kept."""
    now = ledger.now()
    made = alloc.reservations.reserve("root", (now - 2 * 86400, now + 2 * 86400), gpus=("0",))
    assert not isinstance(made, str), made
    assert now <= made.start <= ledger.now() and made.end == now + 2 * 86400


def test_a_create_whose_limit_ends_before_the_window_may_use_the_gpu(alloc) -> None:
    now = ledger.now()
    alloc.reservations.reserve("root", (now + 10, now + 60), gpus=("0", "1"))
    got = lease(alloc, BOB, time="3s")
    assert not isinstance(got, Shortage), got
    assert isinstance(lease(alloc, BOB, time="1h"), Shortage)


def test_the_policys_time_limit_counts_as_the_requests_own(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["policy"]["time_limit"] = {"default": "3s"}
    path.write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(path)), FakeEngine())  # type: ignore[arg-type]
    now = ledger.now()
    alloc.reservations.reserve("root", (now + 10, now + 60), gpus=("0", "1"))
    got = lease(alloc, BOB)
    assert not isinstance(got, Shortage), got
    assert got[0].time_limit == 3.0


def test_during_the_window_others_are_refused_and_the_holder_placed_on_it(alloc) -> None:
    now = ledger.now()
    made = alloc.reservations.reserve("root", (now, now + 60), gpus=("1",))
    assert not isinstance(made, str)
    got = lease(alloc, ALICE)
    assert not isinstance(got, Shortage) and got[0].gpus == (UUIDS[1],), "its own GPU first"
    other = lease(alloc, BOB)
    assert not isinstance(other, Shortage) and other[0].gpus == (UUIDS[0],)


def test_a_named_reserved_gpu_is_refused_naming_the_reservation(alloc) -> None:
    now = ledger.now()
    made = alloc.reservations.reserve("root", (now, now + 60), gpus=("1",), note="deadline")
    assert not isinstance(made, str)
    got = alloc.book.lease(LeaseRequest(Ask((UUIDS[1],), 0, False, ("gpu",)), "job", BOB))
    assert isinstance(got, Shortage) and got.waitable
    assert "reserved for root until " in got.msg and f"{made.id}, deadline)" in got.msg


def test_explain_says_until_when_then_reserved(alloc) -> None:
    now = ledger.now()
    made = alloc.reservations.reserve("root", (now + 3600, now + 7200), gpus=("0",))
    assert not isinstance(made, str)
    said = explain(alloc, "daemon", "1", ["io.gpu-alloc.time=30m"])
    assert said["code"] == 0, said
    assert "GPU 0 until " in said["message"] and "then reserved for root" in said["message"]
    assert explain(alloc, "daemon", "2", [])["code"] == 2
    assert alloc.book.explain(one(), BOB, Wanted()) == ([UUIDS[1]], None)


def test_reserving_and_cancelling_are_audited(alloc) -> None:
    now = ledger.now()
    made = alloc.reservations.reserve("@root", (now + 10, now + 60), count=1, by="root")
    assert not isinstance(made, str)
    assert alloc.reservations.cancel(made.id[:4], by="root") == made
    kinds = [(e["event"], e["owner"]) for e in AuditLog(alloc.config.state_dir).read()]
    assert kinds == [("reserve", "@root"), ("reserve-cancel", "@root")]
    assert "is not a current reservation" in str(alloc.reservations.cancel(made.id))


def test_a_count_reservation_moves_off_a_gpu_that_turned_unhealthy(alloc) -> None:
    from allocator.core.machine import health

    now = ledger.now()
    made = alloc.reservations.reserve("root", (now + 10, now + 60), count=1)
    assert not isinstance(made, str) and made.gpus == (UUIDS[0],)
    with alloc.health.transaction() as box:
        box[0] = box[0].with_gpu(UUIDS[0], health.GpuHealth(healthy=False))
    (now_kept,) = alloc.reservations.current(ledger.now())
    assert now_kept.gpus == (UUIDS[1],) and now_kept.id == made.id


def run(config: Path, *args: str, capsys) -> tuple[int, str, str]:
    code = cli.main(["--config", str(config), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_reserves_lists_and_cancels(config, capsys) -> None:
    code, out, err = run(config, "reserve", "--gpu", "1", "--for", "root", "--from", "+10s",
                         "--to", "+1h", "--note", "paper", capsys=capsys)  # fmt: skip
    assert code == 0, err
    assert out.startswith("GPU 1 reserved for root from") and "reserve cancel" in out
    code, out, _ = run(config, "reservations", "--json", capsys=capsys)
    (row,) = json.loads(out)
    assert (row["for"], row["gpus"], row["state"], row["note"]) == (
        "root",
        [1],
        "upcoming",
        "paper",
    )
    code, out, _ = run(config, "reservations", capsys=capsys)
    assert row["id"] in out and "upcoming" in out
    code, out, err = run(config, "reserve", "cancel", row["id"], capsys=capsys)
    assert code == 0 and f"reservation {row['id']} cancelled" in out, err
    assert run(config, "reservations", capsys=capsys)[1].strip() == "no reservations"


def shim_admin(config: Path) -> Admin:
    """The shim's own endpoints (shim/serve.py wires the same) on the fake Engine."""
    alloc = Allocator(configmod.load(str(config)), FakeEngine())  # type: ignore[arg-type]
    line = Waitline(alloc)
    return Admin(alloc, LiveView(alloc), line, CreateInterceptor(alloc, line))


def test_a_user_who_cannot_read_the_state_dir_lists_the_reservations_through_the_shim(
    config, capsys, monkeypatch
) -> None:
    """A refusal for a reserved GPU sends every user to 'gpu-alloc reservations'."""
    assert run(config, "reserve", "--gpu", "1", "--for", "root", "--from", "+10s",
               "--to", "+1h", capsys=capsys)[0] == 0  # fmt: skip
    _, as_root, _ = run(config, "reservations", "--json", capsys=capsys)
    admin = shim_admin(config)
    asked: list[tuple[str, str]] = []

    async def engine(request: Request) -> Response:
        raise AssertionError(f"{request.target} went on to the Engine")

    def through_the_shim(path: str, method: str, target: str, **_: object) -> tuple[int, bytes]:
        asked.append((path, target))
        answer = asyncio.run(admin.handle(Request(method, target, [], b""), engine))
        return answer.status, answer.body

    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a docker-group user
    monkeypatch.setattr(unixhttp, "request", through_the_shim)
    code, out, err = run(config, "reservations", "--json", capsys=capsys)
    assert code == 0, err
    assert asked == [("/run/gpu-alloc/docker.sock", wire.RESERVATIONS_PATH)]
    assert json.loads(out) == json.loads(as_root)
    code, out, _ = run(config, "reservations", capsys=capsys)
    assert code == 0 and json.loads(as_root)[0]["id"] in out and "upcoming" in out


def test_a_user_whom_the_shim_does_not_answer_is_told_why_and_where(
    config, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    code, out, err = run(config, "reservations", capsys=capsys)
    assert (code, out) == (cli.EXIT_FAIL, "")
    assert err.startswith("gpu-alloc: cannot read the reservations in the state directory")
    assert "the shim at /run/gpu-alloc/docker.sock did not answer" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpu", "0", "--from", "+2h", "--to", "+1h"], "must be after --from"),
        (
            ["--gpu", "0", "--from", "2020-01-01T00:00:00Z", "--to", "2020-01-02T00:00:00Z"],
            "in the past",
        ),
        (["--gpu", "7", "--from", "+1m", "--to", "+1h"], "GPU '7' is not a GPU on this host"),
        (
            ["--gpus", "3", "--from", "+1m", "--to", "+1h"],
            "asked for 3 GPUs but this host has only 2",
        ),
        (["--gpus", "1", "--from", "at noon", "--to", "+1h"], "'at noon' is not a time"),
        (["--gpus", "1", "--pool", "x", "--from", "+1m", "--to", "+1h"], "no GPU pool 'x'"),
        (["--gpu", "0", "--gpus", "1", "--from", "+1m", "--to", "+1h"], "either --gpus N"),
    ],
)
def test_bad_reservations_are_refused_cleanly(config, capsys, args, said) -> None:
    code, out, err = run(config, "reserve", "--for", "root", *args, capsys=capsys)
    assert code != 0 and said in err and "Traceback" not in err, err
    assert out == ""


def test_an_overlapping_reservation_and_an_unknown_holder_are_refused(config, capsys) -> None:
    assert run(config, "reserve", "--gpu", "0", "--for", "root", "--from", "+1m", "--to", "+1h",
               capsys=capsys)[0] == 0  # fmt: skip
    code, _, err = run(config, "reserve", "--gpus", "2", "--for", "daemon", "--from", "+30m",
                       "--to", "+2h", capsys=capsys)  # fmt: skip
    assert code == 1 and "only 1 of the 2 of this host can be reserved" in err
    code, _, err = run(config, "reserve", "--gpu", "0", "--for", "daemon", "--from", "+30m",
                       "--to", "+2h", capsys=capsys)  # fmt: skip
    assert code == 1 and "overlaps another reservation (GPU 0: reserved for root" in err
    code, _, err = run(config, "reserve", "--gpu", "1", "--for", "nosuchuser9", "--from", "+1m",
                       "--to", "+1h", capsys=capsys)  # fmt: skip
    assert code == 2 and "no such user" in err


def test_reserving_needs_root(config, capsys, monkeypatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    code, _, err = run(config, "reserve", "--gpu", "0", "--for", "root", "--from", "+1m",
                       "--to", "+1h", capsys=capsys)  # fmt: skip
    assert code == 1 and "sudo gpu-alloc reserve" in err
    code, _, err = run(config, "reserve", "cancel", "abcd", capsys=capsys)
    assert code == 1 and "sudo gpu-alloc reserve cancel" in err


def test_a_create_waiting_for_a_reserved_gpu_is_served_when_the_window_ends(alloc) -> None:
    import asyncio

    from allocator.service.placer import LeaseRequest
    from shim.waitline import Waitline

    assert not isinstance(lease(alloc, BOB), Shortage)  # GPU 0: nothing else frees a GPU
    now = ledger.now()
    made = alloc.reservations.reserve("root", (now, now + 1.0), gpus=("1",))
    assert not isinstance(made, str)
    assert isinstance(lease(alloc, BOB), Shortage)

    async def main() -> tuple:
        line = Waitline(alloc, poll=0.02)
        got = await line.wait(LeaseRequest(one(), "w", BOB, Wanted()), 5)
        line.stop()
        return got

    got = asyncio.run(main())
    assert got is not None and got[0].gpus == (UUIDS[1],)
    assert ledger.now() < made.end + 0.5, "served as the window ended"


def test_two_reservations_repicked_at_once_never_share_a_gpu(tmp_path) -> None:
    from allocator.core.machine import health

    alloc = Allocator(configmod.load(str(write_config(tmp_path, 3))), FakeEngine())  # type: ignore[arg-type]
    now = ledger.now()
    a = alloc.reservations.reserve("root", (now + 10, now + 60), count=1)
    b = alloc.reservations.reserve("daemon", (now + 20, now + 90), count=1)
    assert not isinstance(a, str) and not isinstance(b, str) and a.gpus != b.gpus
    with alloc.health.transaction() as box:
        for uuid in (*a.gpus, *b.gpus):
            box[0] = box[0].with_gpu(uuid, health.GpuHealth(healthy=False))
    picked = [r.gpus for r in alloc.reservations.current(ledger.now())]
    assert picked.count((sim.sim_gpu_uuid(2),)) == 1, picked


def test_a_gpu_given_to_swarm_is_never_reserved(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["swarm"] = {"gpus": [UUIDS[0]]}
    path.write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(path)), FakeEngine())  # type: ignore[arg-type]
    now = ledger.now()
    refused = alloc.reservations.reserve("root", (now, now + 60), gpus=("0",))
    assert isinstance(refused, str) and "given to Docker Swarm" in refused
    made = alloc.reservations.reserve("root", (now, now + 60), count=1)
    assert not isinstance(made, str) and made.gpus == (UUIDS[1],)
    assert isinstance(alloc.reservations.reserve("root", (now, now + 60), count=1), str)
