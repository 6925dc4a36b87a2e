"""`make bench-stages` stamps the running shim and plugin by name: the names must still
resolve, or the table would lose a stage without a word."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.bench import stages

SITE = Path(stages.__file__).parent / "stage_site" / "sitecustomize.py"


@pytest.fixture(scope="module")
def site():
    spec = importlib.util.spec_from_file_location("stage_sitecustomize", SITE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stamped_function_still_exists(site):
    for _role, module, attribute, how, _tag in site.POINTS:
        _holder, _name, fn = site.resolve(module, attribute)
        assert callable(fn), f"{module}.{attribute}"
        assert how in site.HOWS


def test_each_stage_in_the_table_is_stamped_by_someone(site):
    tags = {tag for *_, how, tag in site.POINTS}
    stamped = set()
    for tag in tags:
        stamped |= {tag, f"{tag} end", f"{tag} AuthZReq", f"{tag} AuthZRes"}
    driver_own = {"client sends", "client has it"}
    for name, _what in stages.STAGES:
        assert name in stamped | driver_own, name
    for start, _what in stages.BESIDE:
        assert {start, f"{start} end"} <= stamped, start


def test_only_a_gpu_alloc_role_is_stamped(site):
    assert site._role(["/venv/bin/gpu-alloc", "--config", "c.yaml", "shim"]) == "shim"
    assert site._role(["/venv/bin/gpu-alloc", "--config", "c.yaml", "plugin"]) == "plugin"
    assert site._role(["/venv/bin/gpu-alloc", "status"]) is None
    assert site._role(["/usr/bin/python3", "-m", "tests.bench.floor", "shim"]) is None
