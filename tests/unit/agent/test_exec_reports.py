"""The pieces of `sidecar exec` that say how an attempt went: ends, lines, environment."""

from __future__ import annotations

import io
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sidecar.agent import worker
from sidecar.agent.leasekeeper import Held, LeaseKeeper
from sidecar.domain.model import AgentExit, Checkpoint
from sidecar.errors import LeaseHeld

AT = datetime(2026, 1, 1, 14, 0, tzinfo=UTC)
CHECKPOINT = Checkpoint("312", 2, "PATCH_GENERATED", "att-1", 1, {"patch_hash": "abc123"}, AT)


def test_exit_of_a_status_and_of_a_signal():
    assert worker.exit_of(0) == AgentExit(exit_code=0)
    assert worker.exit_of(3) == AgentExit(exit_code=3)
    assert worker.exit_of(-9) == AgentExit(signal="SIGKILL")


def test_a_command_that_does_not_exist_ends_as_shells_say():
    assert worker.not_started(FileNotFoundError(2, "No such file")) == AgentExit(
        exit_code=127, error="command not found"
    )
    assert worker.not_started(PermissionError(13, "Permission denied")).exit_code == 126


@pytest.mark.parametrize(
    ("end", "words"),
    [
        (AgentExit(exit_code=3), "exit 3"),
        (AgentExit(signal="SIGKILL"), "killed by SIGKILL"),
        (AgentExit(exit_code=127, error="command not found"), "command not found (127)"),
        (
            AgentExit(signal="SIGTERM", lease_lost=True),
            "lease lost (the agent was stopped: killed by SIGTERM)",
        ),
    ],
)
def test_end_words(end, words):
    assert worker.end_words(end) == words


def test_the_agent_gets_its_last_checkpoint_in_a_private_file(tmp_path):
    held = Held("312", "att-2", 2, AT, CHECKPOINT)
    path = worker.write_last_checkpoint(tmp_path, CHECKPOINT)
    env = worker.agent_environment({}, "http://127.0.0.1:7301", "/ca.pem", held, path)
    assert env["SIDECAR_LAST_STAGE"] == "PATCH_GENERATED"
    assert env["SIDECAR_LAST_CHECKPOINT"] == path
    assert (env["SIDECAR_ATTEMPT_ID"], env["SIDECAR_GENERATION"]) == ("att-2", "2")
    document = json.loads(Path(path).read_text())
    assert document["outputs"] == {"patch_hash": "abc123"}
    assert (document["seq"], document["stage"], document["generation"]) == (
        2,
        "PATCH_GENERATED",
        1,
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_without_a_checkpoint_both_variables_are_empty(tmp_path):
    held = Held("312", "att-1", 1, AT)
    path = worker.write_last_checkpoint(tmp_path, None)
    env = worker.agent_environment({}, "http://127.0.0.1:7301", "/ca.pem", held, path)
    assert env["SIDECAR_LAST_STAGE"] == env["SIDECAR_LAST_CHECKPOINT"] == ""
    assert list(tmp_path.iterdir()) == []


def test_the_claim_line_names_task_attempt_generation_worker_and_stage():
    line = worker.claim_line(Held("312", "att-2", 2, AT, CHECKPOINT), "worker-a")
    assert line == (
        "claimed task 312: attempt att-2, generation 2, worker worker-a, "
        "last checkpoint PATCH_GENERATED (seq 2)"
    )
    assert worker.claim_line(Held("312", "att-1", 1, AT), "w").endswith("last checkpoint none")


def _effect(key, state, *events):
    return {
        "key": key,
        "state": state,
        "events": [{"event": e, "attempt_id": a, "detail": d} for e, a, d in events],
    }


def test_the_tally_counts_only_this_attempts_part():
    tally = worker.AttemptEffects()
    tally.add_effects(
        [
            _effect("a", "completed", ("pending", "att-1", None), ("completed", "att-1", None)),
            _effect("b", "completed", ("pending", "att-1", None), ("replayed", "att-2", None)),
            _effect("c", "completed", ("pending", "att-0", None), ("replayed", "att-2", None)),
            _effect("d", "completed", ("divergent", "att-2", "rejected: payload differs")),
            _effect("e", "unknown", ("pending", "att-0", None), ("unknown", "att-2", "found")),
            _effect("f", "unknown", ("pending", "att-0", None)),
        ],
        "att-2",
    )
    tally.add_refusals(
        [
            {"attempt_id": "att-2", "operation": "proxy", "reason": "superseded by generation 3"},
            {"attempt_id": "att-1", "operation": "checkpoint", "reason": "not mine"},
            {"attempt_id": "att-2", "operation": "heartbeat", "reason": "exec's own"},
            {"attempt_id": "att-2", "operation": "release", "reason": "exec's own"},
        ],
        "att-2",
    )
    assert (tally.recorded, tally.replayed, tally.refused, tally.blocked) == (0, 2, 2, 1)
    assert tally.problems == ["d: rejected: payload differs", "proxy: superseded by generation 3"]
    assert tally.line() == "0 recorded, 2 replayed, 2 refused, 1 blocked"


def test_a_sql_effect_run_again_in_a_database_made_again_counts_as_recorded():
    tally = worker.AttemptEffects()
    ran_again = ("ran_again", "att-2", "CREATE TABLE: ran again in database shop")
    first = [("pending", "att-1", None), ("completed", "att-1", None)]
    tally.add_effects([_effect("a", "completed", *first, ran_again)], "att-2")
    assert tally.line() == "1 recorded, 0 replayed, 0 refused, 0 blocked"


def test_quiet_silences_the_lines_and_waiting_is_said_every_few_seconds(monkeypatch):
    out = io.StringIO()
    notes = worker.Notes(stream=out)
    now = [100.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: now[0])
    held = LeaseHeld("312", "worker-b", "att-1", AT)
    for step in range(10):  # 10 s of pauses of one second
        notes.waiting(held, 20 - step)
        now[0] += 1
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # at 0, 4 and 8 s
    assert lines[0] == (
        "sidecar exec: task 312 is held by worker worker-b (attempt att-1) until "
        "2026-01-01T14:00:00+00:00; waiting (up to 20s more)"
    )
    quiet = worker.Notes(quiet=True, stream=out)
    quiet.say("claimed")
    quiet.waiting(held, 5)
    assert out.getvalue().splitlines() == lines


class _Busy:
    """A lease API whose task is held by worker-b for the first two claims."""

    def __init__(self) -> None:
        self.claims = 0

    async def claim(self, task, worker_name, ttl_s):
        self.claims += 1
        if self.claims <= 2:
            raise LeaseHeld(task, "worker-b", "att-1", datetime.now(UTC) + timedelta(seconds=0.1))
        return Held(task, "att-2", 2, datetime.now(UTC) + timedelta(seconds=ttl_s))

    async def heartbeat(self, held, ttl_s):
        return held

    async def release(self, held, end=None):
        return None


async def test_acquire_says_whom_it_waits_for_before_each_pause():
    waits: list[tuple[str, float]] = []
    keeper = LeaseKeeper(_Busy(), "312", "worker-a", 60)
    held = await keeper.acquire(5, lambda h, left: waits.append((h.holder, left)))
    assert held.attempt_id == "att-2"
    assert [holder for holder, _ in waits] == ["worker-b", "worker-b"]
    assert all(0 < left <= 5 for _, left in waits)
