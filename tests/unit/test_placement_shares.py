"""The share placement of allocator/core/placement/shares.py: pack onto the GPU with the
most shares out (spread when the rule says), never onto a GPU held whole; through the
common placement path, a share takes free slots of the GPU its rules pick."""

from __future__ import annotations

from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import Holder
from allocator.core.machine.inventory import GPU, Inventory, MigPolicy, Slot
from allocator.core.placement import POLICIES, Shortage
from allocator.core.placement import place as place_units
from allocator.core.placement.shares import Out, Placed, held_slots, place, policy
from allocator.core.rules.sharing import ShareAsk, Sharing, listed

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


# --- through the common placement path (allocator/core/placement/__init__.py) -----------------

MIG_GPU = GPU("GPU-9", 9, mig_mode=True)
SLICE = GPU("MIG-9a", 9, parent="GPU-9", profile="1g.10gb", mig_index=0)
HOST = listed(Inventory((*GPUS, MIG_GPU), migs=(SLICE,)), [QUARTERS])
LEASED = Holder("c1", "", "leased by gpu-alloc")


def place_share(
    held: dict[str, Holder], out: dict[str, Out], unhealthy: dict[str, str] | None = None
) -> list[Slot] | Shortage:
    rules = policy(QUARTER, [QUARTERS], out)
    return place_units(
        Ask((), 1, False, ("gpu",)),
        HOST,
        held_slots(held, out),
        POLICIES["first-fit"],
        unhealthy=unhealthy,
        share=rules,
    )


def test_a_share_and_a_mig_slice_are_placed_as_units_by_one_path() -> None:
    share = place_share({}, {})
    assert [s.uuid for s in share] == ["GPU-0::0"]
    mig_slice = place_units(
        Ask((), 1, False, ("gpu",), "1g.10gb"), HOST, {}, POLICIES["first-fit"], mig=MigPolicy.MIXED
    )
    assert mig_slice == [SLICE]


def test_a_share_takes_the_next_free_slot_of_the_gpu_its_rules_pick() -> None:
    out = {"GPU-1": Out(2, frozenset({"0"}))}
    assert [s.uuid for s in place_share({"GPU-1": LEASED}, out)] == ["GPU-1::2"]


def test_a_held_gpu_holds_its_slots_and_an_unhealthy_one_takes_no_share() -> None:
    assert [s.uuid for s in place_share({"GPU-0": LEASED}, {})] == ["GPU-1::0"]
    got = place_share({"GPU-0": LEASED}, {}, unhealthy={"GPU-1": "Xid 79"})
    assert isinstance(got, Shortage) and "GPU 0: held whole" in got.msg and "GPU 1" not in got.msg


def test_slots_held_by_shares_hold_their_gpu_for_a_whole_request() -> None:
    held = held_slots({"GPU-0": LEASED}, {"GPU-0": Out(1, frozenset({"0"}))})
    assert held == {"GPU-0::0": LEASED}
    whole = place_units(Ask(("GPU-0",), 0, False, ("gpu",)), HOST, held, POLICIES["first-fit"])
    assert isinstance(whole, Shortage) and "not free" in whole.msg
