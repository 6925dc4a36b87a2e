"""A start names a container twice: the plugin inspects the reference, then dockerd looks it
up again (full id, exact name, unique id prefix).  Nothing may change what it names in
between: renames, removals and named creates wait for the start, and the start for them
(allocator/core/leases/inflight.py).  Against the real dockerd, on the real socket and the shim.

The window is held open on purpose by a plugin `Dispatcher` of the test's own, sharing the
state directory with the stack's plugin: its AuthZReq for a start is answered and its
AuthZRes not yet sent, which is where dockerd is when it looks the reference up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import docker.errors
import pytest

from allocator.core.leases import inflight
from allocator.host import config as configmod
from allocator.host.engine import Engine
from allocator.service.wiring import Allocator
from plugin.app import Dispatcher
from shim.create import CreateInterceptor
from shim.framing import Request, Response
from tests.support import engine
from tests.support.faults import IMAGE

VERBS = ["start", "restart"]


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory under the host's /dev (devtmpfs), where device paths must lie."""
    path = Path("/dev") / f"ga-race-{tmp_path.name}"[:40]
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def gpu_node(directory: Path, minor: int = 1) -> None:
    """A simulated GPU's node, made after the create: from now on a start is refused."""
    os.mknod(directory / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))


def refused(call, *args, match: str, **kwargs) -> str:
    with pytest.raises(docker.errors.APIError) as e:
        call(*args, **kwargs)
    assert e.value.status_code == 403, e.value
    assert match in str(e.value), e.value
    return str(e.value)


class Plugin:
    """A second plugin worker, in the test: calls its AuthZReq and AuthZRes at will."""

    def __init__(self, stack: engine.Stack):
        config = configmod.load(str(stack.config_path))
        self.dispatcher = Dispatcher(Allocator(config, Engine(stack.engine_sock)))

    def _call(self, phase: str, method: str, uri: str, status: int = 204) -> dict:
        req = {"RequestMethod": method, "RequestUri": uri, "ResponseStatusCode": status}
        raw = self.dispatcher.dispatch(f"/AuthZPlugin.{phase}", json.dumps(req).encode())
        return json.loads(raw)

    @contextlib.contextmanager
    def allowed(self, method: str, uri: str) -> Iterator[None]:
        """Between AuthZReq (allowed) and AuthZRes: dockerd is about to act on ``uri``."""
        answer = self._call("AuthZReq", method, uri)
        assert answer["Allow"], answer
        try:
            yield
        finally:
            self._call("AuthZRes", method, uri)

    def asks(self, method: str, uri: str) -> dict:
        return self._call("AuthZReq", method, uri)


@pytest.fixture
def plugin(stack: engine.Stack) -> Plugin:
    return Plugin(stack)


@pytest.fixture
def pair(stack: engine.Stack, dev_dir: Path) -> tuple[str, str]:
    """(good, bad): 'swap-a' starts harmlessly; 'swap-b' reaches a GPU without a lease."""
    api = engine.engine_api(stack.engine_sock)
    hc = api.create_host_config(devices=[f"{dev_dir}:/dev/x:rwm"], network_mode="none")
    bad = api.create_container(IMAGE, ["sleep", "300"], host_config=hc, name="swap-b")["Id"]
    gpu_node(dev_dir)
    good = api.create_container(IMAGE, ["sleep", "300"], name="swap-a")["Id"]
    return good, bad


@pytest.mark.parametrize("verb", VERBS)
def test_a_rename_swap_waits_for_a_start_by_name_then_is_refused(stack, plugin, pair, verb):
    """The swap that would make dockerd start 'swap-b' as 'swap-a' cannot happen in the window."""
    api = engine.engine_api(stack.engine_sock)
    good, bad = pair
    with plugin.allowed("POST", f"/v1.41/containers/swap-a/{verb}"):
        began = time.monotonic()
        refused(api.rename, good, "swap-t", match=f"a {verb} of swap-a is in progress")
        assert time.monotonic() - began >= inflight.WAIT * 0.9  # it waited for the start
        with pytest.raises(docker.errors.APIError) as taken:  # 'bad' is no concern of it:
            api.rename(bad, "swap-a")  # dockerd refuses, the name is still good's
        assert taken.value.status_code == 409
        assert api.inspect_container("swap-a")["Id"] == good  # what dockerd finds now
    api.rename(good, "swap-t")  # the start is over: renames go on
    api.rename(bad, "swap-a")
    refused(getattr(api, verb), "swap-a", match="without a gpu-alloc lease")


def test_a_removal_and_a_create_of_the_name_wait_for_a_start_by_name(stack, plugin, pair):
    api = engine.engine_api(stack.engine_sock)
    good, _ = pair
    with plugin.allowed("POST", "/v1.41/containers/swap-a/start"):
        refused(api.remove_container, "swap-a", match="a removal of swap-a")
        refused(api.remove_container, good[:12], match="a start of swap-a is in progress")
        refused(api.prune_containers, match="a container prune")
        assert api.inspect_container("swap-a")["Id"] == good
    api.remove_container(good)  # afterwards, as ever


def test_a_create_named_like_the_id_prefix_waits_for_a_start_by_prefix(stack, plugin, pair):
    """A name wins over an id prefix in dockerd: a new container named like the prefix would
    be started instead of the one judged."""
    api = engine.engine_api(stack.engine_sock)
    good, _ = pair
    prefix = good[:10]
    with plugin.allowed("POST", f"/containers/{prefix}/start"):
        refused(api.create_container, IMAGE, ["true"], name=prefix, match="a create of a container")
        refused(api.rename, "swap-b", prefix, match=f"a start of {prefix}")
    api.create_container(IMAGE, ["true"], name=prefix)  # then it is just a name
    assert api.inspect_container(prefix)["Name"] == f"/{prefix}"


def test_a_start_by_full_id_holds_off_only_its_own_removal(stack, plugin, pair):
    """Once a container is removed dockerd reads its id as a name: a container named like the
    id would start.  Its removal waits; renames and removals of others do not."""
    api = engine.engine_api(stack.engine_sock)
    good, bad = pair
    api.rename(bad, good)  # a container named like good's full id
    with plugin.allowed("POST", f"/v1.41/containers/{good}/start"):
        refused(api.remove_container, good, match=f"a start of {good}")
        # each of these would be refused after its wait, were it held to the start
        api.rename(bad, "swap-c")
        other = api.create_container(IMAGE, ["true"], name="bystander")["Id"]
        api.remove_container(other)


def test_a_start_waits_for_a_rename_in_flight_then_is_refused(stack, plugin, pair):
    """The other order: the rename was allowed first, and dockerd may not have done it yet."""
    api = engine.engine_api(stack.engine_sock)
    good, _ = pair
    with plugin.allowed("POST", f"/v1.41/containers/{good[:12]}/rename?name=swap-t"):
        refused(api.start, "swap-a", match=f"a rename of {good[:12]} is in progress")
    api.start("swap-a")
    assert engine.engine_api(stack.engine_sock).inspect_container(good)["State"]["Running"]


def test_a_start_by_a_prefix_that_names_nothing_is_refused(stack):
    """A container created meanwhile could take the prefix, and unnamed creates announce
    no name; dockerd would say "no such container" anyway."""
    api = engine.engine_api(stack.engine_sock)
    refused(api.start, "abc0123", match="reads as an id prefix")
    with pytest.raises(docker.errors.NotFound):
        api.start("no-such-container")  # a name: a create of it would wait for the start


def let_through(call, *args, **kwargs) -> None:
    """gpu-alloc lets the restart of a --rm container through; dockerd 20.10 may still fail
    it on its own: its exit handling can mark the container for removal mid-restart."""
    try:
        call(*args, **kwargs)
    except docker.errors.APIError as e:
        assert e.status_code != 403 and "marked for removal" in str(e), e


def test_a_rm_container_that_may_exit_restarts_only_by_full_id(stack):
    """dockerd removes a --rm container by itself when it exits, asking nobody: a restart by
    a prefix could then start another container with that prefix."""
    api = engine.engine_api(stack.engine_sock)
    hc = api.create_host_config(auto_remove=True, network_mode="none")

    def running(name: str) -> str:
        cid = api.create_container(IMAGE, ["sleep", "300"], host_config=hc, name=name)["Id"]
        api.start(cid[:12])  # never started yet: nothing removes it before dockerd looks
        return cid

    cid = running("job")
    why = refused(api.restart, cid[:12], match="once it exits (--rm)", timeout=0)
    assert f"docker restart {cid}" in why
    let_through(api.restart, "job", timeout=0)  # a name that is no prefix
    let_through(api.restart, running("job-2"), timeout=0)  # its full id
    cid = running("job-3")
    twin = api.create_container(IMAGE, ["true"], name=cid)["Id"]  # named like its id
    refused(api.restart, cid, match=f"container {twin[:12]} is named like its id", timeout=0)
    api.remove_container(twin)
    for name in ("job", "job-2", "job-3"):
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_container(name, force=True)


@pytest.mark.parametrize("verb", VERBS)
def test_the_shim_alone_forwards_a_start_by_the_full_id_it_judged(stack, pair, verb):
    good, _ = pair
    config = configmod.load(str(stack.config_path))
    alone = replace(config, plugin=replace(config.plugin, name="not-this-engines-plugin"))
    shim = CreateInterceptor(Allocator(alone, Engine(stack.engine_sock)))
    sent: list[Request] = []

    async def forward(request: Request) -> Response:
        sent.append(request)
        return Response(204, "No Content", [], b"")

    for target, expected in (
        (f"/v1.41/containers/swap-a/{verb}?t=0", f"/v1.41/containers/{good}/{verb}?t=0"),
        (f"/containers/{good[:8]}/{verb}", f"/containers/{good}/{verb}"),
    ):
        answer = asyncio.run(shim.handle(Request("POST", target, [], b""), forward))
        assert answer.status == 204
        assert sent.pop().target == expected


def test_behind_the_plugin_the_shim_leaves_a_start_to_it(stack, pair):
    """dockerd runs gpu-alloc's plugin: it judges the start (and holds its reference
    still), so the shim forwards it as sent, without an inspect of its own."""
    config = configmod.load(str(stack.config_path))
    alloc = Allocator(config, Engine(stack.engine_sock))
    alloc.gather.facts()  # the Engine's view, as the shim has it after any create
    shim = CreateInterceptor(alloc)
    sent: list[Request] = []

    async def forward(request: Request) -> Response:
        sent.append(request)
        return Response(204, "No Content", [], b"")

    answer = asyncio.run(shim.handle(Request("POST", "/containers/swap-a/start", [], b""), forward))
    assert answer.status == 204
    assert sent.pop().target == "/containers/swap-a/start"


def test_a_rename_swap_race_on_the_real_socket_never_starts_the_other_container(stack, pair):
    """End to end, no window held open: swap names as fast as dockerd allows while starting
    by name.  Without the registry 'swap-b' starts within a second or two."""
    api = engine.engine_api(stack.engine_sock)
    good, bad = pair
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(docker.errors.APIError):
                api.rename(good, "swap-t")
                api.rename(bad, "swap-a")
                api.rename(bad, "swap-b")
                api.rename(good, "swap-a")

    started = 0
    thread = threading.Thread(target=swap)
    thread.start()
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not running(api, bad):
            with contextlib.suppress(docker.errors.APIError):
                api.start("swap-a")
            if running(api, good):
                started += 1
                api.kill(good)
                api.wait(good)
    finally:
        stop.set()
        thread.join()
    assert not running(api, bad), f"'swap-b' started after {started} starts of 'swap-a'"
    assert started > 0  # the race was run, not just refused throughout


def running(api, cid: str) -> bool:
    return api.inspect_container(cid)["State"]["Running"]


# A process that ignores SIGTERM: stopping it takes the whole stop timeout.
SLOW_STOP = ["sh", "-c", "trap '' TERM; sleep 1000"]
CHANGES = {
    "container prune": ["container", "prune", "-f"],
    "system prune": ["system", "prune", "-f"],
    "rm -f by name": ["rm", "-f", "db"],
    "rm -f by id prefix": ["rm", "-f", "{prefix}"],
}


def slow_db(api) -> str:
    hc = api.create_host_config(network_mode="none")
    db = api.create_container(IMAGE, SLOW_STOP, name="db", host_config=hc)["Id"]
    api.start(db)
    return db


def signalled(api, cid: str, since: float) -> bool:
    filters = {"container": [cid], "event": ["kill"]}
    return any(api.events(since=since, until=time.time(), filters=filters))


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_slow_restart_holds_off_no_prune_or_removal(stack, change):
    """`docker restart db` waits out db's stop timeout, but dockerd looked 'db' up before it
    signalled db: from then on nothing can redirect it, so prunes and removals go on."""
    api = engine.engine_api(stack.engine_sock)
    db = slow_db(api)
    stale = api.create_container(IMAGE, ["true"], name="stale")["Id"]  # what a prune removes
    began = time.time()
    restart = subprocess.Popen(
        ["docker", "-H", f"unix://{stack.engine_sock}", "restart", "-t", "5", "db"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not signalled(api, db, began):  # the restart has sent db its SIGTERM
            assert time.time() - began < 5
            time.sleep(0.05)
        t0 = time.monotonic()
        args = [a.format(prefix=db[:12]) for a in change]
        out = engine.docker_cli(stack.engine_sock, *args)
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - t0 < inflight.WAIT  # it never waited for the restart
        removed = {c["Id"] for c in api.containers(all=True)}.isdisjoint
        if "prune" in change:
            assert restart.poll() is None  # the restart is still in flight
            assert removed([stale])
            assert restart.wait(15) == 0, restart.stderr.read()  # db restarts as asked
            assert running(api, db)
        else:
            assert removed([db])
    finally:
        restart.kill()
        restart.wait()


def test_a_restart_of_a_running_container_dockerd_has_not_signalled_still_holds_a_prune(
    stack, plugin
):
    """Running is not enough: until dockerd signals it, its reference may not be looked up
    yet, and the container could exit and be pruned before it is."""
    api = engine.engine_api(stack.engine_sock)
    slow_db(api)
    with plugin.allowed("POST", "/v1.41/containers/db/restart"):
        refused(api.prune_containers, match="a restart of db is in progress")
        refused(api.remove_container, "db", force=True, match="a restart of db is in progress")
