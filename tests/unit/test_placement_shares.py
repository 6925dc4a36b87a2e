"""The share placement of allocator/core/placement/shares.py: pack onto the GPU with the
most shares out (spread when the rule says), never onto a GPU held whole."""

from __future__ import annotations

from allocator.core.machine.inventory import GPU
from allocator.core.placement import Shortage
from allocator.core.placement.shares import Out, Placed, place
from allocator.core.rules.sharing import ShareAsk, Sharing

GPUS = tuple(GPU(f"GPU-{i}", i, memory_mib=81920, minor=i) for i in range(4))
QUARTERS = Sharing(gpus=(0, 1), shares=4)
SPREAD = Sharing(gpus=(0, 1), shares=4, spread=True)
QUARTER = ShareAsk(1, 4)


def test_shares_pack_onto_the_gpu_with_most_out_and_spread_when_asked() -> None:
    out = {"GPU-1": Out(2, frozenset({"0"}))}
    assert place(QUARTER, GPUS, [QUARTERS], out, ()).gpu.uuid == "GPU-1"
    assert place(QUARTER, GPUS, [SPREAD], out, ()).gpu.uuid == "GPU-0"
    assert place(QUARTER, GPUS, [QUARTERS], {}, ()).gpu.uuid == "GPU-0"


def test_a_full_gpu_sends_the_next_share_to_the_next_gpu() -> None:
    out = {"GPU-0": Out(4, frozenset({"0"}))}
    got = place(QUARTER, GPUS, [QUARTERS], out, ())
    assert isinstance(got, Placed) and (got.gpu.uuid, got.slots, got.of) == ("GPU-1", 1, 4)


def test_a_share_never_lands_on_a_gpu_held_whole() -> None:
    got = place(QUARTER, GPUS, [QUARTERS], {}, {"GPU-0", "GPU-1"})
    assert isinstance(got, Shortage) and got.waitable
    assert "GPU 0: held whole" in got.msg and "GPU 1: held whole" in got.msg


def test_a_share_of_gpus_nobody_shares_is_refused_for_good() -> None:
    got = place(QUARTER, GPUS[2:], [QUARTERS], {}, ())
    assert isinstance(got, Shortage) and not got.waitable
    assert "policy.sharing names none of them" in got.msg
