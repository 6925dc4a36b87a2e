"""What the Engine and the host are, as decisions read them (allocator/core/facts.py)."""

from __future__ import annotations

import pytest

from allocator.core.facts import EngineView


@pytest.mark.parametrize(
    ("text", "version"),
    [("20.10.24+dfsg1", (20, 10, 24)), ("28.5.2", (28, 5, 2)), ("27.3.0-rc.1", (27, 3, 0)),
     ("dev", None), ("", None), ("1.2", None)],
)  # fmt: skip
def test_the_engine_version_is_read_from_what_the_engine_says(text, version):
    assert EngineView.from_info({}, {"Version": text}).version == version


def test_the_engine_view_names_the_authorization_plugins_dockerd_consults():
    info = {"DefaultRuntime": "runc", "Plugins": {"Authorization": ["gpu-alloc"]}}
    assert EngineView.from_info(info).authz_plugins == ("gpu-alloc",)
    assert EngineView.from_info({"Plugins": {"Authorization": None}}).authz_plugins == ()


def test_a_runtime_is_nvidias_by_its_name_or_its_binary_and_the_default_counts() -> None:
    info = {
        "DefaultRuntime": "crun",
        "Runtimes": {"runc": {}, "gpu": {"path": "/usr/bin/nvidia-container-runtime"}},
    }
    view = EngineView.from_info(info)
    assert view.nvidia_runtimes == {"gpu"}
    assert view.is_nvidia("gpu") and not view.is_nvidia("runc") and not view.default_is_nvidia
    assert EngineView.from_info({"DefaultRuntime": "nvidia"}).default_is_nvidia


def test_a_daemon_json_edit_counts_before_dockerd_reloads_it() -> None:
    running = EngineView.from_info({"Plugins": {"Authorization": ["gpu-alloc"]}})
    edited = EngineView.from_daemon_json(
        {"default-runtime": "nvidia", "authorization-plugins": ["gpu-alloc", "other"]}
    )
    judged = running.with_pending(edited)
    assert judged.default_is_nvidia
    assert judged.authz_chain == ("gpu-alloc", "other")
    assert running.with_pending(EngineView()).default_runtime == "runc"


def test_count_zero_is_void_only_on_engines_that_pin_it_themselves() -> None:
    assert not EngineView(version=(27, 2, 9)).count_zero_is_void
    assert EngineView(version=(27, 3, 0)).count_zero_is_void
    assert not EngineView().count_zero_is_void  # unknown: judged as the oldest
