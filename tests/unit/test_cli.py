"""The gpu-alloc command line: where options go, --version, doctor without root."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from allocator.ops import cli


def test_options_are_accepted_after_the_subcommand_as_well_as_before(tmp_path, capsys):
    missing = str(tmp_path / "nope.yaml")
    for argv in (["--config", missing, "status"], ["status", "--config", missing]):
        assert cli.main(argv) == cli.EXIT_CONFIG
        assert f"{missing}: no such config file" in capsys.readouterr().err


def test_an_option_before_the_subcommand_is_not_undone_after_it():
    args = cli._parser().parse_args(["--config", "/x.yaml", "-v", "status", "--json"])
    assert args.config == "/x.yaml" and args.verbose and args.json
    args = cli._parser().parse_args(["status", "-v", "--config", "/y.yaml"])
    assert args.config == "/y.yaml" and args.verbose


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("gpu-alloc ")


def test_doctor_without_root_says_to_use_sudo(monkeypatch, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert cli.main(["doctor", "--config", str(config)]) == cli.EXIT_FAIL
    err = capsys.readouterr().err
    assert "sudo gpu-alloc doctor" in err and "fix" not in err


def test_explain_without_a_config_could_not_check(tmp_path, capsys):
    assert cli.main(["explain", "--config", str(tmp_path / "nope.yaml")]) == 1
    assert "no such config file" in capsys.readouterr().err


def test_a_reader_that_stops_early_gets_no_broken_pipe_error(tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("".join(f"- {{uuid: GPU-{i:08x}, index: {i}}}\n" for i in range(400)))
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\ngpus: {gpus}\n")
    argv = [sys.executable, "-m", "allocator.ops.cli", "--config", str(config), "status"]
    cli_ = subprocess.Popen([*argv, "--json", "--no-reconcile"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert cli_.stdout is not None and cli_.stdout.read(10)
    cli_.stdout.close()  # `| head -c 10`
    assert cli_.wait(60) == 0
    assert b"Broken pipe" not in (cli_.stderr.read() if cli_.stderr else b"")


def test_a_docker_group_user_is_told_which_commands_ask_the_shim(monkeypatch, tmp_path, capsys):
    # history reads the audit trail in the state directory, and no shim is asked for it
    state = tmp_path / "state"
    state.mkdir()
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("- {uuid: GPU-00000000, index: 0}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state}\ngpus: {gpus}\n")
    monkeypatch.setattr(cli.os, "access", lambda *a: False)  # not root
    (state / "audit.jsonl").mkdir()  # stands for a trail they cannot read
    assert cli.main(["history", "--config", str(config)]) == cli.EXIT_FAIL
    err = capsys.readouterr().err
    assert f"reads gpu-alloc's state directory ({state}), which is root's: run it with sudo" in err
    assert "'gpu-alloc status', 'gpus' or 'explain', which ask the gpu-alloc socket" in err


@pytest.mark.parametrize("gpus", ["\u00b2", "count=\u00b2", "9" * 5000, "device=0\rx"])
def test_explain_refuses_a_gpus_it_cannot_read_without_a_traceback(tmp_path, capsys, gpus):
    gpus_file = tmp_path / "gpus.yaml"
    gpus_file.write_text("- {uuid: GPU-00000000, index: 0}\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\ngpus: {gpus_file}\n")
    code = cli.main(["explain", "--config", str(config), "--gpus", gpus, "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 3 and answer["verdict"] == "invalid", answer
