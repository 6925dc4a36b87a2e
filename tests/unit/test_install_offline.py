"""install.sh --wheels: the venv built with no package index (a host without PyPI).

Staged under DESTDIR like tests/unit/test_deploy.py; tests/installed/test_installed.py runs the real
offline install in a booted root.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_deploy import INSTALL, OPERATOR_DAEMON_JSON, run, snapshot, write_daemon_json


def test_wheels_install_from_the_directory_alone(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "gpu_alloc-0.1.0-py3-none-any.whl").write_bytes(b"")
    root = tmp_path / "root"
    write_daemon_json(root, OPERATOR_DAEMON_JSON)
    out = run(INSTALL, root, "--dry-run", "--wheels", str(wheels)).stdout
    pip = [ln for ln in out.splitlines() if "pip install" in ln]
    assert pip, out
    for line in pip:
        assert f"--no-index --find-links {wheels} " in line, line
    assert pip[-1].endswith("--force-reinstall --no-deps gpu-alloc")  # same version, new code


def test_wheels_without_gpu_allocs_own_are_refused_before_any_change(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pyyaml-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"")
    root = tmp_path / "root"
    write_daemon_json(root, OPERATOR_DAEMON_JSON)
    before = snapshot(root)
    proc = run(INSTALL, root, "--wheels", str(wheels), check=False)
    assert proc.returncode == 1
    assert f"no gpu_alloc-*.whl in {wheels}" in proc.stderr
    assert "pip wheel -w" in proc.stderr  # how to make them
    assert snapshot(root) == before
