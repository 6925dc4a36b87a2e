"""allocator.core.leases.claims: an adopted container's claim as the ledger keeps it."""

from __future__ import annotations

import json

from allocator.core.leases.claims import Claim, claim_from_json, claim_json


def test_a_claim_with_only_the_first_keys_is_written_as_an_older_gpu_alloc_reads_it():
    bare = Claim("c1", "job", ("GPU-0",), "found running")
    assert set(claim_json(bare)) == {"container", "name", "gpus", "why"}
    assert claim_from_json(json.loads(json.dumps(claim_json(bare)))) == bare


def test_a_claim_keeps_what_its_labels_said_and_an_unpinned_one_stays_unpinned():
    full = Claim("c2", "job", None, "adopted", cpus=(0, 1), mems=(0,), memory=1 << 30,
                 owner="alice", owner_uid=1000, since=5.0, pool="batch")  # fmt: skip
    again = claim_from_json(json.loads(json.dumps(claim_json(full))))
    assert again == full and again.gpus is None
