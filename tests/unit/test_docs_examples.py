"""The docs' examples as written: every ``io.gpu-alloc.*`` label is read as gpu-alloc
reads it, every config snippet loads, every command line parses and every flag the prose
names exists, and the messages the docs quote are the product's."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from allocator.core.api import labels
from allocator.core.machine.inventory import GPU
from allocator.core.rules import policy, sharing
from allocator.core.rules.policy import Invalid, Owner, Rules
from allocator.host import config as configmod
from allocator.ops import cli

ROOT = Path(__file__).parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
TEXT = {p.name: p.read_text() for p in DOCS}

# Examples the docs give as refused, or as a pattern to fill in (KEY=VALUE in a table).
NOT_EXAMPLES = {
    "io.gpu-alloc.request.cpus=²",  # policy.md: how a bad number is refused
    "io.gpu-alloc.request.cpus=N",
    "io.gpu-alloc.share=N/D",
    "io.gpu-alloc.pool=NAME",
    "io.gpu-alloc.memory=SIZE",
}
SET_BY_GPU_ALLOC = (labels.OWNER, labels.ENGINE_SOCKET)  # named in the docs, never asked for


def label_examples() -> list[tuple[str, str, str]]:
    """(doc, key, value) of each label written ``key=value`` or ``key: value``."""
    found = set()
    for name, text in TEXT.items():
        for key, value in re.findall(r"(io\.gpu-alloc\.[a-z.-]+)(?:=|: )([^\s`'\")|,;}]+)", text):
            value = value.rstrip(":.")
            if f"{key}={value}" not in NOT_EXAMPLES and key not in SET_BY_GPU_ALLOC:
                found.add((name, key, value))
    return sorted(found)


@pytest.mark.parametrize(("doc", "key", "value"), label_examples())
def test_every_label_example_is_read_by_gpu_alloc(doc: str, key: str, value: str) -> None:
    given = {key: value}
    assert labels.unknown(given) is None
    read = (
        policy.wanted(given),
        labels.resources(given),
        sharing.share_ask(given),
        policy.wait_of(given, Rules()),
    )
    assert not [r for r in read if isinstance(r, Invalid | str)], read


def test_sharings_memory_example_is_one_mps_share_of_an_80_gb_gpu() -> None:
    ask = sharing.share_ask({labels.SHARE_MEMORY: "16GiB"})
    assert isinstance(ask, sharing.ShareAsk)
    h100 = GPU("GPU-1", 0, memory_mib=81559)
    assert ask.slots(sharing.Sharing((0,), shares=4), h100) == 1
    too_big = sharing.share_ask({labels.SHARE_MEMORY: "20GiB"})
    assert isinstance(too_big, sharing.ShareAsk)
    assert "MPS" in str(too_big.slots(sharing.Sharing((0,), shares=4), h100))


def yaml_snippets() -> list[tuple[str, str]]:
    """The fenced YAML blocks that are config files (not Compose files)."""
    keys = set(configmod._SECTIONS) | set(configmod._SCALARS)
    found = []
    for name, text in TEXT.items():
        for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and set(data) <= keys:
                found.append((name, block))
    return found


def test_the_docs_have_config_snippets() -> None:
    assert len(yaml_snippets()) >= 6


@pytest.mark.parametrize(("doc", "block"), yaml_snippets())
def test_every_config_snippet_loads(doc: str, block: str) -> None:
    configmod.parse(block, doc)  # a ConfigError names the doc and the key


def command_lines() -> list[tuple[str, str]]:
    """(doc, arguments) of each ``gpu-alloc`` line of a fenced shell block."""
    found = []
    for name, text in TEXT.items():
        for block in re.findall(r"```(?:sh|console|bash|shell)\n(.*?)```", text, re.S):
            for line in block.splitlines():
                line = re.sub(r"^\s*[#$]\s*", "", line).split("  #")[0].strip()
                got = re.match(r"(?:sudo )?(?:\S*/)?gpu-alloc\s+(.*)", line)
                if got:
                    found.append((name, got.group(1).replace("[", "").replace("]", "")))
    return found


@pytest.mark.parametrize(("doc", "line"), command_lines())
def test_every_command_line_parses(doc: str, line: str) -> None:
    cli._parser().parse_args(shlex.split(line))


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its own subcommands."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= flags_of(child)
    return found


def prose_flags() -> list[tuple[str, str, str]]:
    """(doc, subcommand, flag) of each flag an inline ``gpu-alloc CMD …`` names."""
    found = set()
    commands = subcommands()
    for name, text in TEXT.items():
        for span in re.findall(r"`(?:sudo )?gpu-alloc ([a-z]+)([^`]*)`", text):
            if span[0] in commands:
                found |= {(name, span[0], f) for f in re.findall(r"--[a-z][a-z-]*", span[1])}
    return sorted(found)


@pytest.mark.parametrize(("doc", "command", "flag"), prose_flags())
def test_every_flag_the_prose_names_exists(doc: str, command: str, flag: str) -> None:
    assert flag in flags_of(subcommands()[command])


def test_the_limit_refusal_policy_md_quotes_is_the_products() -> None:
    quoted = re.search(r"refused with 403 naming the rule: `([^`]+)`", TEXT["policy.md"])
    assert quoted is not None
    rules = Rules(default_limit=2)
    said = policy.over_limit(Owner(1000, "alice"), 2, 1, rules)
    assert said is not None and said.msg == quoted.group(1)
