"""Fault injection and the lease invariants, for the lifecycle, fault and soak suites.

`FaultStack` is an `engine.Stack` whose parts can be killed and restarted one
by one (the shim, plugin workers, dockerd), with a config of its own
(`pending_ttl`) and extra dockerd flags (``--debug`` to capture the API calls a
client makes).  `assert_invariants` is what "nothing leaked, nothing granted
twice" means, checked against the real Engine and the ledger after a scenario.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import signal
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import docker
import yaml

from tests.support import engine
from tests.support.engine import gpu_alloc

IMAGE = engine.BUSYBOX_TAG
NONE_VALUES = frozenset({"", "none", "void"})


class FaultStack(engine.Stack):
    """A Stack with its own ``pending_ttl``, dockerd flags, and kill/restart controls."""

    def __init__(
        self,
        gpus: int = 4,
        *,
        pending_ttl: float = 120.0,
        create_timeout: float | None = None,
        dockerd_args: Iterable[str] = (),
        plugin_proxy: bool = False,
    ) -> None:
        super().__init__(gpus=gpus)
        # dockerd reaches the plugin through a PluginProxy when faults are to be injected.
        self.proxy: PluginProxy | None = None
        self.authz_sock = str(self.dir / "authz.sock") if plugin_proxy else self.plugin_sock
        self.pending_ttl = pending_ttl
        # The config insists on pending_ttl > shim.create_timeout (a slow create's lease
        # must not expire under it).
        self.create_timeout = create_timeout or min(120.0, pending_ttl * 2 / 3)
        self.dockerd_args = list(dockerd_args)

    def write_config(self) -> Path:
        path = super().write_config()
        config = yaml.safe_load(path.read_text())
        config["policy"]["pending_ttl"] = self.pending_ttl
        config["shim"]["create_timeout"] = self.create_timeout
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def stop(self) -> None:
        if self.proxy is not None:
            # dockerd's own shutdown calls must still reach the plugin: the proxy goes last.
            if self.shim is not None:
                engine.stop_process(self.shim)
                self.shim = None
            if self.dockerd is not None:
                self.dockerd.stop(remove=False)
                self.dockerd = None
            self.proxy.close()
            self.proxy = None
        super().stop()

    def _new_dockerd(self) -> engine.Dockerd:
        if self.proxy is None and self.authz_sock != self.plugin_sock:
            self.proxy = PluginProxy(self.authz_sock, self.plugin_sock)
        return engine.Dockerd(
            self.engine_dir,
            authz_plugin_socket=self.authz_sock,
            plugin_name=self.plugin_name,
            extra_args=self.dockerd_args,
        )

    # ------------------------------------------------------------------ the shim

    def kill_shim(self, sig: int = signal.SIGKILL) -> None:
        """Kill the shim process we started (SIGKILL: no cleanup, a stale socket stays)."""
        if self.shim is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.shim.pid, sig)
            self.shim.wait(30)
            self.shim = None

    def start_shim(self) -> None:
        """Start a new shim on the same config, as systemd would after a crash."""
        assert self.shim is None
        self.shim = self._serve("shim", self.shim_sock)

    # ------------------------------------------------------------------ the plugin

    def plugin_workers(self) -> list[int]:
        """The gunicorn workers: children of the plugin (arbiter) process."""
        assert self.plugin is not None
        workers = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            if ppid == self.plugin.pid:
                workers.append(int(entry.name))
        return workers

    def kill_plugin_worker(self, pid: int | None = None) -> int | None:
        """SIGKILL one worker (the first, or `pid`); gunicorn's arbiter starts another."""
        workers = self.plugin_workers()
        victim = pid if pid is not None else (workers[0] if workers else None)
        if victim is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        return victim

    def wait_plugin_workers(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.plugin_workers()) < 2:
            if time.monotonic() > deadline:
                raise AssertionError("gunicorn did not restart its workers\n" + self.logs())
            time.sleep(0.2)

    # ------------------------------------------------------------------ dockerd

    def restart_dockerd(self) -> None:
        """Stop dockerd keeping its data (containers, images), start it again on the same
        directory with the same plugin socket."""
        assert self.dockerd is not None
        self.dockerd.stop(remove=False)
        self.dockerd = self._new_dockerd().start()


# ---------------------------------------------------------------------------- plugin faults


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


class _PluginProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # dockerd's plugin client keeps connections alive
    server: PluginProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.injects(self.path, body):
            self._answer(500, b'{"Err":"injected fault"}')
            return
        conn = _UnixHTTPConnection(self.server.upstream)
        try:
            conn.request("POST", self.path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = resp.read()
        finally:
            conn.close()
        between = self.server.between
        if between is not None and self.path == "/AuthZPlugin.AuthZReq":
            between(json.loads(body))
        self._answer(resp.status, answer)

    def _answer(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.docker.plugins.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class PluginProxy(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Sits between dockerd and the plugin; can fail the AuthZRes of container creates.

    A failed AuthZRes is what dockerd sees when the plugin dies, restarts for longer
    than dockerd's retries, or raises while settling a create: dockerd then answers the
    client with an error although the container was created (AuthZRes runs after the
    action).
    """

    daemon_threads = True

    def __init__(self, path: str, upstream: str) -> None:
        self.upstream = upstream
        self.fail_create_responses = False
        # Called with each AuthZReq once the plugin has answered it and before dockerd
        # has the answer: what another client does between a check and dockerd's act.
        self.between: Callable[[dict[str, Any]], None] | None = None
        super().__init__(path, _PluginProxyHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def injects(self, path: str, body: bytes) -> bool:
        if not (self.fail_create_responses and path == "/AuthZPlugin.AuthZRes"):
            return False
        try:
            req = json.loads(body)
        except ValueError:
            return False
        uri = str(req.get("RequestUri") or "")
        return req.get("RequestMethod") == "POST" and "/containers/create" in uri

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.server_address)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- clients


def shim(stack: engine.Stack, *args: str, **kw: Any) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args, **kw)


def real(stack: engine.Stack, *args: str, **kw: Any) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.engine_sock, *args, **kw)


def status(stack: engine.Stack, *, reconcile: bool = True) -> dict[str, Any]:
    """``gpu-alloc status --json``; it reconciles with the Engine unless told not to."""
    args = ["status", "--json"] + ([] if reconcile else ["--no-reconcile"])
    out = gpu_alloc(stack, *args)
    assert out.returncode == 0, out.stderr + stack.logs()
    return json.loads(out.stdout)


def held(stack: engine.Stack) -> dict[str, str | None]:
    """UUID -> holding container id, for the GPUs that are not free."""
    return {g["uuid"]: (g["holder"] or {}).get("container") for g in status(stack)["gpus"]
            if not g["free"]}  # fmt: skip


def visible_devices(stack: engine.Stack, container: str) -> str | None:
    info = engine.engine_api(stack.engine_sock).inspect_container(container)
    values = [
        e.partition("=")[2]
        for e in info["Config"]["Env"] or ()
        if e.startswith("NVIDIA_VISIBLE_DEVICES=")
    ]
    return values[-1] if values else None


# ---------------------------------------------------------------------------- invariants


def _uuids(stack: engine.Stack, ids: Iterable[str]) -> set[str]:
    every = {engine.sim_gpu_uuid(k) for k in range(stack.gpu_count)}
    out: set[str] = set()
    for ident in (i.strip() for i in ids):
        if ident in NONE_VALUES:
            continue
        if ident == "all":
            out |= every
        elif ident.isdigit():
            out.add(engine.sim_gpu_uuid(int(ident)))
        else:
            out.add(ident)
    return out


def grants_of(stack: engine.Stack, info: dict[str, Any]) -> set[str]:
    """The GPUs a container was granted by its device requests and its environment.

    Deliberately literal: every DeviceIDs entry, Count N as dockerd reads it (indices
    0..N-1, -1 all), and any NVIDIA_VISIBLE_DEVICES in its env, whatever the runtime.
    """
    gpus: set[str] = set()
    for req in (info.get("HostConfig") or {}).get("DeviceRequests") or ():
        gpus |= _uuids(stack, req.get("DeviceIDs") or ())
        count = req.get("Count") or 0
        gpus |= _uuids(stack, ["all"] if count < 0 else [str(k) for k in range(count)])
    for entry in (info.get("Config") or {}).get("Env") or ():
        name, _, value = entry.partition("=")
        if name == "NVIDIA_VISIBLE_DEVICES":
            gpus |= _uuids(stack, value.split(","))
    return gpus


def live_grants(stack: engine.Stack) -> dict[str, tuple[set[str], bool]]:
    """Container id -> (GPUs, running), for every container that exists (running or not)."""
    api = engine.engine_api(stack.engine_sock)
    try:
        out = {}
        for c in api.containers(all=True):
            try:
                info = api.inspect_container(c["Id"])
            except docker.errors.NotFound:
                continue  # removed (--rm) between the listing and the inspect
            out[c["Id"]] = (grants_of(stack, info), bool(info["State"]["Running"]))
        return out
    finally:
        api.close()


def assert_invariants(stack: engine.Stack) -> dict[str, Any]:
    """Nothing granted twice, nothing leaked; returns the (reconciled) status it checked.

    1. No GPU is granted to two live (existing) containers.  The one exception is a
       Compose recreate's handover: a container that is not running and whose lease was
       handed over to the lease of the container replacing it.
    2. Every lease in the ledger belongs to an existing container that has exactly the
       lease's GPUs, or is pending within its deadline with no container.
    3. Every live container holding GPUs is known to the ledger (a lease or a claim),
       and no GPU is held by two ledger entries (a handed-over lease aside).
    """
    snap = status(stack)  # reconciles first, as every operator view does
    live = live_grants(stack)
    grants = {cid: gpus for cid, (gpus, _) in live.items()}
    lease_of = {le["container"]: le for le in snap["leases"] if le["container"]}
    logs = "\n" + stack.logs(60)

    def handed_over(cid: str, to: str) -> bool:
        mine, theirs = lease_of.get(cid), lease_of.get(to)
        return bool(
            not live[cid][1]
            and mine
            and theirs
            and mine["state"] == "handed-over"
            and mine.get("handed_to") == theirs["id"]
        )

    owner: dict[str, str] = {}
    for cid, gpus in grants.items():
        for uuid in gpus:
            other = owner.get(uuid)
            if other is not None and not (handed_over(cid, other) or handed_over(other, cid)):
                raise AssertionError(
                    f"GPU {uuid} granted to both {other[:12]} and {cid[:12]}"
                    f" (running: {live[other][1]}, {live[cid][1]}){logs}"
                )
            if other is None or handed_over(other, cid):
                owner[uuid] = cid
    now = time.time()
    in_ledger: dict[str, str] = {}
    everyone = {g["uuid"] for g in snap["gpus"]}
    for lease in snap["leases"]:
        if lease["container"] is not None:
            cid = lease["container"]
            assert cid in grants, f"lease {lease['id']} of a removed container {cid}{logs}"
            assert grants[cid] == set(lease["gpus"]), (
                f"lease {lease['id']} says {lease['gpus']}, container {cid[:12]} has "
                f"{sorted(grants[cid])}{logs}"
            )
        else:
            assert lease["state"] == "pending", lease
            assert lease["deadline"] >= now - 1, f"lease past its deadline kept: {lease}{logs}"
        if lease["state"] == "handed-over":
            continue
        for uuid in lease["gpus"]:
            assert uuid not in in_ledger, f"GPU {uuid} in two ledger entries{logs}"
            in_ledger[uuid] = lease["id"]
    for claim in snap["claims"]:
        assert claim["container"] in grants, f"claim of a removed container: {claim}{logs}"
        for uuid in everyone if claim["gpus"] is None else claim["gpus"]:
            assert uuid not in in_ledger, f"GPU {uuid} in two ledger entries{logs}"
            in_ledger[uuid] = claim["container"]
    known = set(lease_of) | {c["container"] for c in snap["claims"]}
    for cid, gpus in grants.items():
        if gpus:
            assert cid in known, f"container {cid[:12]} holds {sorted(gpus)} unknown{logs}"
    held_gpus = {g["uuid"] for g in snap["gpus"] if not g["free"]}
    assert set(owner) <= held_gpus, f"granted GPUs shown free: {set(owner) - held_gpus}{logs}"
    return snap


def remove_all(stack: engine.Stack) -> None:
    engine.remove_all_containers(stack.engine_sock)


def assert_all_free(stack: engine.Stack, wait: float = 0.0) -> dict[str, Any]:
    """After everything is removed, a reconciling status shows every GPU free.

    `wait` allows pending leases of creates that never reached dockerd to reach their
    deadline (they must be kept until then, and freed right after).
    """
    remove_all(stack)
    deadline = time.monotonic() + wait
    while True:
        snap = status(stack)
        if snap["free"] == snap["total"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert snap["free"] == snap["total"], json.dumps(snap, indent=1) + stack.logs()
    assert snap["leases"] == [] and snap["claims"] == [], snap
    return snap
