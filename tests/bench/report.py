"""Statistics and the result table: fixed-width for the terminal, Markdown and JSON for files."""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from math import comb
from pathlib import Path

BOOTSTRAP = 2000  # resamples for `ratio_interval`


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p99(xs: Sequence[float]) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


def median_interval(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics that the
    binomial law of how many samples fall below it puts ``confidence`` between."""
    n, xs = len(xs), sorted(xs)
    tail, k = (1 - confidence) / 2, 0
    below = 0.0
    while k < n // 2 and below + comb(n, k) / 2**n <= tail:
        below += comb(n, k) / 2**n
        k += 1
    return xs[max(k - 1, 0)], xs[min(n - k, n - 1)]


def ratio_interval(xs: Sequence[float], ref: Sequence[float]) -> str:
    """A 95% interval for median(xs) / median(ref), by resampling whole rounds (a round
    visits every target in a random order, so a pair shares the machine's moment): a
    ratio near its line whose interval straddles it is a coin toss, not a verdict."""
    pairs = list(zip(xs, ref, strict=True))
    pick = random.Random(0)  # the same run prints the same interval
    ratios = sorted(
        median([x for x, _ in draw]) / median([r for _, r in draw])
        for draw in ([pick.choice(pairs) for _ in pairs] for _ in range(BOOTSTRAP))
    )
    tail = round(BOOTSTRAP * 0.025)
    return f"95% {ratios[tail]:.2f}-{ratios[-tail - 1]:.2f}x"


def difference_interval(xs: Sequence[float], ref: Sequence[float], per_round: int) -> str:
    """The difference of per-round medians (``per_round`` samples of each target a round,
    taken in the same round), its median and 95% interval, in ms."""
    rounds = range(0, min(len(xs), len(ref)), per_round)
    diffs = [median(xs[k : k + per_round]) - median(ref[k : k + per_round]) for k in rounds]
    low, high = median_interval(diffs)
    return f"round by round {median(diffs):+.3f} [{low:+.3f}, {high:+.3f}]"


@dataclass
class Row:
    scenario: str
    target: str
    median: float
    p99: float | None
    unit: str
    versus: str = ""  # the comparison, e.g. "+0.42 ms" or "0.81x"
    threshold: str = ""
    ok: bool | None = None  # None: informational, no target
    samples: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def result(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "MISS")


def _num(x: float | None, unit: str) -> str:
    if x is None or x != x:
        return "-"
    if unit == "ms":
        return f"{x:.3f} ms" if x < 10 else f"{x:.1f} ms"
    if unit == "x":
        return f"{x:.2f}x"
    if unit == "s":
        return f"{x:.3f} s"
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:.1f} {unit}"


HEADERS = ("Scenario", "Target", "Median", "p99", "vs bare / reference", "Threshold", "Result")


def _cells(r: Row) -> tuple[str, ...]:
    return (r.scenario, r.target, _num(r.median, r.unit), _num(r.p99, r.unit), r.versus,
            r.threshold, r.result)  # fmt: skip


def table(rows: Sequence[Row]) -> str:
    cells = [HEADERS, *(_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    lines = []
    for k, c in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: Sequence[Row]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for r in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |")
    return "\n".join(out)


def write(directory: Path, rows: Sequence[Row], meta: dict) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    js = directory / "latest.json"
    md = directory / "latest.md"
    js.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    header = (
        f"{'QUICK' if meta.get('quick') else 'Full'} run, {meta.get('date')}, "
        f"{meta.get('cpus')} CPUs, dockerd {meta.get('engine')}; "
        f"{meta.get('elapsed_s', 0):.0f} s.\n\n"
    )
    md.write_text(header + markdown(rows) + "\n")
    return js, md
