"""make test's runner reads each part's pytest summary and prints one for all."""

from __future__ import annotations

from pathlib import Path

from tests import run_engines
from tests.run_engines import Part
from tests.support import engine_root


def test_quiet_and_framed_summaries_are_both_read() -> None:
    quiet = "....F\nFAILED tests/x.py::t\n2 failed, 915 passed in 758.76s (0:12:38)\n"
    framed = "..\n=========== 100 passed, 3 skipped, 1 warning in 384.10s (0:06:24) ===========\n"
    assert run_engines.parse_summary(quiet) == (
        "2 failed, 915 passed",
        {"failed": 2, "passed": 915},
    )
    assert run_engines.parse_summary(framed)[1] == {"passed": 100, "skipped": 3, "warnings": 1}
    assert run_engines.parse_summary("Traceback ...\nKeyError\n") == ("", {})


def test_the_total_adds_every_part_and_a_dead_part_counts_as_an_error() -> None:
    a = Part("20.10", (), rc=1, counts={"failed": 1, "passed": 10})
    b = Part("26", ("t.py",), rc=0, counts={"passed": 5, "skipped": 2})
    line = run_engines.total_line([a, b], 12.0)
    assert line.startswith("=") and line.endswith("=")
    assert "1 failed, 15 passed, 2 skipped in 12.00s (engines 20.10, 26)" in line
    dead = Part("28", ("t.py",), rc=2)
    assert "1 errors, 5 passed" in run_engines.total_line([b, dead], 1.0)


def test_the_install_tier_runs_beside_the_whole_suite_not_inside_it() -> None:
    parts = run_engines.plan(["20.10", "26"], whole=True)
    suites, second = run_engines.ENGINE_SUITES, run_engines.ENGINE_REST_SECOND
    assert [(p.engine, p.paths, p.ignore) for p in parts] == [
        ("20.10", suites, ()),  # the whole suite, in parts: its Engine-facing suites,
        ("20.10", (), ("tests/installed", "tests/engine")),  # the tests that start no dockerd
        ("20.10", ("tests/engine",), (*suites, *second)),  # its other Engine tests, in
        ("20.10", second, ()),  # two halves
        ("20.10", ("tests/installed",), ()),
        ("26", suites, ()),
    ]
    assert len({p.key for p in parts}) == 6  # each its own log and basetemp
    assert parts[1].title == "engine 20.10: the rest of the suite"
    assert parts[2].title == "engine 20.10: its other Engine tests (first half)"
    assert parts[4].title == "engine 20.10: install tier"
    assert all(Path(path).is_file() and path not in suites for path in second)
    only = run_engines.plan(["20.10", "26"], whole=False)
    assert all(p.paths == run_engines.ENGINE_SUITES and not p.ignore for p in only)


def test_an_engine_without_its_binaries_is_one_line_and_the_run_stays_green(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(engine_root, "SHARED", tmp_path / "nowhere")
    assert run_engines.run(run_engines.plan(["29"], whole=False), []) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "engine 29" in ln]
    assert len(said) == 1
    assert said[0].startswith("!!! engine 29 (Engine-facing suites, cdi tier): SKIPPED")
    assert engine_root.ABSENT_BANNER in said[0] and str(tmp_path / "nowhere") in said[0]


def test_29_runs_the_end_to_end_creates_again_with_gpus_through_cdi() -> None:
    parts = run_engines.plan(["20.10", "28", "29"], whole=True)
    cdi = [(p.engine, p.paths, p.gpu_mode) for p in parts if p.tier == "cdi"]
    assert cdi == [("29", ("tests/engine/test_e2e.py",), "cdi")]
    assert all(p.gpu_mode == "hook" for p in parts if p.tier != "cdi")


def test_the_install_tier_boots_29_too_and_only_beside_the_whole_suite() -> None:
    parts = run_engines.plan(["20.10", "28", "29"], whole=True)
    install = [(p.engine, p.paths, p.title) for p in parts if p.tier == "install"]
    assert install == [("20.10", ("tests/installed",), "engine 20.10: install tier"),
                       ("29", ("tests/installed",), "engine 29: install tier")]  # fmt: skip
    assert len({p.key for p in parts}) == len(parts)
    assert not [p for p in run_engines.plan(["20.10", "29"], whole=False) if p.tier == "install"]


def test_make_test_runs_29_by_default() -> None:
    assert "ENGINES ?= 20.10,26,28,29" in Path("Makefile").read_text()
    assert 'default="20.10,26,28,29"' in Path(run_engines.__file__).read_text()
