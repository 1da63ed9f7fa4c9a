"""The write commands' fields: a base's fields come first, in the order the store's named
writes pass them positionally, and a fenced effect write puts ``key`` before its token."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

import pytest

from sidecar.domain import settling
from sidecar.domain.model import EffectState
from sidecar.store.commands import (
    AppendCheckpoint,
    Command,
    FencedCommand,
    Heartbeat,
    NoteEffect,
    NoteRefusal,
    RecordPending,
    ResolveEffect,
    TransitionEffect,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FAILED_BY_HAND = settling.Resolution(settling.Outcome("failed"), "alice@ops", "checked")


@pytest.mark.parametrize(
    ("command", "names"),
    [
        (Heartbeat("t", "a1", 2, 30.0), ["task", "attempt_id", "generation", "ttl_s"]),
        (
            AppendCheckpoint("t", "a1", 2, "plan", {}),
            ["task", "attempt_id", "generation", "stage", "outputs"],
        ),
        (
            RecordPending("t", "k", "a1", 2, "http", "r", "f", None, {}),
            [
                "task",
                "key",
                "attempt_id",
                "generation",
                "kind",
                "rule",
                "fingerprint",
                "idempotency_key",
                "request",
            ],
        ),
        (
            TransitionEffect("t", "k", "a1", 2, EffectState.FAILED),
            ["task", "key", "attempt_id", "generation", "to", "response", "detail"],
        ),
        (
            NoteEffect("t", "k", "a1", 2, "replayed"),
            ["task", "key", "attempt_id", "generation", "event", "detail"],
        ),
        (
            ResolveEffect("t", "k", FAILED_BY_HAND, NOW, NOW),
            ["task", "key", "resolution", "not_before", "seen_at"],
        ),
        (
            NoteRefusal("t", "a1", 2, 3, "stale"),
            ["task", "attempt_id", "generation", "current_generation", "reason"],
        ),
    ],
)
def test_fields_keep_the_order_the_named_writes_pass(
    command: Command[object], names: list[str]
) -> None:
    assert [f.name for f in fields(command)] == names
    assert command.task == "t"


def test_effect_writes_are_fenced_and_name_their_effect() -> None:
    for command in (
        RecordPending("t", "k", "a1", 2, "http", "r", "f", None, {}),
        TransitionEffect("t", "k", "a1", 2, EffectState.FAILED),
        NoteEffect("t", "k", "a1", 2, "replayed"),
    ):
        assert isinstance(command, FencedCommand)
        assert command.effect_key() == ("t", "k")
        assert (command.attempt_id, command.generation) == ("a1", 2)
    assert Heartbeat("t", "a1", 2).effect_key() is None
