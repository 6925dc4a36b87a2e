"""Images' configs, kept between GPU creates while no image name moves.

Every GPU create checks the image's CUDA against the driver's (allocator/core/judging/cuda.py),
and reading it is an image inspect: a round trip through dockerd and its authorization
plugin on the path of each create.  An image's config never changes, but a
name may come to mean another image (a pull, tag, load, import, build or removal).
dockerd logs an image event for most of these; not for a BuildKit build on 20.10, nor
for builds and prunes of the containerd image store on 26 (moby's exporters tag
directly), hence rules 3 and 5.

Rules
-----
1. A config is kept only when it was read while the Engine's image event stream was
   open, and no image event came between the read's start and its end.
2. Any image event forgets every config kept; so does the stream ending.  The stream
   is opened with ``since`` a moment before, so an event dockerd logged while it was
   subscribing us is replayed, not lost.
3. Nothing is kept longer than `MAX_AGE`: the check is the early, readable form of the
   one the toolkit's hook makes at start, and an image store changed behind dockerd's
   back (containerd's tools) is seen within that.
4. An image that is not there is not kept (dockerd answers that create itself).
5. A kept config is never the reason for a refusal: the caller reads it again
   (``fresh``) before it refuses, so a name moved without an event can delay no create.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("gpu-alloc.images")
MAX_AGE = 30.0  # seconds a config is kept at most (rule 3)
MAX_KEPT = 256  # names kept at once; past that, all are forgotten
BACKOFF_MAX = 30.0
STEADY = 10.0  # seconds a stream stays open to count as working (its backoff starts again)


class ImageEngine(Protocol):
    def image(self, name: str) -> dict[str, Any] | None: ...

    def events(self, filters: dict[str, list[str]], since: int | None = None) -> Any: ...


# A name, a loop until its stop is set, what wakes it to stop: `Background.add`.
Starter = Callable[[str, Callable[[threading.Event], None], Callable[[], None]], None]


def _thread(name: str, loop: Callable[[threading.Event], None], wake: object) -> None:
    """Without the service's owner of background work (a test): a thread of its own."""
    threading.Thread(target=loop, args=(threading.Event(),), name=name, daemon=True).start()


def _abort(stream: object) -> None:
    """An Engine stream's `abort` (a stand-in's iterator has none)."""
    abort = getattr(stream, "abort", None)
    if abort is not None:
        abort()


class ImageConfigs:
    def __init__(
        self,
        engine: ImageEngine,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        start: Starter | None = None,
    ):
        self.engine = engine
        self._start = start or _thread  # the service's: `Background.add`
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, dict[str, Any]]] = {}
        self._generation = 0  # moves at every image event and every open or end of the stream
        self._live = False
        self._watching = False
        self._stream: object = None  # the image event stream being followed

    @property
    def live(self) -> bool:
        """Is the image event stream open (so what is read now may be kept)?"""
        return self._live

    def config(self, name: str, fresh: bool = False) -> dict[str, Any] | None:
        """The image's ``Config`` (its env and labels), or None when it is not there;
        ``fresh``: read from the Engine now, whatever is kept (rule 5)."""
        with self._lock:
            kept = self._kept.get(name)
            if kept is not None and not fresh and self._clock() < kept[0]:
                return kept[1]
            generation, live = self._generation, self._live
            if not self._watching:
                self._watching = True
                self._start("image-events", self._watch, self._wake)
        info = self.engine.image(name)
        if info is None:
            return None
        config = info.get("Config") or {}
        with self._lock:
            if live and self._generation == generation:
                if len(self._kept) >= MAX_KEPT:
                    self._kept.clear()
                self._kept[name] = (self._clock() + MAX_AGE, config)
        return config

    def _moved(self, live: bool) -> None:
        with self._lock:
            self._generation += 1
            self._kept.clear()
            self._live = live

    def _wake(self) -> None:
        """End the stream being followed, so `_watch` sees its stop now."""
        _abort(self._stream)

    def _watch(self, stop: threading.Event) -> None:
        """The image event stream, opened again whenever it ends: half a second later
        after one that brought events or stayed open a while, else with a growing
        backoff (a stream refused or cut at once must not become two requests a second)."""
        backoff = 0.5
        while not stop.is_set():
            opened = self._clock()
            try:
                stream = self._stream = self.engine.events(
                    {"type": ["image"]}, since=int(self._wall()) - 1
                )
                if stop.is_set():
                    _abort(stream)
                self._moved(live=True)
                for _ in stream:
                    self._moved(live=True)
                    backoff = 0.5
            except Exception as e:  # the Engine went away: nothing is kept until it is back
                log.info("image event stream ended: %s", e)
            if self._clock() - opened > STEADY:
                backoff = 0.5
            self._moved(live=False)
            stop.wait(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)
