"""GPU utilisation over time: ``state_dir/samples/``, one mean per GPU per minute.

The shim's sampler (shim/metrics_server.py) adds each look at the GPUs; a minute's
samples are summed in ``current.json`` (read, added to and replaced under the store's
lock, `store.Lock`, at each sample, not fsync'd: a power cut costs at most a minute of
samples; a restarted shim, or a second one beside it, adds to the same minute and a
report sees it at once), and appended as one line to the day's file ``YYYY-MM-DD.jsonl``
(UTC), under the same lock, when the minute is over.  A reader takes no lock: it skips
a torn last line::

    {"t": 1764684000, "s": 60, "g": {"GPU-...": [0.853, 1.0]}}

(start, seconds, UUID -> [mean utilisation, share of samples in use]).  Day files
older than `KEEP_DAYS` are deleted as a new day begins, so the store stays a few
hundred kilobytes a day for eight GPUs.  A GPU whose utilisation the source cannot
say is not sampled: its time counts as unsampled, neither used nor idle.  Writing
is best effort: a full disk loses samples, never a GPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from allocator.core.machine.usage import Usage
from allocator.core.timing.report import Bucket
from allocator.host import store

log = logging.getLogger("gpu-alloc.samples")
BUCKET = 60.0
KEEP_DAYS = 35
CURRENT = "current.json"
LOCK = ".lock"
LOCK_TIMEOUT = 2.0  # the sampler looks every few seconds: a late lock skips one look


def _day(epoch: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


class Samples:
    def __init__(self, state_dir: str, bucket: float = BUCKET, keep_days: int = KEEP_DAYS) -> None:
        self.dir = Path(state_dir, "samples")
        self.bucket = bucket
        self.keep_days = keep_days
        self._lock = store.Lock(self.dir / LOCK, LOCK_TIMEOUT)

    def add(self, now: float, use: Mapping[str, Usage]) -> None:
        """One look at the GPUs: into this minute's sums, a finished minute to its day file.
        Best effort: a lock not had in time, like a full disk, loses this sample only."""
        try:
            self.dir.mkdir(mode=0o750, parents=True, exist_ok=True)
            with self._lock.held():
                self._add(now, use)
        except (OSError, store.StateError) as e:
            log.warning("samples: could not add a sample in %s: %s", self.dir, e)

    def _add(self, now: float, use: Mapping[str, Usage]) -> None:
        start = now - now % self.bucket
        current, sums = self._current_sums()
        if current is not None and current != start:
            self._append(current, sums)
            sums = {}
        for uuid, u in use.items():
            if u.utilization is None:
                continue
            s = sums.setdefault(uuid, [0.0, 0.0, 0.0])
            s[0] += u.utilization
            s[1] += 1.0 if u.active else 0.0
            s[2] += 1.0
        data = {"t": start, "s": self.bucket, "g": sums}
        store.replace(
            self.dir / CURRENT, json.dumps(data, separators=(",", ":")).encode(), sync=False
        )

    def read(self, since: float, until: float) -> dict[str, list[Bucket]]:
        """UUID -> its buckets overlapping ``[since, until)``, by start time."""
        found: dict[str, list[Bucket]] = {}
        for line in self._lines(since, until):
            start, seconds = float(line["t"]), float(line["s"])
            if start + seconds <= since or start >= until:
                continue
            for uuid, (util, active) in line["g"].items():
                found.setdefault(uuid, []).append(Bucket(start, seconds, util, active))
        for buckets in found.values():
            buckets.sort(key=lambda b: b.start)
        return found

    # ---------------------------------------------------------------- files

    def _lines(self, since: float, until: float) -> Iterator[dict[str, Any]]:
        first, last = _day(since - self.bucket), _day(until)
        try:
            names = sorted(p.name for p in self.dir.glob("*.jsonl"))
        except OSError:
            names = []
        for name in names:
            if not first <= name.removesuffix(".jsonl") <= last:
                continue
            with contextlib.suppress(OSError), open(self.dir / name) as f:
                for raw in f:
                    with contextlib.suppress(ValueError, TypeError):
                        yield _mean_line(json.loads(raw))
        current = self._read_current()
        if current is not None:
            yield current

    def _read_current(self) -> dict[str, Any] | None:
        try:
            data = json.loads(store.read(self.dir / CURRENT))
            return {
                "t": float(data["t"]),
                "s": float(data["s"]),
                "g": {u: _mean(*s) for u, s in data["g"].items() if s[2]},
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def _current_sums(self) -> tuple[float | None, dict[str, list[float]]]:
        """The minute ``current.json`` sums and its sums (None, {} when there is none)."""
        try:
            data = json.loads(store.read(self.dir / CURRENT))
            sums = {str(u): [float(x) for x in s] for u, s in data["g"].items()}
            return float(data["t"]), sums
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None, {}

    def _append(self, start: float, sums: dict[str, list[float]]) -> None:
        means = {u: [round(x, 4) for x in _mean(*s)] for u, s in sums.items() if s[2]}
        if not means:
            return
        line = {"t": start, "s": self.bucket, "g": means}
        path = self.dir / f"{_day(start)}.jsonl"
        try:
            fresh = not path.exists()
            with open(path, "a") as f:
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
            if fresh:
                self._prune(start)
        except OSError as e:
            log.warning("samples: could not write %s: %s", path, e)

    def _prune(self, now: float) -> None:
        oldest = _day(now - self.keep_days * 86400)
        for p in self.dir.glob("*.jsonl"):
            if p.name.removesuffix(".jsonl") < oldest:
                with contextlib.suppress(OSError):
                    p.unlink()


def _mean(util: float, active: float, n: float) -> tuple[float, float]:
    return util / n, active / n


def _mean_line(data: Any) -> dict[str, Any]:
    return {
        "t": float(data["t"]),
        "s": float(data["s"]),
        "g": {str(u): (float(v[0]), float(v[1])) for u, v in data["g"].items()},
    }
