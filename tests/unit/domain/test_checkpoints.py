"""Checkpoints are numbered per task and written only by the current generation."""

from __future__ import annotations

import pytest

from sidecar.domain import checkpoints, leases
from sidecar.errors import StaleGeneration
from sidecar.runtime.clock import ManualClock


def test_checkpoints_are_numbered_from_one_per_task():
    clock = ManualClock()
    state = leases.claim(None, "312", "a", 10, clock.now(), "att-1").state
    state, first = checkpoints.append(state, "312", "att-1", 1, "READ_COMPLETE", {}, clock.now())
    state, second = checkpoints.append(
        state, "312", "att-1", 1, "PATCH_GENERATED", {"patch_hash": "abc123"}, clock.now()
    )
    assert (first.seq, second.seq) == (1, 2)
    assert second.outputs == {"patch_hash": "abc123"}
    assert state.checkpoint_seq == 2


def test_a_stale_checkpoint_leaves_the_sequence_untouched():
    clock = ManualClock()
    state = leases.claim(None, "312", "a", 10, clock.now(), "att-1").state
    clock.advance(11)
    state = leases.claim(state, "312", "b", 10, clock.now(), "att-2").state
    with pytest.raises(StaleGeneration):
        checkpoints.append(state, "312", "att-1", 1, "PATCH_APPLIED", {}, clock.now())
    assert state.checkpoint_seq == 0
