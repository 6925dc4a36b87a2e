"""Editing a running stack's policy as an operator does (the config file, rewritten), and
waiting for the shim and the plugin to say they reloaded it."""

from __future__ import annotations

import time
from typing import Any

import yaml

RELOADED_WITHIN = 10.0  # seconds: the watchers look every 2 s


def set_policy(stack: Any, **changes: object) -> None:
    """Set the ``policy`` keys ``changes`` names in ``stack``'s config file."""
    config = yaml.safe_load(stack.config_path.read_text())
    config["policy"].update(changes)
    stack.config_path.write_text(yaml.safe_dump(config, sort_keys=False))


def log_sizes(stack: Any) -> dict[str, int]:
    """How much the shim's and the plugin's logs hold now, for `wait_for_log`."""
    return {role: len((stack.dir / f"{role}.log").read_text()) for role in ("shim", "plugin")}


def wait_for_log(stack: Any, text: str, since: dict[str, int]) -> dict[str, str]:
    """What each of the shim's and the plugin's logs said since ``since``, once both say
    ``text``; no request is made meanwhile."""
    deadline = time.monotonic() + RELOADED_WITHIN
    while True:
        new = {r: (stack.dir / f"{r}.log").read_text()[n:] for r, n in since.items()}
        if all(text in said for said in new.values()):
            return new
        assert time.monotonic() < deadline, f"no {text!r} in {RELOADED_WITHIN}s: {new}"
        time.sleep(0.2)
