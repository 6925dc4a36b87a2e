"""gpu-alloc as installed: `deploy/install.sh` in a booted Debian root whose init is systemd.

The other suites start the plugin and the shim by hand; here they run as the installed
units, with every sandboxing directive applied by systemd (`ProtectSystem=strict`,
`ProtectHome=`, `PrivateTmp=`, no capabilities beyond three), beside the root's own
docker.service, and are driven the way users and operators drive them: the docker CLI
through the context the installer tells users to create, the real socket, `gpu-alloc
doctor`, BuildKit's own client, a second copy started by hand, and a reboot.  The machine
is booted once for the module (tests/support/systemd_root.py); the tests run in file order
and the reboot comes last.

The Engine is the selected one (`--engine`): 20.10, bookworm's own, or 29 (sid with 29's
own dockerd), where the installer's builder setting alone closes BuildKit's gRPC door.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import buildkit, cdi, engine_root, mps_control, systemd_root
from tests.support.busybox_image import BUSYBOX_TAG, busybox_rootfs_tar
from tests.support.engine import sim_gpu_uuid, write_sim_gpus

REPO = Path(__file__).resolve().parents[2]
GPUS = 4
IMAGE = BUSYBOX_TAG
CTX = "docker --context gpu-alloc"
PLUGIN_SOCK = "/run/docker/plugins/gpu-alloc.sock"
SHIM_SOCK = "/run/gpu-alloc/docker.sock"
VENV = "/opt/gpu-alloc/venv"
PROBE = f"/probe/{buildkit.PROBE}"
ENGINE = engine_root.selected()
DOCTOR_ROW = re.compile(r"^\[\s*(ok|warn|FAIL)\] (.*)$")
MPS_LOG = "/run/gpu-alloc/mps-calls.log"
# The `nvidia-cuda-mps-control` stand-in (tests/support/mps_control.py) records its calls
# in MPS_LOG (both the shim and the daemon's transient unit can write /run/gpu-alloc); its
# daemon leaves a mark on the /dev/shm it sees and runs until told `quit`.


def _require() -> Path:
    """The Engine's cached root; skipped locally (failed under $CI) where none can boot,
    and loudly where the archive or the Engine's own binaries cannot give one."""
    why = systemd_root.missing_requirements(ENGINE)
    if why is None:
        try:
            return systemd_root.ensure_root(ENGINE)
        except engine_root.BinariesAbsent as e:
            pytest.skip(f"{engine_root.ABSENT_BANNER} for the systemd root: {e}")
        except engine_root.ArchiveUnavailable as e:
            pytest.skip(f"{engine_root.ARCHIVE_BANNER} for the systemd root: {e}")
    if os.environ.get("CI"):
        pytest.fail(f"install tier cannot run under CI: {why}", pytrace=False)
    pytest.skip(why)


_NOT_SOURCE = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "bench-results")


def _wheels(into: Path, root: Path) -> None:
    """gpu-alloc's wheel and its dependencies' for the root's own python3 (sid's is not
    this one): the machine has no network."""
    py = subprocess.run(["chroot", str(root), "python3", "-c",
                         "import sys; print('%d.%d' % sys.version_info[:2])"],
                        capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # Built from a copy: pip builds in the source tree (build/, *.egg-info), and the other
    # Engine's install tier builds the same checkout at the same time.
    source = into.parent / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(into), str(source)],
                   check=True, timeout=600)  # fmt: skip
    with open(REPO / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    subprocess.run([*pip, "download", "--only-binary=:all:", f"--python-version={py}",
                    "-d", str(into), *deps], check=True, timeout=600)  # fmt: skip


def _configure(root: Path) -> None:
    """Simulated GPUs, set before the installer runs (it keeps an existing config)."""
    etc = root / "etc/gpu-alloc"
    etc.mkdir(parents=True, exist_ok=True)
    write_sim_gpus(etc / "gpus.yaml", GPUS)
    example = (REPO / "deploy/config.example.yaml").read_text()
    (etc / "config.yaml").write_text(re.sub(r"(?m)^gpus: nvml$", "gpus: gpus.yaml", example))
    (root / "root/busybox.tar").write_bytes(busybox_rootfs_tar())
    # The simulated GPUs as CDI devices where dockerd 29 looks, for a build step to ask for.
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    uuids = [sim_gpu_uuid(k) for k in range(GPUS)]
    (root / "etc/cdi" / cdi.SPEC).write_text(json.dumps(cdi.spec(uuids)))


@pytest.fixture(scope="module")
def host() -> Iterator[systemd_root.Machine]:
    """A booted machine with gpu-alloc installed by deploy/install.sh and the docker
    context it names."""
    base = _require()
    work = Path(tempfile.mkdtemp(prefix="ga-inst-", dir="/tmp"))
    name = f"ga-inst-{os.getpid()}"
    binds = {"/src": REPO, "/wheels": work / "wheels", "/probe": work / "probe"}
    cgroup2 = systemd_root.SUITES[ENGINE.name] in systemd_root.CGROUP2_ONLY
    machine = systemd_root.Machine(base, work / "m", name, binds, cgroup2)
    try:
        _wheels(work / "wheels", base)
        (work / "probe").mkdir()
        if buildkit.probe_absent() is None:
            buildkit.probe_binary(work / "probe")
        _configure(machine.mount())
        machine.boot()
        machine.sh(f"docker import --change 'CMD [\"sh\"]' /root/busybox.tar {IMAGE}")
        done = machine.sh("bash /src/deploy/install.sh --wheels /wheels 2>&1", check=False,
                          timeout=300)  # fmt: skip
        assert done.returncode == 0, f"install.sh failed:\n{done.stdout}"
        # The context exactly as the installer tells users to make it.
        create = next(ln.strip() for ln in done.stdout.splitlines()
                      if ln.strip().startswith("docker context create gpu-alloc"))  # fmt: skip
        machine.sh(create)
        wait_for_shim(machine)
        yield machine
    finally:
        machine.destroy()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def gpus_of(host: systemd_root.Machine, container: str) -> list[str]:
    """The GPUs a running container was given (NVIDIA_VISIBLE_DEVICES as the driver set it)."""
    out = host.sh(f"docker exec {container} printenv NVIDIA_VISIBLE_DEVICES").stdout.strip()
    return out.split(",") if out else []


def status(host: systemd_root.Machine) -> dict:
    return json.loads(host.sh("gpu-alloc status --json").stdout)


def wait_for_shim(host: systemd_root.Machine) -> None:
    """Until the shim answers (its unit is Type=simple: started is not yet listening)."""
    wait = f"for i in $(seq 100); do {CTX} version >/dev/null 2>&1 && exit 0; sleep 0.2; done"
    log = "journalctl -u gpu-alloc-shim --no-pager -n 30"
    host.sh(f"{wait}; {CTX} version || {{ {log}; exit 1; }}", timeout=60)


def test_the_installer_leaves_both_units_running_and_dockerd_using_the_plugin(host) -> None:
    host.sh("systemctl is-active gpu-alloc-plugin.service gpu-alloc-shim.service docker.service")
    host.sh("systemctl is-enabled gpu-alloc-plugin.service gpu-alloc-shim.service")
    authz = host.sh("docker info --format '{{json .Plugins.Authorization}}'").stdout
    assert json.loads(authz) == ["gpu-alloc"]
    assert host.sh("readlink /usr/local/bin/gpu-alloc").stdout.strip() == f"{VENV}/bin/gpu-alloc"


def test_systemd_applies_the_units_sandbox(host) -> None:
    """Each service runs in a mount namespace of its own (PrivateTmp=, ProtectHome=,
    ProtectSystem=) with only the four capabilities its unit names: CAP_SYS_PTRACE reads
    dockerd's root, where bind sources are judged."""
    host.sh("mkdir -p /home/alice && touch /home/alice/probe /tmp/probe")
    for unit in ("gpu-alloc-plugin", "gpu-alloc-shim"):
        pid = host.sh(f"for i in $(seq 50); do p=$(systemctl show -p MainPID --value {unit});"
                      f" [ \"$(cat /proc/$p/comm)\" = gpu-alloc ] && break; sleep 0.1; done;"
                      " echo $p").stdout.strip()  # fmt: skip
        ns = host.sh(f"readlink /proc/{pid}/ns/mnt /proc/1/ns/mnt").stdout.split()
        assert ns[0] != ns[1], unit
        caps = host.sh(f"grep CapBnd /proc/{pid}/status").stdout.split()[1]
        # CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SYS_PTRACE
        assert int(caps, 16) == 0b1011 | 1 << 19, unit
        seen = host.sh(f"nsenter -t {pid} -m sh -c 'ls /home/alice/probe /tmp/probe;"
                       " touch /usr/probe'", check=False).stderr  # fmt: skip
        assert seen.count("No such file or directory") == 2, seen
        assert "Read-only file system" in seen, seen


def test_a_gpu_run_through_the_context_the_installer_names(host) -> None:
    out = host.sh(f"{CTX} run --rm --gpus 1 {IMAGE} printenv NVIDIA_VISIBLE_DEVICES").stdout
    assert out.strip() in {sim_gpu_uuid(k) for k in range(GPUS)}
    assert status(host)["free"] == GPUS  # --rm: the lease ended with the container


def test_a_gpu_run_on_the_real_socket_is_refused(host) -> None:
    done = host.sh(f"docker run --rm --gpus 1 {IMAGE} true", check=False)
    assert done.returncode != 0
    assert "authorization denied by plugin gpu-alloc" in done.stderr
    assert "without a gpu-alloc lease" in done.stderr  # why, and what to use instead:
    assert f"docker context create gpu-alloc --docker host=unix://{SHIM_SOCK}" in done.stderr
    assert host.sh(f"docker run --rm {IMAGE} echo plain").stdout.strip() == "plain"


def test_doctor_after_the_installer_finds_nothing_to_fix(host) -> None:
    """Every row ok on 29; on 20.10 the Engine's advisories may warn (docs/install.md)."""
    done = host.sh("gpu-alloc doctor", check=False, timeout=120)
    rows = [m.groups() for m in map(DOCTOR_ROW.match, done.stdout.splitlines()) if m]
    assert done.returncode == 0 and rows, done.stdout + done.stderr
    may_warn = () if ENGINE.name == "29" else ("Engine advisories",)
    wrong = [f"[{status}] {what}" for status, what in rows if status != "ok"
             and not (status == "warn" and what.startswith(may_warn))]  # fmt: skip
    assert wrong == [], done.stdout


@pytest.mark.parametrize("way", ["unix://", "upgrade://"])
def test_the_installers_builder_setting_keeps_gpus_out_of_build_steps(host, way: str) -> None:
    """BuildKit's own client asks a build step for every GPU on the real socket: on 29 by
    gRPC spoken natively, which no plugin sees, and by the `/grpc` upgrade the plugin lets
    by; only daemon.json's setting, written by the installer, makes BuildKit refuse."""
    if buildkit.probe_absent() is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the BuildKit probe cannot run under CI: {buildkit.probe_absent()}")
        pytest.skip(f"BuildKit probe not run: {buildkit.probe_absent()}")
    if way == "unix://" and ENGINE.name != "29":
        pytest.skip("gRPC on the Engine's socket is spoken by 29.2+ only")
    daemon = json.loads(host.sh("cat /etc/docker/daemon.json").stdout)
    assert daemon["builder"] == {"entitlements": {"device": False}}
    done = host.sh(f"{PROBE} {way}/run/docker.sock {IMAGE} nvidia.com/gpu=all",
                   check=False, timeout=180)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0 and buildkit.SAW not in out, out
    if ENGINE.name == "29":
        assert "granting entitlement device is not allowed" in out, out


@pytest.mark.parametrize("where", ["/tmp", "/home/alice"])
def test_a_bind_through_a_link_to_dev_is_refused(host, where: str) -> None:
    """The services see their own /tmp (PrivateTmp=) and an empty /home (ProtectHome=);
    dockerd sees the real ones and follows the link to the host's /dev."""
    link = f"{where}/devices"
    host.sh(f"mkdir -p {where} && ln -sfn /dev {link}")
    for ctx in ("docker", CTX):
        for source in ("/dev", link):
            done = host.sh(f"{ctx} run --rm -v {source}:/hostdev {IMAGE} ls /hostdev", check=False)
            assert done.returncode != 0, f"{ctx} -v {source}: /dev was mounted:\n{done.stdout}"
            assert "/dev" in done.stderr, done.stderr


@pytest.mark.parametrize(("role", "sock"), [("plugin", PLUGIN_SOCK), ("shim", SHIM_SOCK)])
def test_a_second_copy_refuses_to_start_and_the_unit_keeps_serving(host, role, sock) -> None:
    done = host.sh(f"timeout 30 gpu-alloc --config /etc/gpu-alloc/config.yaml {role}",
                   check=False, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"gpu-alloc {role} is already running on {sock}" in done.stderr
    host.sh(f"systemctl is-active gpu-alloc-{role}.service && test -S {sock}")
    out = host.sh(f"{CTX} run --rm --gpus 1 {IMAGE} printenv NVIDIA_VISIBLE_DEVICES").stdout
    assert out.strip().startswith("GPU-")


def test_a_shared_gpu_gets_one_mps_daemon_as_a_transient_unit_while_shares_are_out(host):
    """The shim, sandboxed by its unit, starts the MPS daemon of a shared GPU with
    `systemd-run` (a unit outside its own cgroup, /dev/shm bound by systemd) and has it
    quit once the last share ends."""
    config_path = host.root / "etc/gpu-alloc/config.yaml"
    original = config_path.read_text()
    config = yaml.safe_load(original)
    config["policy"]["sharing"] = {"gpus": [0], "shares": 4}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    fake = host.root / "usr/local/bin/nvidia-cuda-mps-control"  # mps.control, on PATH
    mps_control.install(fake, Path(MPS_LOG), shm_mark=True)
    gpu = sim_gpu_uuid(0)
    unit = f"gpu-alloc-mps-{gpu}.service"
    units = "systemctl list-units --all --plain --no-legend 'gpu-alloc-mps-*'"
    restart = "systemctl restart gpu-alloc-plugin gpu-alloc-shim"
    try:
        host.sh(restart)
        wait_for_shim(host)
        for name in ("quarter-a", "quarter-b"):
            host.sh(f"{CTX} run -d --name {name} --gpus 1 --label io.gpu-alloc.share=1/4"
                    f" {IMAGE} sleep 100000")  # fmt: skip
        assert gpus_of(host, "quarter-a") == gpus_of(host, "quarter-b") == [gpu]
        assert host.sh(f"systemctl is-active {unit}").stdout.strip() == "active"
        assert [ln.split()[0] for ln in host.sh(units).stdout.splitlines()] == [unit]
        calls = host.sh(f"cat {MPS_LOG}").stdout.splitlines()
        assert [c for c in calls if c.endswith("args=-d")] == [
            f"call gpu={gpu} pipe=/run/gpu-alloc/mps/{gpu}/pipe args=-d"
        ]
        # 81920 MiB / 4 and 100 % / 4, set on the daemon by its own index 0
        assert f"cmd gpu={gpu} set_default_device_pinned_mem_limit 0 20480M" in calls
        assert f"cmd gpu={gpu} set_default_active_thread_percentage 25" in calls
        host.sh(f"test -e /run/gpu-alloc/mps/{gpu}/shm/daemon-was-here")  # BindPaths=

        host.sh(f"{CTX} rm -f quarter-a quarter-b")
        host.sh(f"for i in $(seq 50); do [ -z \"$({units})\" ] && exit 0; sleep 0.2; done;"
                f" {units}; exit 1", timeout=30)  # fmt: skip
        assert f"cmd gpu={gpu} quit" in host.sh(f"cat {MPS_LOG}").stdout
    finally:
        host.sh(f"{CTX} rm -f quarter-a quarter-b", check=False)
        config_path.write_text(original)
        host.sh(restart)
        wait_for_shim(host)


def test_a_reboot_keeps_leases_and_brings_back_only_leased_gpu_containers(host) -> None:
    for name in ("train-a", "train-b"):
        host.sh(f"{CTX} run -d --name {name} --restart always --gpus 1 {IMAGE} sleep 100000")
    host.sh(f"{CTX} create --name parked --gpus 1 {IMAGE} true")
    before = {c: gpus_of(host, c) for c in ("train-a", "train-b")}
    leases_before = {le["container"]: le["gpus"] for le in status(host)["leases"]}

    host.stop()
    host.boot()
    wait_for_shim(host)

    running = host.sh("docker ps --format '{{.Names}}'").stdout.split()
    assert sorted(running) == ["train-a", "train-b"]
    after = {c: gpus_of(host, c) for c in running}
    assert after == before
    snap = status(host)
    leases = {le["container"]: le["gpus"] for le in snap["leases"]}
    assert leases == leases_before
    ids = {c: host.sh(f"docker inspect -f '{{{{.Id}}}}' {c}").stdout.strip() for c in running}
    for c, cid in ids.items():
        assert sorted(leases[cid]) == sorted(after[c])  # each runs on its own lease's GPUs
    held = [u for gpus in leases.values() for u in gpus]
    assert len(held) == len(set(held)) == 3  # nothing shares a GPU, the parked one included
    out = host.sh(f"{CTX} run --rm --gpus 1 {IMAGE} printenv NVIDIA_VISIBLE_DEVICES").stdout
    assert out.strip() not in held
    done = host.sh(f"{CTX} run --rm --gpus 2 {IMAGE} true", check=False)
    assert "asked for 2 GPUs, 1 of 4 free" in done.stderr
