"""What differs between the Engines gpu-alloc runs on, pinned per Engine, on the bare Engine.

Each table is keyed by Engine (tests/support/engine_root.py) and says what that dockerd does
with no plugin in front of it, so gpu-alloc's code can rely on the row of the Engine
it talks to (which it learns from GET /version, never by guessing).  Run with
`--engine 26` / `GA_ENGINE=28` / `--engine 29` for the other rows; docs/engines.md says
what gpu-alloc does about each.
"""

from __future__ import annotations

import glob
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import engine, engine_root

# GET /version: the API version each Engine speaks, and the oldest it accepts.
API_VERSIONS = {
    "20.10": ("1.41", "1.12"),
    "26": ("1.45", "1.24"),
    "28": ("1.51", "1.24"),
    "29": ("1.56", "1.40"),
}

# A `Count: 0` device request with no DeviceIDs (what `--gpus '"device="'` or a careless
# SDK call sends): the nvidia prestart hook is added on every Engine, and the
# NVIDIA_VISIBLE_DEVICES the container's process gets is:
#   container env -> value (None: unset)
# 20.10 and 26.1 set nothing, so the container's (or the image's) own value decides: with
# `nvidia/cuda`'s ENV `all`, every GPU.  28.5 appends `void` after the container's value
# (the OCI spec then holds both; the last one wins).  29 drops the request altogether: no
# hook, the container's value untouched and read by nothing (gpu-alloc judges a runtime
# that would read it, `--runtime nvidia`, on its own).
COUNT_ZERO = {
    "20.10": {None: None, "all": "all", "0": "0"},
    "26": {None: None, "all": "all", "0": "0"},
    "28": {None: "void", "all": "void", "0": "void"},
    "29": {None: None, "all": "all", "0": "0"},
}
# Whether the Engine itself appends NVIDIA_VISIBLE_DEVICES=void to the OCI spec's env.
COUNT_ZERO_APPENDS_VOID = {"20.10": False, "26": False, "28": True, "29": False}
# Whether such a request still adds the nvidia prestart hook.
COUNT_ZERO_HOOKS = {"20.10": True, "26": True, "28": True, "29": False}
# `Driver: nvidia` with no capability set: 20.10 to 28.5 select no driver and fail the
# start; 29 selects the nvidia driver by its name alone (Count 1 gets GPU 0).  gpu-alloc
# judges any request on the nvidia driver as GPUs, capabilities or not.
NAMED_DRIVER_ALONE_SELECTS = {"20.10": False, "26": False, "28": False, "29": True}

# docker-compose 1.29 recreating a service: from API 1.45 on, image inspect has no
# `ContainerConfig`, and 1.29 dies with KeyError half-way (the old container already
# stopped and renamed <short id>_<name>, no new one).  COMPOSE_API_VERSION=1.41 fixes it
# on 26 and 28; not on 29, whose containerd image store has no `ContainerConfig` at any
# API version (1.29 then dies on its None: use Compose v2 there).
V1_RECREATE_FAILS = {"20.10": False, "26": True, "28": True, "29": True}
V1_PIN_HELPS = {"20.10": True, "26": True, "28": True, "29": False}
V1_PINNED_ERROR = "'NoneType' object has no attribute 'get'"


def this_engine() -> str:
    return engine_root.selected().name


def _run_and_read_spec(
    dockerd: engine.Dockerd, request: dict[str, Any], env: str | None
) -> tuple[str | None, list[str], list[str]]:
    """Run a container with `request`; its NVIDIA_VISIBLE_DEVICES, prestart hooks, spec env."""
    api = engine.engine_api(dockerd.sock)
    host_config = api.create_host_config(device_requests=[request])
    cid = api.create_container(
        engine.BUSYBOX_TAG,
        ["sh", "-c", 'echo "v=${NVIDIA_VISIBLE_DEVICES-(unset)}"; exec sleep 60'],
        host_config=host_config,
        environment=[f"NVIDIA_VISIBLE_DEVICES={env}"] if env is not None else None,
    )["Id"]
    try:
        api.start(cid)
        # The OCI bundle lives under exec-root while the container runs.
        spec: dict[str, Any] = {}
        out = ""
        deadline = time.monotonic() + 10
        while (not spec or "v=" not in out) and time.monotonic() < deadline:
            found = glob.glob(f"{dockerd.dir}/exec/**/{cid}/config.json", recursive=True)
            spec = json.loads(Path(found[0]).read_text()) if found else {}
            out = api.logs(cid).decode()
            time.sleep(0.05)
        value = out.strip().partition("v=")[2]
        hooks = [h["path"] for h in (spec.get("hooks") or {}).get("prestart") or ()]
        spec_env = [e for e in spec.get("process", {}).get("env", ()) if "VISIBLE" in e]
        return (None if value == "(unset)" else value), hooks, spec_env
    finally:
        api.remove_container(cid, force=True)
        api.close()


def test_api_versions_are_what_the_engine_says(bare_engine: engine.Dockerd) -> None:
    api = engine.engine_api(bare_engine.sock)
    try:
        version = api.version()
    finally:
        api.close()
    assert version["Version"].startswith(engine_root.selected().version)
    assert (version["ApiVersion"], version["MinAPIVersion"]) == API_VERSIONS[this_engine()]


@pytest.mark.parametrize("driver", ["nvidia", ""])
@pytest.mark.parametrize("env", [None, "all", "0"])
def test_count_zero_device_request_visible_devices(
    bare_engine: engine.Dockerd, driver: str, env: str | None
) -> None:
    request = {"Driver": driver, "Count": 0, "Capabilities": [["gpu"]]}
    visible, hooks, spec_env = _run_and_read_spec(bare_engine, request, env)
    assert visible == COUNT_ZERO[this_engine()][env]
    # The hook runs on every Engine but 29: it is the container's env that decides.
    hook = ["nvidia-container-runtime-hook"] if COUNT_ZERO_HOOKS[this_engine()] else []
    assert [h.rpartition("/")[2] for h in hooks] == hook
    own = [f"NVIDIA_VISIBLE_DEVICES={env}"] if env is not None else []
    void = ["NVIDIA_VISIBLE_DEVICES=void"] if COUNT_ZERO_APPENDS_VOID[this_engine()] else []
    assert spec_env == own + void


def test_a_nvidia_request_without_capabilities_fails_at_start(bare_engine: engine.Dockerd) -> None:
    """Up to 28.5 `Driver: nvidia` with no capability set selects no driver; 29 selects
    nvidia by the name alone."""
    if NAMED_DRIVER_ALONE_SELECTS[this_engine()]:
        visible, hooks, _ = _run_and_read_spec(bare_engine, {"Driver": "nvidia", "Count": 1}, None)
        assert visible == "0" and [h.rpartition("/")[2] for h in hooks] == [
            "nvidia-container-runtime-hook"
        ]
        return
    api = engine.engine_api(bare_engine.sock)
    host_config = api.create_host_config(device_requests=[{"Driver": "nvidia", "Count": 0}])
    cid = api.create_container(engine.BUSYBOX_TAG, ["true"], host_config=host_config)["Id"]
    try:
        with pytest.raises(Exception, match=r'could not select device driver "nvidia"'):
            api.start(cid)
    finally:
        api.remove_container(cid, force=True)
        api.close()


def _v1_project(directory: Path, command: str) -> None:
    (directory / "docker-compose.yml").write_text(
        f"version: '3.8'\nservices:\n  w:\n    image: {engine.BUSYBOX_TAG}\n"
        f"    command: ['sleep', '{command}']\n    network_mode: none\n    stop_grace_period: 1s\n"
    )


@pytest.mark.parametrize("pin", [None, "1.41"], ids=["unpinned", "COMPOSE_API_VERSION=1.41"])
def test_compose_v1_recreate(bare_engine: engine.Dockerd, tmp_path: Path, pin: str | None) -> None:
    env = {"COMPOSE_API_VERSION": pin} if pin else {}

    def compose(*args: str):  # type: ignore[no-untyped-def]
        return engine.docker_compose(
            bare_engine.sock, tmp_path, *args, project_name="gav1", env=env, version=1
        )

    try:
        _v1_project(tmp_path, "100")
        assert compose("up", "-d").returncode == 0
        _v1_project(tmp_path, "101")
        again = compose("up", "-d")
        fails = V1_RECREATE_FAILS[this_engine()] and (
            pin is None or not V1_PIN_HELPS[this_engine()]
        )
        assert (again.returncode != 0) == fails, again.stderr
        if fails:
            assert (
                "KeyError: 'ContainerConfig'" if pin is None else V1_PINNED_ERROR
            ) in again.stderr
            names = [n for c in engine.engine_api(bare_engine.sock).containers(all=True)
                     for n in c["Names"]]  # fmt: skip
            assert len(names) == 1 and names[0].endswith("_gav1_w_1"), names  # renamed, stopped
    finally:
        compose("down")


# CDI device names (`--device nvidia.com/gpu=0`): 20.10 treats them as a host path; 26.1
# resolves them only with `"features": {"cdi": true}`; 28.5 resolves them by default.
CDI_RESOLVED = {  # Engine -> (without the feature, with it)
    "20.10": (False, False),
    "26": (False, True),
    "28": (True, True),
    "29": (True, True),
}
CDI_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"env": ["GA_CDI_GPU=0"]}}],
}


@pytest.mark.parametrize("feature", [False, True], ids=["default", "features.cdi"])
def test_cdi_device_names(feature: bool) -> None:
    state = Path(tempfile.mkdtemp(prefix="ga-", dir="/tmp"))
    try:
        config: dict[str, Any] = {}
        if not engine_root.selected().host:  # 20.10 does not know these keys at all
            (state / "cdi").mkdir()
            (state / "cdi" / "gpu.json").write_text(json.dumps(CDI_SPEC))
            config["cdi-spec-dirs"] = [str(state / "cdi")]
        if feature:
            config["features"] = {"cdi": True}
        (state / "daemon.json").write_text(json.dumps(config))
        with engine.Dockerd(state) as dockerd:
            engine.import_busybox(dockerd.sock)
            out = engine.docker_cli(
                dockerd.sock, "run", "--rm", "--device", "nvidia.com/gpu=0",
                engine.BUSYBOX_TAG, "sh", "-c", "echo cdi=$GA_CDI_GPU",
            )  # fmt: skip
        resolved = CDI_RESOLVED[this_engine()][feature]
        assert (out.returncode == 0 and "cdi=0" in out.stdout) == resolved, out.stderr
    finally:
        shutil.rmtree(state, ignore_errors=True)
