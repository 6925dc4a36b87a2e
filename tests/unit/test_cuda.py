"""The CUDA compatibility check (nvidia-docker v1's): what an image needs, what is refused.

The real Engine's side is tests/engine/test_cuda.py."""

from __future__ import annotations

import pytest

from allocator.core.judging import cuda


@pytest.mark.parametrize(
    ("config", "env", "need"),
    [
        ({"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470"]}, [], (12, 4)),
        ({"Labels": {"com.nvidia.cuda.version": "11.8"}}, [], (11, 8)),
        ({"Env": ["CUDA_VERSION=12.1.1"]}, [], (12, 1)),
        ({"Env": ["CUDA_VERSION=12.1.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"]}, [], (12, 0)),
        ({"Env": ["PATH=/bin"]}, [], None),
        ({"Env": ["CUDA_VERSION=12.1"]}, ["NVIDIA_DISABLE_REQUIRE=1"], None),
        ({}, ["NVIDIA_REQUIRE_CUDA=cuda>=13.0"], (13, 0)),
    ],
    ids=["require", "v1-label", "cuda-version", "require-wins", "none", "disabled", "create-env"],
)
def test_the_required_cuda_version_is_read_like_the_toolkit(config, env, need):
    assert cuda.required(config, env) == need


def test_an_old_driver_is_refused_with_both_versions_and_a_fix():
    msg = cuda.refusal((12, 2), (12, 4), "nvidia/cuda:12.4.1-base")
    assert "driver supports CUDA 12.2 but image nvidia/cuda:12.4.1-base needs 12.4" in msg
    assert "NVIDIA_DISABLE_REQUIRE=1" in msg
    assert cuda.refusal((12, 4), (12, 4), "x") is None
    assert cuda.refusal(None, (12, 4), "x") is None
