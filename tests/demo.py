"""``make demo``: gpu-alloc on a throwaway Engine with 4 simulated GPUs, start to finish.

Shows what a user sees: five parallel ``docker run --gpus 1`` through the
gpu-alloc context (four distinct GPUs, one clear refusal), ``--gpus 1`` on the
real socket denied by the plugin, and ``gpu-alloc status`` before, during and
after.  Everything it starts is stopped and removed at the end.

`ENGINE=26 make demo` (or GA_ENGINE=28) runs the same on a newer dockerd from its
Debian root (tests/support/engine_root.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from tests.support import engine, engine_root

IMAGE = engine.BUSYBOX_TAG


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def show(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    sys.stdout.write(out.stdout + out.stderr)
    return out


def main() -> int:
    try:
        engine_root.selected()
    except ValueError as e:
        print(f"make demo: {e}", file=sys.stderr)
        return 1
    why = engine.missing_requirements()
    if why:
        print(f"make demo needs a private dockerd: {why}", file=sys.stderr)
        return 1
    which = engine_root.selected()
    origin = "the host's" if which.host else f"from a Debian {which.suite} root"
    say(f"Starting a throwaway Engine (dockerd {which.name}, {origin}) with the gpu-alloc "
        "plugin, the shim and 4 simulated GPUs")  # fmt: skip
    stack = engine.start_stack(gpus=4)
    config_dir = tempfile.mkdtemp(prefix="ga-demo-")
    env = {**os.environ, "DOCKER_CONFIG": config_dir}
    env.pop("DOCKER_HOST", None)
    status = [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "status"]
    try:
        show(["docker", "-H", f"unix://{stack.engine_sock}", "version", "--format",
              "Engine: dockerd {{.Server.Version}}, API {{.Server.APIVersion}}"], env)  # fmt: skip
        show(["docker", "context", "create", "gpu-alloc", "--docker",
              f"host=unix://{stack.shim_sock}"], env)  # fmt: skip
        say("gpu-alloc status (before)")
        show(status, env)

        say("Five parallel 'docker --context gpu-alloc run --rm --gpus 1' on four GPUs")
        cmd = ["docker", "--context", "gpu-alloc", "run", "--rm", "--gpus", "1", IMAGE,
               "sh", "-c", "echo granted $NVIDIA_VISIBLE_DEVICES; sleep 4"]  # fmt: skip
        print("$ " + " ".join(cmd) + "   (x5, in parallel)", flush=True)
        with ThreadPoolExecutor(5) as pool:
            futures = []
            for _ in range(5):
                futures.append(pool.submit(subprocess.run, cmd, capture_output=True,
                                           text=True, env=env, timeout=120))  # fmt: skip
                time.sleep(0.2)
            time.sleep(1.5)
            say("gpu-alloc status (while they run)")
            show(status, env)
            results = [f.result() for f in futures]
        say("What each of the five got")
        for n, r in enumerate(results, 1):
            text = (r.stdout or r.stderr).strip().splitlines()[0]
            print(f"  run {n}: {text}")
        granted = {r.stdout.split()[1] for r in results if r.returncode == 0}
        refused = [r for r in results if r.returncode != 0]
        print(f"\n  {len(granted)} distinct GPUs granted, {len(refused)} refused", flush=True)

        say("The same request on the real Engine socket, bypassing the shim")
        show(["docker", "-H", f"unix://{stack.engine_sock}", "run", "--rm", "--gpus", "1",
              IMAGE, "true"], env)  # fmt: skip

        say("gpu-alloc status (after: every GPU free again)")
        show(status, env)
        ok = len(granted) == 4 and len(refused) == 1
        say("Demo " + ("finished as expected" if ok else "did NOT behave as expected"))
        return 0 if ok else 1
    finally:
        stack.stop()
        subprocess.run(["rm", "-rf", config_dir], check=False)


if __name__ == "__main__":
    sys.exit(main())
