"""allocator.host.samples: per-minute utilisation means per GPU, kept by day and pruned."""

from __future__ import annotations

import json
from pathlib import Path

from allocator.core.machine.usage import Process, Usage
from allocator.host.samples import Samples

A, B = "GPU-aaaa", "GPU-bbbb"
DAY = 86400.0


def busy(util: float) -> Usage:
    return Usage(utilization=util, processes=(Process(1),) if util else ())


def test_a_minute_is_one_mean_per_gpu_and_is_readable_before_it_ends(tmp_path: Path) -> None:
    s = Samples(str(tmp_path))
    s.add(10 * DAY + 5, {A: busy(1.0), B: busy(0.0)})
    s.add(10 * DAY + 35, {A: busy(0.5), B: Usage(utilization=None)})
    [a] = s.read(10 * DAY, 10 * DAY + 60)[A]
    assert (a.start, a.seconds, a.utilization, a.active) == (10 * DAY, 60.0, 0.75, 1.0)
    [b] = s.read(10 * DAY, 10 * DAY + 60)[B]
    assert (b.utilization, b.active) == (0.0, 0.0)  # its unknown sample is not counted


def test_finished_minutes_go_to_the_day_file_and_a_new_sampler_resumes_the_minute(
    tmp_path: Path,
) -> None:
    s = Samples(str(tmp_path))
    s.add(10 * DAY + 5, {A: busy(1.0)})
    s.add(10 * DAY + 65, {A: busy(0.0)})
    again = Samples(str(tmp_path))  # a restarted shim, within the same minute
    again.add(10 * DAY + 95, {A: busy(1.0)})
    got = again.read(10 * DAY, 10 * DAY + 120)[A]
    assert [(b.start, b.utilization) for b in got] == [(10 * DAY, 1.0), (10 * DAY + 60, 0.5)]
    [line] = (tmp_path / "samples" / "1970-01-11.jsonl").read_text().splitlines()
    assert json.loads(line) == {"t": 10 * DAY, "s": 60.0, "g": {A: [1.0, 1.0]}}


def test_day_files_older_than_the_keep_are_deleted_as_a_new_day_begins(tmp_path: Path) -> None:
    s = Samples(str(tmp_path), keep_days=2)
    for day in range(5):
        s.add(day * DAY + 5, {A: busy(1.0)})
        s.add(day * DAY + 65, {A: busy(1.0)})
    days = sorted(p.name for p in (tmp_path / "samples").glob("*.jsonl"))
    assert days == ["1970-01-03.jsonl", "1970-01-04.jsonl", "1970-01-05.jsonl"]
    assert s.read(0, DAY) == {}


def test_two_samplers_at_once_add_to_one_minute_and_lose_no_sample(tmp_path: Path) -> None:
    """Each sample is read, added to and written under the store's lock, so a second shim
    (or a thread of another) beside the first never overwrites the minute's sums."""
    import threading

    first, second = Samples(str(tmp_path)), Samples(str(tmp_path))

    def sample(s: Samples, util: float) -> None:
        for i in range(50):
            s.add(10 * DAY + i % 60 * 0.5, {A: busy(util)})

    threads = [
        threading.Thread(target=sample, args=(s, u)) for s, u in ((first, 1.0), (second, 0.0))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    current = json.loads((tmp_path / "samples" / "current.json").read_text())
    assert current["g"][A] == [50.0, 50.0, 100.0]  # 100 samples, half of them in use
