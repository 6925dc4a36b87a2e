"""allocator.core.api.signals: the checkpoint signal's text, read as Docker reads a signal."""

from __future__ import annotations

import pytest

from allocator.core.api import labels, signals
from allocator.core.api.signals import Signal
from allocator.core.rules import policy


@pytest.mark.parametrize(
    ("text", "signal"),
    [
        ("USR1@5m", Signal("SIGUSR1", 300)),
        ("SIGUSR1@90", Signal("SIGUSR1", 90)),
        ("sigterm@30s", Signal("SIGTERM", 30)),
        ("RTMIN+3@1h", Signal("SIGRTMIN+3", 3600)),
        ("10@2.5s", Signal("10", 2.5)),
        (" USR2 @ 1m ", Signal("SIGUSR2", 60)),
        ("USR1", Signal("SIGUSR1", 60)),  # Slurm's lead when none is given
    ],
)
def test_a_signal_is_read_by_name_or_number_with_its_lead(text, signal):
    assert signals.parse(text) == signal


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("FOO@5m", "'FOO@5m' does not name a signal: expected a signal and how long"),
        ("0@5m", "does not name a signal"),
        ("65@5m", "does not name a signal"),
        ("١٠@5m", "does not name a signal"),  # Arabic-Indic digits: not Docker's
        ("@5m", "does not name a signal"),
        ("KILL@5m", "SIGKILL cannot be caught"),
        ("sigstop@1m", "SIGSTOP cannot be caught"),
        ("9@1m", "9 cannot be caught"),
        ("USR1@soon", "the time before the stop: 'soon' is not a duration"),
        ("USR1@-5", "is not a duration"),
        ("USR1@0", "send it some time before the stop"),
        ("USR1@" + "9" * 30, "is too large"),
    ],
)
def test_a_bad_signal_says_what_was_given_and_what_is_expected(text, said):
    with pytest.raises(ValueError, match=None) as e:
        signals.parse(text)
    assert said in str(e.value)


def test_the_label_is_gpu_allocs_and_a_bad_one_is_a_400_naming_it():
    assert labels.unknown({labels.SIGNAL: "USR1@5m"}) is None
    want = policy.wanted({labels.SIGNAL: "USR1@5m"})
    assert isinstance(want, policy.Wanted) and want.signal == Signal("SIGUSR1", 300)
    bad = policy.wanted({labels.SIGNAL: "KILL@5m"})
    assert isinstance(bad, policy.Invalid)
    assert bad.msg.startswith(
        "gpu-alloc refused the container create: label io.gpu-alloc.signal: 'KILL@5m': SIGKILL"
    )


def test_a_signal_says_itself_as_it_is_sent_and_when():
    assert str(Signal("SIGUSR1", 300)) == "SIGUSR1@300s"
