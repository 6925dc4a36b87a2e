"""The checkpoint signal a container asks for: ``USR1@5m``, the label ``io.gpu-alloc.signal``
and ``policy.signal``'s values, read here alone.

``SIGNAL@LEAD``: send SIGNAL to the container LEAD before gpu-alloc stops it (its time
limit, or idle reclaim: allocator/core/timing/checkpoint.py), as Slurm's
``--signal=SIG@seconds`` does.  SIGNAL is read as Docker reads ``--stop-signal`` and
``docker kill --signal``: a name in any case, with or without ``SIG`` (``USR1``,
``SIGUSR1``, ``sigusr1``, ``RTMIN+3``) or a number (``10``); LEAD is a duration
(``90``, ``30s``, ``5m``), and without ``@LEAD`` it is Slurm's 60 s.  SIGKILL and SIGSTOP
are refused: a program cannot catch either, so neither can ask it to checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.api import numbers

DEFAULT_LEAD = 60.0  # Slurm's, for --signal without @seconds
EXPECTED = "a signal and how long before the stop to send it, such as USR1@5m or SIGTERM@90s"
NUMBER = numbers.whole("a signal number from 1 to 64", high=64, low=1)
# Linux's signal names as Docker's signal map has them (github.com/moby/sys/signal).
NAMES = frozenset(
    {
        *("ABRT", "ALRM", "BUS", "CHLD", "CLD", "CONT", "FPE", "HUP", "ILL", "INT", "IO"),
        *("IOT", "KILL", "PIPE", "POLL", "PROF", "PWR", "QUIT", "SEGV", "STKFLT", "STOP"),
        *("SYS", "TERM", "TRAP", "TSTP", "TTIN", "TTOU", "URG", "USR1", "USR2", "VTALRM"),
        *("WINCH", "XCPU", "XFSZ", "RTMIN", "RTMAX"),
        *(f"RTMIN+{n}" for n in range(1, 16)),
        *(f"RTMAX-{n}" for n in range(1, 15)),
    }
)
# Uncatchable: by name, and by number on Linux (SIGSTOP is 19 on x86 and Arm).
UNCATCHABLE = frozenset({"SIGKILL", "SIGSTOP", "9", "19"})


@dataclass(frozen=True)
class Signal:
    """``name``: as the Engine's kill API takes it (``SIGUSR1``, or a number as text);
    ``lead``: seconds before the stop."""

    name: str
    lead: float

    def __str__(self) -> str:
        return f"{self.name}@{self.lead:g}s"


def parse(text: object) -> Signal:
    """The `Signal` in ``text``; a ValueError saying what was given and what is expected."""
    given = str(text).strip()
    raw, at, lead_text = given.partition("@")
    name = _name(raw.strip())
    if name is None:
        raise ValueError(f"'{given[:40]}' does not name a signal: expected {EXPECTED}")
    if name in UNCATCHABLE:
        raise ValueError(
            f"'{given[:40]}': {name} cannot be caught, so it cannot ask for a checkpoint; "
            "name one the program traps, such as USR1 or TERM"
        )
    if not at:
        return Signal(name, DEFAULT_LEAD)
    try:
        lead = float(numbers.read(lead_text, numbers.DURATION))
    except numbers.BadNumber as e:
        raise ValueError(f"'{given[:40]}': the time before the stop: {e}") from None
    if lead <= 0:
        raise ValueError(f"'{given[:40]}': send it some time before the stop, such as @5m")
    return Signal(name, lead)


def _name(raw: str) -> str | None:
    """``raw`` as the kill API takes it, or None when Docker would not read it as a signal."""
    if raw.isascii() and raw.isdigit():
        value = numbers.maybe(raw, NUMBER)
        return None if value is None else str(value)
    bare = raw.upper().removeprefix("SIG")
    return f"SIG{bare}" if bare in NAMES else None
