"""Bindings: which writes the lease observer looks at."""

from __future__ import annotations

from sidecar.recording import bindings
from sidecar.store.commands import ClaimTask, Heartbeat, Release


def test_the_observer_looks_at_every_write_that_changes_a_lease_by_its_operation() -> None:
    # Bindings.done returns at once for any other operation: a lease command renamed
    # without this set would leave the sidecar blind to claims, renewals or releases.
    lease_commands = {ClaimTask.operation, Heartbeat.operation, Release.operation}

    assert lease_commands == bindings._LEASE_OPERATIONS
