"""`make test`'s runner: the whole suite on the host's Engine (its Engine-facing suites, its
other Engine tests and the rest, in parts of their own) and, in the same run, the
Engine-facing suites on dockerd 26, 28 and 29, as separate pytest processes in parallel.

Why parallel processes: each part mostly waits on its own dockerd (container starts,
Compose, stop timeouts), so three parts on two cores take little longer than the
longest alone; and an Engine's pytest process owns its `--engine`, so nothing in the
harness has to switch Engines mid-run.  Each part's output is printed whole when it
ends (never interleaved), and the last lines are pytest-style summaries, one per part
and one for all, so whatever reads pytest's last line still can.  The exit status is
non-zero if any part failed; a part whose Debian root the archive could not give
today is reported loudly (engine_root.ARCHIVE_BANNER) without failing the run, and so
is, in one line and without starting it, a part whose Engine's own binaries are absent
(29's, from the shared directory beside the checkout: engine_root.ABSENT_BANNER).

    python -m tests.run_engines                # what make test runs
    python -m tests.run_engines --engines 26,28,29 --engine-suites-only
    python -m tests.run_engines -- -k compose  # extra pytest arguments, for every part
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import engine_root

# The suites that talk to a real dockerd and whose behaviour could depend on its version.
ENGINE_SUITES = (
    "tests/engine/test_engine_harness.py",
    "tests/engine/test_engine_facts.py",
    "tests/engine/test_engine_differences.py",
    "tests/engine/test_dockerd_paths.py",  # a chrooted dockerd resolves paths in its own root
    "tests/engine/test_e2e.py",
    "tests/engine/test_enforcement_engine.py",
    "tests/engine/test_cdi_engine.py",  # CDI names as each Engine turns them
    "tests/engine/test_build_door.py",  # what a build step can reach on each Engine
    "tests/engine/test_lifecycle.py",
    "tests/engine/test_departures.py",  # destroy events as each Engine writes them (29: Actor)
    "tests/engine/test_compose.py",
    "tests/engine/test_cuda.py",  # image events (tag, rmi) keep the shim's image configs true
    "tests/engine/test_swarm.py",  # swarm's scheduler and constraint enforcer differ by version
    "tests/engine/test_swarm_gpu_alloc.py",
    "tests/engine/test_swarm_charge.py",  # real-socket services charged; socket binds
    "tests/engine/test_toolkit_gpus_engine.py",  # the toolkit's hook as each Engine runs it
    "tests/engine/test_bypass_engine.py",  # plugin mounts, root powers, sockets, pause
    "tests/engine/test_go_reading.py",  # what each Engine's Go reader stores of a spelling
    "tests/engine/test_go_forms.py",  # an attach's stdin as each Engine's Go reads it
    "tests/engine/test_protected_links_engine.py",  # links resolved in each dockerd's root
    "tests/engine/test_powers_engine.py",  # the allow-list of powers as each Engine stores them
    "tests/engine/test_sharing_engine.py",  # MPS shares, and the namespaces that reach them
    "tests/engine/test_dind_engine.py",  # a granted owner's dockerd in a privileged container
)
# The end-to-end GPU creates again with --gpus through CDI (tests/support/cdi.py), on the
# Engines that turn an nvidia request into CDI devices themselves.
CDI_SUITES = ("tests/engine/test_e2e.py",)
CDI_ENGINES = ("29",)
# The install tier (a booted systemd root) runs beside the whole suite, not inside it, on
# the first Engine and again on these (tests/support/systemd_root.py boots them).
INSTALL_TIER = "tests/installed"
INSTALL_ENGINES = ("29",)
ENGINE_TESTS = "tests/engine"
# The first Engine's share beyond its Engine-facing suites, in two parts so the run's tail
# keeps both cores busy: the tests that start no dockerd, and the other Engine tests.
REST_TITLES = {
    "rest": "the rest of the suite",
    "engine-rest": "its other Engine tests (first half)",
    "engine-rest-2": "its other Engine tests (second half)",
}
# The second half of those Engine tests: the longest of them (stop timeouts, restarts of
# dockerd, soak), about as long together as all the others.
ENGINE_REST_SECOND = (
    "tests/engine/test_faults.py",
    "tests/engine/test_soak.py",
    "tests/engine/test_name_race.py",
    "tests/engine/test_plugin_chain_engine.py",
    "tests/engine/test_report_engine.py",
    "tests/engine/test_restarts_engine.py",
    "tests/engine/test_doctor.py",
    "tests/engine/test_access_classes.py",
)
ARCHIVE_BANNER = engine_root.ARCHIVE_BANNER
BANNERS = (ARCHIVE_BANNER, engine_root.ABSENT_BANNER)
# pytest's last line: "2 failed, 915 passed in 758.76s (0:12:38)", framed by "=" without -q.
SUMMARY = re.compile(r"^=*\s*(\d+ \w+.*?) in ([0-9.]+)s(?: \([0-9:]+\))?\s*=*$")
# The counts of a pytest summary, in the order pytest prints them.
KINDS = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "errors")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


@dataclass
class Part:
    engine: str
    paths: tuple[str, ...]  # empty: the whole suite
    # A tier of its own ("install", "cdi", a REST_TITLES part), not the Engine's suites.
    tier: str = ""
    ignore: tuple[str, ...] = ()  # what the whole suite leaves to another part
    gpu_mode: str = "hook"  # how its dockerds give --gpus (tests/support/cdi.py)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    started: float = 0.0
    seconds: float = 0.0
    rc: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    summary: str = ""
    archive: str = ""

    @property
    def key(self) -> str:
        """Distinct per part: its log's and its basetemp's name."""
        return f"{self.engine}-{self.tier}" if self.tier else self.engine

    @property
    def title(self) -> str:
        what = REST_TITLES.get(self.tier, f"{self.tier} tier") if self.tier else ""
        return f"engine {self.engine}: {what or 'Engine-facing suites'}"


def start(part: Part, tmp: Path, extra: list[str]) -> None:
    part.log = tmp / f"engine-{part.key}.log"
    argv = [sys.executable, "-m", "pytest", "-q", f"--engine={part.engine}",
            f"--basetemp={tmp / ('pt-' + part.key)}", *part.paths,
            *(f"--ignore={path}" for path in part.ignore), *extra]  # fmt: skip
    if part.paths:  # the whole-suite part keeps pytest's cache (--lf); the others do not race it
        argv[3:3] = ["-p", "no:cacheprovider"]
    env = {**os.environ, "GA_ENGINE": part.engine, "GA_GPU_MODE": part.gpu_mode}
    part.started = time.monotonic()
    with open(part.log, "wb") as out:
        part.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def parse_summary(text: str) -> tuple[str, dict[str, int]]:
    """pytest's last summary line in `text`, and its counts by kind ("passed": 915, ...)."""
    for line in reversed(text.splitlines()):
        m = SUMMARY.match(line.strip())
        if m:
            counts: dict[str, int] = {}
            for n, kind in COUNT.findall(m.group(1)):
                key = {"error": "errors", "warning": "warnings"}.get(kind, kind)
                counts[key] = counts.get(key, 0) + int(n)
            return m.group(1), counts
    return "", {}


def total_line(parts: list[Part], seconds: float) -> str:
    """One pytest-style line for every part together, for whatever reads the last line."""
    counts: dict[str, int] = {}
    for part in parts:
        for k, n in part.counts.items():
            counts[k] = counts.get(k, 0) + n
    kinds = [*KINDS]
    said = ", ".join(f"{counts[k]} {k}" for k in kinds if counts.get(k))
    if any(p.rc != 0 for p in parts) and not counts.get("failed") and not counts.get("errors"):
        said = ", ".join(x for x in ("1 errors", said) if x)  # a part died without a summary
    engines = ", ".join(dict.fromkeys(p.engine for p in parts))
    bar = "=" * 20
    return f"{bar} {said or 'no tests ran'} in {seconds:.2f}s (engines {engines}) {bar}"


def finish(part: Part) -> None:
    assert part.proc is not None and part.log is not None
    part.rc = part.proc.returncode
    part.seconds = time.monotonic() - part.started
    text = part.log.read_text(errors="replace")
    part.summary, part.counts = parse_summary(text)
    banner = next((ln for ln in text.splitlines() if any(b in ln for b in BANNERS)), "")
    part.archive = banner.strip("! ")
    bar = "#" * 12
    print(f"\n{bar} {part.title} (exit {part.rc}, {part.seconds:.0f} s) {bar}", flush=True)
    sys.stdout.write(text)
    sys.stdout.flush()


def run(parts: list[Part], extra: list[str]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ga-run-", dir="/tmp"))
    t0 = time.monotonic()
    pending = []
    for part in parts:
        why = engine_root.binaries_absent(engine_root.lookup(part.engine))
        if why:  # not started: said once per Engine, in the summary; the run stays green
            part.rc, part.summary = 0, f"SKIPPED, {engine_root.ABSENT_BANNER}: {why}"
            continue
        start(part, tmp, extra)
        pending.append(part)
    while pending:
        for part in list(pending):
            assert part.proc is not None
            if part.proc.poll() is not None:
                finish(part)
                pending.remove(part)
        time.sleep(0.5)
    total = time.monotonic() - t0
    print("\n" + "=" * 30 + " engines " + "=" * 30)
    for part in parts:
        status = "ok" if part.rc == 0 else f"FAILED (exit {part.rc})"
        if part.proc is None:
            skipped = [p.title.removeprefix(f"engine {p.engine}: ") for p in parts
                       if p.engine == part.engine and p.proc is None]  # fmt: skip
            if skipped[0] == part.title.removeprefix(f"engine {part.engine}: "):
                print(f"!!! engine {part.engine} ({', '.join(skipped)}): {part.summary}")
            continue
        print(f"{part.title}: {part.summary or 'no summary'} in {part.seconds:.1f}s: {status}")
        if part.archive:
            print(f"!!! {part.title}: {part.archive}")
    if any(p.archive for p in parts):
        print("!!! Some Engine's root could not be built from the Debian archive today: "
              "its engine tests were SKIPPED (see above); the others ran.")  # fmt: skip
    ok = all(p.rc == 0 for p in parts)
    if ok:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    else:
        print(f"logs kept in {tmp}")
    print(total_line(parts, total))  # last, as pytest's own summary is
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="20.10,26,28,29",
                        help="comma-separated; the first runs the whole suite")  # fmt: skip
    parser.add_argument("--engine-suites-only", action="store_true",
                        help="the Engine-facing suites on every Engine, the first too")  # fmt: skip
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every pytest")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    whole = not args.engine_suites_only
    return run(plan(names, whole), args.pytest_args)


def plan(names: list[str], whole: bool) -> list[Part]:
    """The parts: the Engine-facing suites on every Engine; on the first, with `whole`, the
    rest of the suite (in the parts REST_TITLES names) and the install tier too, each in a
    part of its own (the whole suite in one part was the run's long pole, twice as long
    as any other), and the install tier again on INSTALL_ENGINES; and the CDI tier on the
    Engines that give --gpus through CDI.  The parts mostly wait on their dockerds, so more
    of them at once shortens the run's tail more than it slows its middle."""
    parts = [Part(n, ENGINE_SUITES) for n in names]
    if whole and names:
        parts[1:1] = [Part(names[0], (), tier="rest", ignore=(INSTALL_TIER, ENGINE_TESTS)),
                      Part(names[0], (ENGINE_TESTS,), tier="engine-rest",
                           ignore=(*ENGINE_SUITES, *ENGINE_REST_SECOND)),
                      Part(names[0], ENGINE_REST_SECOND, tier="engine-rest-2"),
                      Part(names[0], (INSTALL_TIER,), tier="install")]  # fmt: skip
    parts += [Part(n, CDI_SUITES, tier="cdi", gpu_mode="cdi") for n in names if n in CDI_ENGINES]
    if whole:
        parts += [Part(n, (INSTALL_TIER,), tier="install")
                  for n in names[1:] if n in INSTALL_ENGINES]  # fmt: skip
    return parts


if __name__ == "__main__":
    sys.exit(main())
