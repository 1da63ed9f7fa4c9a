"""SQL effects mirrored into the sidecar's effect log.

What happened is decided in the target database (its record commits with the statement,
or does not); the effect log is where ``sidecar effects``, the audit trail and fencing
look.  Before a statement runs, its effect is logged pending - fenced and durable, as
SPEC §3 asks - and that write is awaited.  What follows (completed, failed, replayed)
is written in the background so the agent is not kept waiting, but in order per effect:
the next write of a key waits for the previous one.  They are held back briefly so they
ride in the same SQLite commit as the next statement's pending write (the store commits
whatever is queued together): one durable commit per statement instead of two.  A crash
loses at most those held-back writes, and the target database settles what they would
have said.

Those background writes must land before the attempt's lease is given up, or a write
that arrives after the release is refused as stale and the log shows the next attempt
settling what this one did. :class:`Mirrors` knows every live connection's mirror so
that a release (the control API's, ``serve --task``'s on the way out) can wait for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from sidecar.domain.model import Effect, EffectState
from sidecar.errors import EffectExists, SidecarError, StaleGeneration
from sidecar.pgwire.codec import Message
from sidecar.pgwire.records import Refused, as_response, error_text
from sidecar.pgwire.redaction import normalised
from sidecar.recording.bindings import Binding
from sidecar.recording.recorder import Recorder
from sidecar.rules.matcher import SqlRuleMatch
from sidecar.rules.sql import Statement
from sidecar.runtime.aio import spawn

log = logging.getLogger("sidecar.pgwire")

#: The effect log's states in which the effect may have to run again.
_NOT_DONE = (EffectState.UNKNOWN, EffectState.FAILED)
#: How long a write after the statement waits to share a commit with the next one.
HOLD_S = 0.02


@dataclass(frozen=True, slots=True)
class Done:
    """A statement that ran: its effect, waiting for its transaction to end."""

    binding: Binding
    key: str
    rule: str
    tag: str = ""


async def _after(previous: asyncio.Task[None], write: Coroutine[Any, Any, None]) -> None:
    """``write``, once the previous write of its key is made (it is not cancelled if
    this one is)."""
    await asyncio.wait({previous})
    await write


class Mirrors:
    """Every live connection's :class:`LogMirror`, to wait for their background writes."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[LogMirror] = weakref.WeakSet()

    def add(self, mirror: LogMirror) -> None:
        self._live.add(mirror)

    async def settle(self, timeout_s: float = 2.0) -> None:
        """Start every held-back write and wait (up to ``timeout_s``) until all are made.

        Bounded: a store that does not answer must not hold a release back for ever; the
        target database settles whatever a late write would have said."""
        for mirror in list(self._live):
            mirror.flush()
        behind = {task for mirror in list(self._live) for task in mirror.in_flight()}
        if behind:
            await asyncio.wait(behind, timeout=timeout_s)


class LogMirror:
    """The effect-log writes of one agent connection."""

    def __init__(self, recorder: Recorder, database: str, mirrors: Mirrors | None = None) -> None:
        if mirrors is not None:
            mirrors.add(self)
        # Every write goes through the recorder's bounded retry, as the HTTP path's do: a
        # short store blip must not fail the statement (SPEC §3.4).
        self._durably = recorder.durably
        self._store = recorder.store
        self._metrics = recorder.metrics
        self._database = database
        self._behind: dict[str, asyncio.Task[None]] = {}
        self._held: list[tuple[str, Coroutine[Any, Any, None]]] = []
        # (task, key) of effects completed in the log that run again here, the target
        # database holding no record of them: their outcome is a note, not a state.
        self._again: set[tuple[str, str]] = set()
        self._release: asyncio.TimerHandle | None = None

    async def pending(
        self, binding: Binding, match: SqlRuleMatch, key: str, statement: Statement
    ) -> EffectState | None:
        """Log the effect as pending; if a previous try logged it, that try's state."""
        logged = await self.pending_effect(binding, match, key, statement)
        return None if logged is None else logged.state

    async def pending_effect(
        self, binding: Binding, match: SqlRuleMatch, key: str, statement: Statement
    ) -> Effect | None:
        """Log the effect as pending; if a previous try logged it, that try's effect.

        A previous try still logged pending died before its transaction's outcome was
        mirrored: it becomes unknown, and the target database (the record there, or its
        absence) settles it.
        """
        self.flush()  # the held-back writes join this one's commit
        await self._caught_up(key)
        try:
            await self._durably(lambda: self._store.record_pending(
                binding.task, key, binding.attempt_id, binding.generation,
                kind="sql", rule=match.rule.name,
                fingerprint="sha256:" + hashlib.sha256(statement.normalised.encode()).hexdigest(),
                idempotency_key=None,
                request={"database": self._database, "statement": normalised(statement)[:4000]},
            ))  # fmt: skip
        except EffectExists as logged:
            existing = logged.existing
            if existing.state is EffectState.PENDING:
                existing = await self._durably(lambda: self._store.transition_effect(
                    binding.task, key, binding.attempt_id, binding.generation,
                    EffectState.UNKNOWN,
                    detail="the try that logged it ended before its transaction's outcome was seen",
                ))  # fmt: skip
            return existing
        except StaleGeneration as stale:  # counted by the store's observer, kept by the store
            raise Refused("ES409", f"effect-sidecar: {stale.detail}") from stale
        except SidecarError as error:
            raise Refused("ES503", f"effect-sidecar: {error.detail}") from error
        return None

    async def run_again(self, binding: Binding, key: str, logged: EffectState | None) -> None:
        """No record committed in the target database: a previous try did not happen."""
        if logged is EffectState.COMPLETED:
            log.warning(
                "task %s: effect %s is completed in the effect log but has no record in "
                "database %s (was effect_sidecar.effects emptied?): running it again",
                binding.task, key, self._database,
            )  # fmt: skip
            self._again.add((binding.task, key))
            return
        if logged not in _NOT_DONE:
            return
        try:
            await self._durably(lambda: self._store.transition_effect(
                binding.task, key, binding.attempt_id, binding.generation, EffectState.PENDING,
                detail="no record committed in the target database: running it again",
            ))  # fmt: skip
        except StaleGeneration as stale:
            raise Refused("ES409", f"effect-sidecar: {stale.detail}") from stale
        except SidecarError as error:
            raise Refused("ES503", f"effect-sidecar: {error.detail}") from error

    def replayed(
        self, binding: Binding, key: str, logged: EffectState | None, tag: str, rule: str
    ) -> None:
        self._metrics.effects_by(rule, "replayed").inc()
        self._later(key, self._note_replay(binding, key, logged, tag))

    def ended(self, done: Done, committed: bool) -> None:
        """The transaction holding ``done`` committed, or rolled back."""
        if committed:
            self._later(done.key, self._outcome(done, EffectState.COMPLETED, done.tag))
        else:
            self._later(done.key, self._outcome(done, EffectState.FAILED, "rolled back"))

    def in_doubt(self, done: Done) -> None:
        """The transaction holding ``done`` was prepared for a two-phase commit: unknown
        until COMMIT PREPARED or ROLLBACK PREPARED, which the record in the database
        then tells the next attempt that sends the statement."""
        detail = (
            "prepared for a two-phase commit (PREPARE TRANSACTION): COMMIT PREPARED or "
            "ROLLBACK PREPARED decides, and the record in the database tells the next attempt"
        )
        self._later(done.key, self._outcome(done, EffectState.UNKNOWN, detail))

    async def completed_now(self, done: Done) -> None:
        """Completed, written before the agent is answered: for a statement with no record
        in the target database, the effect log is the only record."""
        await self._outcome(done, EffectState.COMPLETED, done.tag)

    def failed(self, done: Done, answers: list[Message]) -> None:
        """The statement itself failed: nothing happened."""
        self._later(done.key, self._outcome(done, EffectState.FAILED, error_text(answers)))

    def in_flight(self) -> list[asyncio.Task[None]]:
        """The background writes started and not made yet."""
        return list(self._behind.values())

    async def settled(self) -> None:
        """Until every background write has been made (tests, shutdown)."""
        self.flush()
        while self._behind:
            await asyncio.wait(set(self._behind.values()))

    # ---- in order per key ------------------------------------------------------------

    async def _caught_up(self, key: str) -> None:
        behind = self._behind.get(key)
        if behind is not None:
            await asyncio.wait({behind})  # not cancelled if this caller is

    def _later(self, key: str, write: Coroutine[Any, Any, None]) -> None:
        self._held.append((key, write))
        if self._release is None:
            self._release = asyncio.get_running_loop().call_later(HOLD_S, self.flush)

    def flush(self) -> None:
        """Start every held-back write now."""
        if self._release is not None:
            self._release.cancel()
            self._release = None
        held, self._held = self._held, []
        for key, write in held:
            self._start(key, write)

    def _start(self, key: str, write: Coroutine[Any, Any, None]) -> None:
        previous = self._behind.get(key)
        # Nearly always nothing of the key is behind: the write is the task itself.
        task = spawn(
            write if previous is None else _after(previous, write), name=f"pg-mirror:{key}"
        )
        self._behind[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        if self._behind.get(key) is task:
            del self._behind[key]

    # ---- the writes ------------------------------------------------------------------

    async def _note_replay(
        self, binding: Binding, key: str, logged: EffectState | None, tag: str
    ) -> None:
        """Log a replay; a previous try's effect the log did not see commit, as completed."""
        store = self._store
        try:
            if logged is EffectState.FAILED:
                await self._durably(lambda: store.transition_effect(
                    binding.task, key, binding.attempt_id, binding.generation,
                    EffectState.PENDING, detail="a record committed in the target database",
                ))  # fmt: skip
            if logged is not EffectState.COMPLETED:
                await self._durably(lambda: store.transition_effect(
                    binding.task, key, binding.attempt_id, binding.generation,
                    EffectState.COMPLETED, response=as_response(tag),
                    detail=f"{tag}: committed in the target database",
                ))  # fmt: skip
            await self._durably(lambda: store.note_effect(
                binding.task, key, binding.attempt_id, binding.generation, "replayed"
            ))  # fmt: skip
        except SidecarError as error:
            log.warning("replay of %s not written to the effect log: %s", key, error.detail)

    async def _outcome(self, done: Done, outcome: EffectState, detail: str) -> None:
        binding = done.binding
        completed = outcome is EffectState.COMPLETED
        if (binding.task, done.key) in self._again:
            self._again.discard((binding.task, done.key))
            if completed:  # (rolled back or failed, it did not happen again: nothing to say)
                await self._ran_again(done)
            return
        try:
            await self._durably(lambda: self._store.transition_effect(
                binding.task, done.key, binding.attempt_id, binding.generation, outcome,
                response=as_response(done.tag) if completed else None, detail=detail,
            ))  # fmt: skip
            if outcome is not EffectState.UNKNOWN:
                disposition = "recorded" if completed else "rolled_back"
                self._metrics.effects_by(done.rule, disposition).inc()
        except SidecarError as error:
            log.warning("effect %s not mirrored: %s", done.key, error.detail)

    async def _ran_again(self, done: Done) -> None:
        """The log keeps the effect completed by the try that first made it; that it
        happened again, in a database with no record of it, is told by a note."""
        binding = done.binding
        detail = (
            f"{done.tag}: ran again in database {self._database}, which held no record of it "
            "(made again, or its effect_sidecar.effects emptied)"
        )
        try:
            await self._durably(lambda: self._store.note_effect(
                binding.task, done.key, binding.attempt_id, binding.generation, "ran_again",
                detail=detail,
            ))  # fmt: skip
        except SidecarError as error:
            log.warning("effect %s not mirrored: %s", done.key, error.detail)
