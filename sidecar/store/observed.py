"""Turning store writes into metrics and structured log lines.

Installed on a store by the server (``store.observer = MetricsObserver(metrics)``), so
every write is counted and logged the same way whether it came from the control API,
the HTTP proxy or the PostgreSQL relay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.domain.model import Claim
from sidecar.errors import EffectExists, LeaseHeld, SidecarError, StaleGeneration
from sidecar.runtime.metrics import Children, Metrics
from sidecar.store.base import WriteObserver
from sidecar.store.commands import AppendCheckpoint, Command, FencedCommand

log = logging.getLogger("sidecar.store")

# (event, fields): see sidecar.serve.notify.
type Announce = Callable[[str, Mapping[str, Any]], None]


def _context(command: Command[Any], result: Any = None) -> dict[str, Any]:
    fields: dict[str, Any] = {"task": command.task, "operation": command.operation}
    if isinstance(result, Claim):
        fields |= {"attempt_id": result.attempt_id, "generation": result.generation}
    elif isinstance(command, FencedCommand):
        fields |= {"attempt_id": command.attempt_id, "generation": command.generation}
    key = command.effect_key()
    if key is not None:
        fields["effect_key"] = key[1]
    return fields


def _silent(event: str, fields: Mapping[str, Any]) -> None:
    """No one to tell."""


class MetricsObserver(WriteObserver):
    """Counts and logs every store write; announces takeovers and refused stale writes."""

    def __init__(self, metrics: Metrics, announce: Announce = _silent) -> None:
        self.metrics = metrics
        self.announce = announce
        # Every write counts in these: their children made once (a measurable share of a
        # checkpoint otherwise).
        self._writes = Children(metrics.store_writes)
        self._write_seconds = Children(metrics.store_write_seconds)

    def done(self, command: Command[Any], result: Any, seconds: float) -> None:
        m = self.metrics
        self._writes(command.operation, "ok").inc()
        self._write_seconds(command.operation).observe(seconds)
        if isinstance(command, AppendCheckpoint):
            m.checkpoint_write_seconds.observe(seconds)
        if isinstance(result, Claim):
            m.claims.labels("granted").inc()
            if result.previous_attempt_id:  # it ended an attempt that never released
                m.lease_takeovers.inc()
                self.announce(
                    "lease_taken_over",
                    {
                        "task": result.task,
                        "attempt_id": result.attempt_id,
                        "generation": result.generation,
                        "worker": result.worker,
                        "previous_attempt_id": result.previous_attempt_id,
                    },
                )
        if not log.isEnabledFor(logging.INFO):
            return  # the line below is built only if someone will read it
        fields = _context(command, result)
        if isinstance(result, Claim) and result.previous_attempt_id:
            fields["previous_attempt_id"] = result.previous_attempt_id
        if hasattr(result, "state") and hasattr(result, "key"):
            fields["state"] = str(result.state)
        log.info("%s ok", command.operation, extra=fields)

    def refused(self, command: Command[Any], error: SidecarError, seconds: float) -> None:
        m = self.metrics
        m.store_writes.labels(command.operation, error.code).inc()
        fields = _context(command) | {"code": error.code}
        if isinstance(error, LeaseHeld):
            m.claims.labels("lease_held").inc()
            m.lease_conflicts.inc()
            fields["holder"] = error.holder
        elif isinstance(error, StaleGeneration):
            m.stale_writes_refused.labels(command.operation).inc()
            fields["current_generation"] = error.current_generation
            self.announce(
                "stale_write_refused",
                {
                    "task": command.task,
                    "operation": command.operation,
                    "attempt_id": fields.get("attempt_id"),
                    "generation": fields.get("generation"),
                    "current_generation": error.current_generation,
                },
            )
        elif command.operation == "claim":
            m.claims.labels(error.code).inc()
        # An effect already logged is how replays are found: expected, not a warning.
        level = (
            logging.ERROR
            if error.status >= 500
            else logging.INFO
            if isinstance(error, EffectExists)
            else logging.WARNING
        )
        log.log(level, "%s refused: %s", command.operation, error.detail, extra=fields)
