"""Image configs kept between GPU creates, forgotten whenever an image name may move."""

from __future__ import annotations

import time

import pytest

from allocator.host import images
from allocator.host.images import ImageConfigs
from tests.support.fake_engine import FakeEngine

CUDA_12 = {"Config": {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.4"]}}
CUDA_13 = {"Config": {"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=13.0"]}}


def until(what, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def engine():
    fake = FakeEngine()
    fake.images["app"] = CUDA_12
    yield fake
    fake.stream_down = True
    fake.feed.put(None)


def watching(engine: FakeEngine, **kwargs) -> ImageConfigs:
    """Configs whose stream is open (the first read opens it, and is not kept)."""
    configs = ImageConfigs(engine, **kwargs)
    configs.config("app")
    until(lambda: configs.live)
    engine.calls.clear()
    return configs


def test_a_config_read_while_the_stream_is_open_is_read_once(engine):
    configs = watching(engine)
    assert configs.config("app") == CUDA_12["Config"]
    assert configs.config("app") == CUDA_12["Config"]
    assert engine.calls.count("image") == 1
    assert engine.opened[0][0] == {"type": ["image"]}


def test_the_first_read_opens_the_stream_and_is_not_kept(engine):
    configs = ImageConfigs(engine)
    configs.config("app")
    until(lambda: configs.live)
    configs.config("app")
    assert engine.calls.count("image") == 2


def test_any_image_event_forgets_what_was_kept(engine):
    configs = watching(engine)
    configs.config("app")
    engine.images["app"] = CUDA_13  # `docker tag app13 app`
    engine.event({"Type": "image", "Action": "tag", "id": "sha256:13"})
    assert configs.config("app") == CUDA_13["Config"]
    assert engine.calls.count("image") == 2


def test_a_read_an_event_overtook_is_not_kept(engine):
    configs = watching(engine)
    engine.during_image = lambda: engine.event({"Type": "image", "Action": "pull"})
    configs.config("app")
    engine.during_image = lambda: None
    configs.config("app")
    assert engine.calls.count("image") == 2


def test_nothing_is_kept_while_the_stream_is_down(engine):
    configs = watching(engine)
    configs.config("app")
    engine.stream_down = True
    engine.event(None)
    until(lambda: not configs.live)
    configs.config("app")
    configs.config("app")
    assert engine.calls.count("image") == 3


def test_the_stream_replays_what_dockerd_logged_while_it_subscribed(engine):
    watching(engine, wall=lambda: 1_000_000.5)
    assert engine.opened[0][1] == 999_999


def test_a_config_is_kept_no_longer_than_max_age(engine):
    now = [100.0]
    configs = watching(engine, clock=lambda: now[0])
    configs.config("app")
    now[0] += images.MAX_AGE - 0.1
    configs.config("app")
    now[0] += 0.2
    configs.config("app")
    assert engine.calls.count("image") == 2


def test_an_image_that_is_not_there_is_asked_again(engine):
    configs = watching(engine)
    assert configs.config("later") is None
    engine.images["later"] = CUDA_12  # `docker pull later`
    assert configs.config("later") == CUDA_12["Config"]
    assert engine.calls.count("image") == 2


def test_a_fresh_read_passes_over_what_was_kept(engine):
    """A BuildKit build can move a name with no event: a refusal reads the image again."""
    configs = watching(engine)
    configs.config("app")
    engine.images["app"] = CUDA_13  # `docker build -t app .`, no event
    assert configs.config("app") == CUDA_12["Config"]
    assert configs.config("app", fresh=True) == CUDA_13["Config"]
    assert configs.config("app") == CUDA_13["Config"]  # and what is kept now


def test_a_stream_refused_at_once_is_asked_again_ever_more_slowly(engine):
    configs = ImageConfigs(engine)
    engine.feed.put(None)  # the first stream ends at once: a 403 of a plugin, say
    engine.feed.put(None)
    configs.config("app")
    until(lambda: len(engine.opened) >= 3, seconds=5)
    gaps = [b - a for a, b in zip(engine.opened_at, engine.opened_at[1:], strict=False)]
    assert gaps[1] > gaps[0] * 1.5
