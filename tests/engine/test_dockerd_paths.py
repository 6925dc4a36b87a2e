"""Paths judged where dockerd resolves them, whatever namespace gpu-alloc runs in.

The shipped units give the plugin and the shim a /tmp, /home and /root of their own
(PrivateTmp=, ProtectHome=), and a newer Engine here runs in a chroot of its own: a path
gpu-alloc looks up itself may name another file than the one dockerd mounts.  These
stacks run the plugin and the shim in such a sandbox (a private mount namespace with
empty tmpfs over /tmp, /home and /root, and the units' CapabilityBoundingSet), and make
every link where dockerd sees it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import docker.errors
import pytest
from docker.types import Mount

from tests.support import clients, engine
from tests.support.engine_root import selected
from tests.support.faults import IMAGE

SOCKS = ["engine_sock", "shim_sock"]

# PrivateTmp= and ProtectHome= as a mount namespace: each path in $@ up to "--" is kept
# (the stack's directory under /tmp, an interpreter under /root), everything else in
# /tmp, /home and /root is hidden.
SANDBOX = r"""
set -e
keep=()
while [ "$1" != -- ]; do keep+=("$1"); shift; done; shift
hold=$(mktemp -d /dev/shm/ga-sandbox.XXXXXX)
for i in "${!keep[@]}"; do mkdir "$hold/$i"; mount --bind "${keep[$i]}" "$hold/$i"; done
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /home
mount -t tmpfs -o mode=0700 tmpfs /root
for i in "${!keep[@]}"; do
  mkdir -p "${keep[$i]}"; mount --bind "$hold/$i" "${keep[$i]}"; umount "$hold/$i"
done
rm -r "$hold"
exec "$@"
"""


CHECKOUT = Path(__file__).resolve().parents[2]
DEPLOY = CHECKOUT / "deploy"
# What PrivateTmp= and ProtectHome= hide from the units.
HIDDEN = ("/tmp/", "/home/", "/root/")


def unit_capabilities() -> list[str]:
    """The capabilities both shipped units keep, as setpriv names them."""
    kept = []
    for name in ("gpu-alloc-plugin.service", "gpu-alloc-shim.service"):
        text = (DEPLOY / name).read_text()
        (line,) = (ln for ln in text.splitlines() if ln.startswith("CapabilityBoundingSet="))
        kept.append({c.lower().removeprefix("cap_") for c in line.partition("=")[2].split()})
    return sorted(set.intersection(*kept))


def kept(stack: engine.Stack) -> list[str]:
    """What the sandbox still shows: the stack's directory, and what the plugin and the
    shim run from (the interpreter, the venv, the checkout its editable install points
    into) where that lies in a hidden directory, as a clone in /tmp or a home does.  An
    installed gpu-alloc lives outside them; a test checkout may not."""
    wanted = [str(stack.dir.resolve())]
    for path in (sys.base_prefix, sys.prefix, str(CHECKOUT)):
        real = os.path.realpath(path)
        if real.startswith(HIDDEN):
            wanted.append(real)
    out: list[str] = []
    for path in sorted(set(wanted), key=len):  # one bind for a directory and what it holds
        if not any(path == o or path.startswith(o + "/") for o in out):
            out.append(path)
    return out


def sandboxed(stack: engine.Stack, without: str = "") -> engine.Stack:
    """The stack's plugin and shim run as the units run them (``without`` one capability)."""
    keep = kept(stack)
    caps = ",".join(["-all", *(f"+{c}" for c in unit_capabilities() if c != without)])
    stack.launcher = ["unshare", "-m", "--propagation", "private", "bash", "-c", SANDBOX, "sandbox",
                      *keep, "--", "setpriv", f"--bounding-set={caps}", "--inh-caps=-all",
                      "--no-new-privs"]  # fmt: skip
    return stack


def make_stack() -> engine.Stack:
    return sandboxed(engine.Stack(gpus=2))


def inside(stack: engine.Stack, path: str) -> Path:
    """``path`` as dockerd sees it, reached from here through its root."""
    assert stack.dockerd is not None and stack.dockerd.proc is not None
    return Path(f"/proc/{stack.dockerd.proc.pid}/root{path}")


@pytest.fixture
def place(stack, tmp_path):
    """Directories of this test in dockerd's /tmp and in a home directory (root's)."""
    made = []

    def make(top: str) -> str:
        path = f"{top}/ga-paths-{os.getpid()}-{len(made)}-{tmp_path.name}"[:80]
        inside(stack, path).mkdir()
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(inside(stack, path), ignore_errors=True)


def api_on(stack: engine.Stack, sock: str):
    return engine.engine_api(getattr(stack, sock))


def refused(call, *args, match: str, **kwargs) -> str:
    with pytest.raises(docker.errors.APIError) as e:
        call(*args, **kwargs)
    assert e.value.status_code == 403, e.value
    assert match in str(e.value), e.value
    return str(e.value)


def bind(api, source: str):
    hc = api.create_host_config(binds={source: {"bind": "/x"}}, network_mode="none")
    return api.create_container(IMAGE, ["true"], host_config=hc)


@pytest.mark.parametrize("sock", SOCKS)
@pytest.mark.parametrize("top", ["/tmp", "/root"])
def test_a_link_to_the_state_directory_is_refused_though_gpu_alloc_cannot_see_it(
    stack, place, sock, top
):
    link = place(top) + "/link"
    inside(stack, link).symlink_to(stack.state_dir)
    refused(
        bind, api_on(stack, sock), link, match=f"bind mount of {link} exposes {stack.state_dir}"
    )


@pytest.mark.parametrize("sock", SOCKS)
def test_a_chain_of_links_through_tmp_and_home_is_followed_in_dockerds_root(stack, place, sock):
    tmp, home = place("/tmp"), place("/root")
    inside(stack, f"{tmp}/first").symlink_to(f"{home}/second")
    inside(stack, f"{home}/second").symlink_to(os.path.relpath(stack.state_dir.parent, home))
    source = f"{tmp}/first/{stack.state_dir.name}"
    refused(bind, api_on(stack, sock), source, match=f"exposes {stack.state_dir}")


@pytest.mark.parametrize("sock", SOCKS)
def test_a_link_to_a_harmless_directory_still_binds(stack, place, sock):
    tmp, home = place("/tmp"), place("/root")
    inside(stack, f"{tmp}/data").symlink_to(home)
    api = api_on(stack, sock)
    api.remove_container(bind(api, f"{tmp}/data")["Id"])


@pytest.mark.parametrize("sock", SOCKS)
def test_a_device_path_through_a_link_in_tmp_is_named_as_the_link_it_is(
    stack, place, sock, tmp_path
):
    link = place("/tmp") + "/gpu"
    inside(stack, link).symlink_to("/dev/null")
    hc = api_on(stack, sock).create_host_config(devices=[f"{link}:/dev/x"], network_mode="none")
    refused(api_on(stack, sock).create_container, IMAGE, ["true"], host_config=hc,
            match=f"PathOnHost {link} is a link to /dev/null")  # fmt: skip


@pytest.mark.parametrize("sock", SOCKS)
def test_a_local_volume_binding_a_link_to_the_state_directory_is_refused(stack, place, sock):
    link = place("/tmp") + "/link"
    inside(stack, link).symlink_to(stack.state_dir)
    opts = {"type": "none", "o": "bind", "device": link}
    refused(api_on(stack, sock).create_volume, f"ga-{os.getpid()}", driver_opts=opts,
            match=f"a bind of {link} exposes {stack.state_dir}")  # fmt: skip


@pytest.mark.parametrize("sock", SOCKS)
def test_a_mount_of_a_link_to_the_state_directory_is_refused(stack, place, sock):
    link = place("/root") + "/link"
    inside(stack, link).symlink_to(stack.state_dir)
    api = api_on(stack, sock)
    hc = api.create_host_config(mounts=[Mount("/x", link, type="bind")], network_mode="none")
    refused(api.create_container, IMAGE, ["true"], host_config=hc,
            match=f"bind mount of {link} exposes {stack.state_dir}")  # fmt: skip


@pytest.mark.skipif(not selected().host, reason="the CLI's cwd is not dockerd's path there")
def test_a_relative_mount_source_the_cli_makes_absolute_is_judged_by_its_link(stack, place):
    here = place("/tmp")
    os.symlink(stack.state_dir, f"{here}/link")
    run = ["create", "--network", "none", "--mount", "type=bind,src=./link,dst=/x", IMAGE]
    done = clients.docker_cli(stack.shim_sock, *run, "true", cwd=here)
    assert done.returncode != 0
    assert f"bind mount of {here}/link exposes {stack.state_dir}" in done.stderr


@pytest.mark.skipif(selected().host, reason="the host's dockerd shares the host's paths")
@pytest.mark.parametrize("sock", SOCKS)
def test_a_link_that_only_dockerds_namespace_has_is_judged_by_what_dockerd_sees(stack, sock):
    """dockerd's /run is a tmpfs of its own mount namespace: nothing of it is on the host."""
    link = f"/run/ga-only-dockerd-{os.getpid()}"
    inside(stack, link).symlink_to(stack.state_dir)
    try:
        assert not os.path.lexists(link)
        refused(bind, api_on(stack, sock), link, match=f"exposes {stack.state_dir}")
    finally:
        inside(stack, link).unlink()


def test_a_dockerd_started_again_is_asked_under_its_new_pid(stack, place):
    api = api_on(stack, "engine_sock")
    api.remove_container(bind(api, place("/tmp"))["Id"])  # the plugin knows dockerd's pid now
    before = stack.dockerd.proc.pid
    stack.dockerd.stop(remove=False)
    stack.dockerd = stack._new_dockerd().start()
    assert stack.dockerd.proc.pid != before
    tmp = place("/tmp")  # a root Engine's /tmp is its namespace's own: made again
    inside(stack, f"{tmp}/data").mkdir()
    inside(stack, f"{tmp}/link").symlink_to(stack.state_dir)
    for sock in SOCKS:
        api = api_on(stack, sock)
        api.remove_container(bind(api, f"{tmp}/data")["Id"])
        refused(bind, api, f"{tmp}/link", match=f"exposes {stack.state_dir}")


@pytest.fixture
def blind_stack():
    """A stack whose plugin and shim lack CAP_SYS_PTRACE: dockerd's root is unreadable."""
    stack = sandboxed(engine.Stack(gpus=1), without="sys_ptrace").start()
    yield stack
    stack.stop()


@pytest.mark.parametrize("sock", SOCKS)
def test_without_dockerds_root_binds_are_refused_and_the_rest_works(blind_stack, tmp_path, sock):
    api = api_on(blind_stack, sock)
    why = refused(bind, api, str(tmp_path), match=f"bind source {tmp_path} cannot be judged")
    assert "CAP_SYS_PTRACE" in why
    hc = api.create_host_config(mounts=[Mount("/x", "", type="tmpfs")], network_mode="none")
    api.remove_container(api.create_container(IMAGE, ["true"], host_config=hc)["Id"])


@pytest.fixture
def container_root(stack):
    """``/proc/<pid>/root/l`` of a running container in which ``/l`` links to the stack's
    directory: readlink says ``/`` for that root, but the kernel enters the container's
    root, where the absolute link is then followed from dockerd's own."""
    api = api_on(stack, "engine_sock")
    hc = api.create_host_config(network_mode="none")
    cid = api.create_container(IMAGE, ["sh", "-c", f"ln -s {stack.dir} /l; sleep 300"],
                               host_config=hc)["Id"]  # fmt: skip
    api.start(cid)
    pid = api.inspect_container(cid)["State"]["Pid"]
    yield f"/proc/{pid}/root/l"
    api.remove_container(cid, force=True)


@pytest.mark.parametrize("sock", SOCKS)
def test_a_path_through_a_processs_root_in_proc_is_refused(stack, container_root, sock):
    api = api_on(stack, sock)
    state = f"{container_root}/{stack.state_dir.name}"
    refused(bind, api, state, match=f"{state} cannot be judged")
    refused(bind, api, state, match="a link in /proc")
    hc = api.create_host_config(mounts=[Mount("/x", container_root, type="bind")],
                                network_mode="none")  # fmt: skip
    refused(api.create_container, IMAGE, ["true"], host_config=hc, match="a link in /proc")
    opts = {"type": "none", "o": "bind", "device": container_root}
    refused(api.create_volume, f"ga-proc-{os.getpid()}", driver_opts=opts,
            match="a link in /proc")  # fmt: skip


@pytest.mark.parametrize("sock", SOCKS)
def test_a_bind_source_is_judged_as_dockerd_cleans_it_not_through_its_link(stack, place, sock):
    """dockerd mounts ``<dir>/lnk/../state`` as ``<dir>/state`` (Go's path.Clean, before
    any link is followed): walking ``lnk`` first would judge a harmless directory."""
    lnk = f"{stack.dir}/lnk-{sock}"
    inside(stack, lnk).symlink_to(place("/tmp"))
    source = f"{lnk}/../{stack.state_dir.name}"
    refused(bind, api_on(stack, sock), source, match=f"exposes {stack.state_dir}")
    hc = api_on(stack, sock).create_host_config(
        mounts=[Mount("/x", source, type="bind")], network_mode="none"
    )
    refused(api_on(stack, sock).create_container, IMAGE, ["true"], host_config=hc,
            match=f"exposes {stack.state_dir}")  # fmt: skip
