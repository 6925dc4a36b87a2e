"""Execs, attaches and copies into a container, settled by the service (allocator/service/doors.py):
no look at anything while the policy grants nobody anything; else the container as it
is now, and whose gpu-alloc recorded it to be."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from allocator.core.access import owned
from allocator.core.judging import verdicts as decide
from allocator.host import config as configmod
from allocator.service.wiring import Allocator
from shim.create import CreateInterceptor
from shim.framing import Request, Response
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine

GRANT = {"powers": {"SYS_TIME": {"users": ["ann"]}}}


def make(tmp_path: Path, policy: dict) -> tuple[Allocator, FakeEngine]:
    fake = FakeEngine()
    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus),
           "engine": {"socket": str(tmp_path / "none.sock")}, "policy": policy}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), fake), fake  # type: ignore[arg-type]


def clock(fake: FakeEngine) -> str:
    cid = fake.add("clock")
    fake.by_id[cid]["HostConfig"]["CapAdd"] = ["SYS_TIME"]
    return cid


def anns_clock(tmp_path: Path) -> tuple[Allocator, FakeEngine, str]:
    """A host whose policy grants ann SYS_TIME, and her container that holds it."""
    alloc, fake = make(tmp_path, GRANT)
    cid = clock(fake)
    alloc.lookups.creators.record(cid, 1000, "ann")
    return alloc, fake, cid


def test_while_nobody_is_granted_anything_no_container_is_looked_at(tmp_path):
    alloc, fake = make(tmp_path, {})
    cid = clock(fake)  # made before any rule: nobody's in particular
    assert alloc.doors.refusal(owned.DoorCheck(cid, owned.EXEC, "eve")) is None
    assert fake.inspected == []
    assert alloc.doors.mark("POST", f"/containers/{cid}/exec", None) is None


@pytest.mark.parametrize("asker", ["eve", ""])
def test_an_owned_containers_exec_is_refused_to_others(tmp_path, asker):
    alloc, fake, cid = anns_clock(tmp_path)
    why = alloc.admission.resolve(owned.DoorCheck(cid, owned.EXEC, asker))
    assert isinstance(why, decide.Deny) and "grants ann alone (HostConfig.CapAdd)" in why.msg
    assert alloc.admission.resolve(owned.DoorCheck(cid, owned.EXEC, "ann")) == decide.ALLOW
    plain = fake.add("plain")
    assert alloc.admission.resolve(owned.DoorCheck(plain, owned.EXEC, asker)) == decide.ALLOW


def test_the_shim_forwards_an_exec_by_the_full_id_its_reference_names_now(tmp_path):
    """No rename or removal before dockerd looks the reference up moves the exec."""
    alloc, fake = make(tmp_path, GRANT)
    cid = clock(fake)
    assert pinned(alloc, "/v1.41/containers/clock/exec") == f"/v1.41/containers/{cid}/exec"
    gone = "/v1.41/containers/gone/exec?x=1"
    assert pinned(alloc, gone) == gone  # it names nothing: dockerd says so
    why = alloc.doors.refusal(owned.DoorCheck(cid, owned.EXEC, "eve"))
    assert why is not None and why.startswith("gpu-alloc refused to exec into clock:")
    (tmp_path / "open").mkdir()
    nobody, _ = make(tmp_path / "open", {})
    assert pinned(nobody, "/v1.41/containers/clock/exec") == "/v1.41/containers/clock/exec"


def pinned(alloc: Allocator, target: str) -> str:
    route = decide.route_of("POST", target)
    assert not isinstance(route, decide.Deny)
    return alloc.doors.pinned(route, target)


def test_an_execs_start_is_settled_on_the_container_the_exec_was_made_in(tmp_path):
    """Whoever starts an exec gets its stream: an owned container's are its owner's."""
    alloc, fake, cid = anns_clock(tmp_path)
    fake.execs["e" * 64] = cid
    why = alloc.admission.resolve(owned.DoorCheck("e" * 64, owned.EXEC_START, "eve"))
    assert isinstance(why, decide.Deny)
    assert why.msg.startswith("gpu-alloc refused to start an exec in clock: it holds what")
    ann = owned.DoorCheck("e" * 64, owned.EXEC_START, "ann")
    assert alloc.admission.resolve(ann) == decide.ALLOW
    fake.execs["f" * 64] = fake.add("plain")
    assert alloc.admission.resolve(owned.DoorCheck("f" * 64, owned.EXEC_START, "")) == decide.ALLOW
    gone = owned.DoorCheck("e" * 12, owned.EXEC_START, "eve")  # no exec by a prefix
    assert alloc.admission.resolve(gone) == decide.ALLOW  # dockerd answers it has none


def test_an_execs_start_goes_on_naming_the_exec(tmp_path):
    alloc, fake = make(tmp_path, GRANT)
    fake.execs["e" * 64] = clock(fake)
    target = f"/v1.41/exec/{'e' * 64}/start"
    assert pinned(alloc, target) == target


def test_an_attach_to_an_owned_containers_input_is_its_owners(tmp_path):
    alloc, _, cid = anns_clock(tmp_path)
    why = alloc.admission.resolve(owned.DoorCheck("clock", owned.ATTACH, "eve"))
    assert isinstance(why, decide.Deny)
    assert why.msg.startswith("gpu-alloc refused to attach to the input of clock:")
    assert why.msg.endswith("Its output is anyone's: docker attach --no-stdin, or docker logs -f")
    assert alloc.admission.resolve(owned.DoorCheck("clock", owned.ATTACH, "ann")) == decide.ALLOW
    target = "/v1.41/containers/clock/attach?stream=1&stdin=1"
    assert pinned(alloc, target) == f"/v1.41/containers/{cid}/attach?stream=1&stdin=1"


def test_a_call_that_names_no_container_is_refused_while_any_can_be_owned(tmp_path):
    """A rename between the check and dockerd's own look-up could give it that name."""
    alloc, _ = make(tmp_path, GRANT)
    why = alloc.admission.resolve(owned.DoorCheck("vv1", owned.COPY, "eve"))
    assert isinstance(why, decide.Deny)
    assert why.msg.startswith("gpu-alloc refused to copy files into vv1: no container is vv1")
    (tmp_path / "open").mkdir()
    nobody, _ = make(tmp_path / "open", {})
    assert nobody.admission.resolve(owned.DoorCheck("vv1", owned.COPY, "eve")) == decide.ALLOW


def test_a_call_by_a_links_alias_is_refused_while_any_container_can_be_owned(tmp_path):
    """Renaming the alias's parent (anyone's) moves ``parent/alias`` onto another
    container between the check and dockerd's own look-up."""
    alloc, _ = make(tmp_path, GRANT)
    for ref in ("eves/al", "/eves/al"):
        why = alloc.admission.resolve(owned.DoorCheck(ref, owned.ATTACH, "eve"))
        assert isinstance(why, decide.Deny) and "by a link's alias" in why.msg, ref
    (tmp_path / "open").mkdir()
    nobody, _ = make(tmp_path / "open", {})
    assert nobody.admission.resolve(owned.DoorCheck("eves/al", owned.EXEC, "eve")) == decide.ALLOW


def test_a_reference_that_reads_as_an_id_prefix_is_judged_on_each_container_it_could_name(
    tmp_path,
):
    """A name wins over an id prefix only while it exists: once the container named like
    the prefix is renamed, dockerd finds the owned container the prefix begins."""
    alloc, fake = make(tmp_path, GRANT)
    cid = fake.add("clock", cid="c10c" + "7" * 60)
    fake.by_id[cid]["HostConfig"]["CapAdd"] = ["SYS_TIME"]
    alloc.lookups.creators.record(cid, 1000, "ann")
    fake.add(cid[:6])  # eve's own, named like the start of ann's id
    why = alloc.admission.resolve(owned.DoorCheck(cid[:6], owned.ATTACH, "eve"))
    assert isinstance(why, decide.Deny) and "grants ann alone" in why.msg
    ann = owned.DoorCheck(cid[:6], owned.ATTACH, "ann")
    assert alloc.admission.resolve(ann) == decide.ALLOW
    fake.add("box", cid="f" * 64)  # nobody's in particular
    fake.add("f" * 6)
    assert alloc.admission.resolve(owned.DoorCheck("f" * 6, owned.EXEC, "eve")) == decide.ALLOW


def test_renaming_an_owned_container_is_its_owners(tmp_path):
    alloc, fake, _ = anns_clock(tmp_path)
    why = alloc.admission.resolve(owned.DoorCheck("clock", owned.RENAME, "eve"))
    assert isinstance(why, decide.Deny)
    assert why.msg.startswith("gpu-alloc refused to rename clock: it holds what the policy")
    assert "a new name could carry into it a call judged on another container" in why.msg
    assert alloc.admission.resolve(owned.DoorCheck("clock", owned.RENAME, "ann")) == decide.ALLOW
    plain = fake.add("plain")
    assert alloc.admission.resolve(owned.DoorCheck(plain, owned.RENAME, "eve")) == decide.ALLOW


def test_the_shim_judging_alone_judges_the_container_it_pinned(tmp_path, monkeypatch):
    """Where dockerd runs no gpu-alloc plugin the shim judges an exec itself: on the full
    id it forwards, not on a name that could read as another container's id prefix."""
    alloc, fake = make(tmp_path, GRANT)
    cid = fake.add("clock", cid="c10c" + "7" * 60)
    fake.by_id[cid]["HostConfig"]["CapAdd"] = ["SYS_TIME"]
    alloc.lookups.creators.record(cid, 1000, "ann")
    plain = fake.add(cid[:6])  # named like the start of ann's id
    monkeypatch.setattr(alloc.lookups, "plugin_judges", lambda: False)
    sent: list[Request] = []

    async def forward(request: Request) -> Response:
        sent.append(request)
        return Response(201, "Created", [], b'{"Id":"e"}')

    body = json.dumps({"Cmd": ["true"]}).encode()
    asked = Request("POST", f"/v1.41/containers/{cid[:6]}/exec", [], body)
    answer = asyncio.run(CreateInterceptor(alloc).handle(asked, forward))
    assert isinstance(answer, Response) and answer.status == 201, answer
    assert [r.target for r in sent] == [f"/v1.41/containers/{plain}/exec"]
