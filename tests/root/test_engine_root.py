"""The Debian-root Engines' harness where it needs root: only the held mount namespace is killed."""

from __future__ import annotations

import os
import subprocess
import time

from tests.support import engine_root


def test_only_the_held_namespace_is_killed() -> None:
    inside = subprocess.Popen(["unshare", "-m", "sleep", "60"])
    outside = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while engine_root.mount_namespace(inside.pid) == engine_root.mount_namespace(os.getpid()):
            assert time.monotonic() < deadline, "unshare did not take effect"
            time.sleep(0.05)
        held = engine_root.hold_namespace(inside.pid)
        try:
            assert engine_root.kill_namespace(held) == [inside.pid]
        finally:
            os.close(held or 0)
        assert inside.wait(10) == -9 and outside.poll() is None
    finally:
        for p in (inside, outside):
            p.kill()
            p.wait()
