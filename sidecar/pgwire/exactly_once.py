"""Exactly-once SQL statements: the record lives in the target database, in the same
transaction as the statement it records.

For a statement a rule matches (in the scope of the connection's task), the sidecar
inserts ``(task, key)`` into ``effect_sidecar.effects`` *in the agent's database*, with
``ON CONFLICT DO NOTHING RETURNING``, in the same transaction as the statement:

* a row comes back - the effect is new: the statement runs, its command tag (and any
  rows it returned) is stored in that row, and statement and record commit - or roll
  back - together.  No window remains between "done" and "recorded";
* no row - a committed record exists: the statement is not sent, the agent gets the
  recorded command tag (and rows) as if it had run.  (A record still being written by
  another connection makes the insert wait for that transaction, so two agents cannot
  both run it.)

A statement outside a transaction is wrapped in one the sidecar opens and commits; one
inside the agent's transaction is recorded in it, and counts only if the agent commits.
The outcome is mirrored into the sidecar's own effect log (for ``sidecar effects``, the
audit trail and fencing): a stale attempt's statement is refused there first
(``ES409``) and never runs.  The sidecar's own statements go by the extended protocol with
parameters under names of its own, so they never disturb the agent's prepared statements.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass, field

from sidecar import failpoints
from sidecar.aio import spawn
from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.errors import EffectExists, SidecarError, StaleGeneration
from sidecar.metrics import Metrics
from sidecar.pgwire import messages
from sidecar.pgwire.codec import Message
from sidecar.pgwire.relay import BindRequest
from sidecar.pgwire.session import SKIPPED, Conversation, Portal
from sidecar.proxy.bindings import Binding, Bindings
from sidecar.rules import EffectKind, RuleSet
from sidecar.rules.matcher import SqlRuleMatch
from sidecar.rules.sql import Statement, split
from sidecar.store import Store

log = logging.getLogger("sidecar.pgwire")

SCHEMA = (
    "SELECT pg_advisory_xact_lock(7301729000)",
    "CREATE SCHEMA IF NOT EXISTS effect_sidecar",
    "CREATE TABLE IF NOT EXISTS effect_sidecar.effects ("
    " task text NOT NULL, key text NOT NULL, attempt_id text NOT NULL,"
    " generation integer NOT NULL, statement text NOT NULL, command_tag text,"
    " row_description bytea, data_rows bytea, recorded_at timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (task, key))",
)
RECORD = (
    "INSERT INTO effect_sidecar.effects (task, key, attempt_id, generation, statement)"
    " VALUES ($1, $2, $3, $4::integer, $5) ON CONFLICT (task, key) DO NOTHING RETURNING 1"
)
COMPLETE = (
    "UPDATE effect_sidecar.effects SET command_tag = $3, row_description = $4::bytea,"
    " data_rows = $5::bytea WHERE task = $1 AND key = $2"
)
RECALL = (
    "SELECT command_tag, row_description, data_rows FROM effect_sidecar.effects"
    " WHERE task = $1 AND key = $2"
)
TX_CONTROL = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT",
                        "RELEASE", "PREPARE"})  # fmt: skip
REFUSED = "DO $$BEGIN RAISE EXCEPTION USING ERRCODE = 'ES409', MESSAGE = 'refused by effect-sidecar'; END$$"  # noqa: E501
UNBOUND = (
    "no task is bound to this connection: run the agent under `sidecar exec` "
    "(it sets PGOPTIONS=-c sidecar.task=...)"
)
REPLAYED, FAILED = "replayed", "failed"
UNDEFINED_TABLE = "42P01"
_names = itertools.count(1)


class Skipped(Exception):
    """The server skipped the sidecar's request (an earlier message of the batch failed)."""


class Refused(Exception):
    """The statement must not run: its answer to the agent is an ErrorResponse."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


@dataclass
class PgEffects:
    """What every connection's engine shares: rules, bindings, the store, schemas made."""

    rules: RuleSet
    bindings: Bindings
    store: Store
    metrics: Metrics
    schemas_ready: set[str] = field(default_factory=set)
    guarded_cache: dict[str, bool] = field(default_factory=dict)

    def engine(self, bind: BindRequest, database: str) -> Statements:
        return Statements(self, bind, database)

    def guards(self, sql: str) -> bool:
        known = self.guarded_cache.get(sql)
        if known is None:
            known = any(self.match(Statement.of(text)) is not None for text in split(sql))
            if len(self.guarded_cache) > 10_000:
                self.guarded_cache.clear()
            self.guarded_cache[sql] = known
        return known

    def match(self, statement: Statement) -> SqlRuleMatch | None:
        found = self.rules.match_sql(statement)
        if found is None or found.rule.effect is not EffectKind.NON_IDEMPOTENT:
            return None
        return found


@dataclass
class _Query:
    """A simple Query being run: the answer so far, and the transaction the sidecar holds."""

    out: bytearray = field(default_factory=bytearray)
    ours_open: bool = False
    in_ours: list[Done] = field(default_factory=list)  # recorded inside our transaction
    committed: list[Done] = field(default_factory=list)


@dataclass
class Done:
    """A guarded statement's effect, waiting for its transaction to end."""

    binding: Binding
    key: str
    tag: str
    rule: str | None = None


class Statements:
    """The engine of one agent connection (see the module docstring)."""

    def __init__(self, shared: PgEffects, bind: BindRequest, database: str) -> None:
        self.shared = shared
        self.bind = bind
        self.database = database
        self.uncommitted: list[Done] = []  # recorded inside a transaction the agent owns
        # The schema was created in the transaction now open: it exists for every other
        # connection only once that transaction commits (see ready()).
        self.schema_in_transaction = False

    def guards(self, sql: str) -> bool:
        return self.shared.guards(sql)

    # ---- simple query protocol ------------------------------------------------------

    async def simple(self, conversation: Conversation, sql: str, raw: bytes) -> None:
        await conversation.wait_idle()  # the transaction status must be known
        statements = [Statement.of(text) for text in split(sql)]
        # A multi-statement Query is one implicit transaction: keep it one.  With explicit
        # transaction control inside it, each guarded statement is wrapped on its own.
        wrap_all = conversation.tracker.status == "I" and not any(
            s.kind in TX_CONTROL for s in statements
        )
        run = _Query()
        try:
            binding = await self._binding()
            if wrap_all:
                await self._begin(conversation, run)
            for statement in statements:
                if not await self._one(conversation, binding, statement, run):
                    break
            else:
                if run.ours_open:
                    await self._commit(conversation, run)
        except Refused as refused:
            if not run.ours_open:
                await self._fail_transaction(conversation)
            run.out += messages.error_response(refused.code, refused.text)
        if run.ours_open:
            await self._run(conversation, "ROLLBACK")  # something failed inside our wrap
        for done in run.committed:
            await self._mirror(done, EffectState.COMPLETED)
        for done in run.in_ours:
            await self._mirror(done, EffectState.FAILED)
        run.out += messages.ready_for_query(conversation.tracker.status)
        conversation.send_client(bytes(run.out))

    async def _one(
        self, conversation: Conversation, binding: Binding, statement: Statement, run: _Query
    ) -> bool:
        """One statement of a simple Query; False if it failed (the rest is skipped)."""
        match = self.shared.match(statement)
        if match is None:
            answers = await self._run(conversation, statement.text)
            run.out += b"".join(a.raw for a in answers if a.kind != b"Z")
            return not any(a.kind == b"E" for a in answers)
        wrap_one = not run.ours_open and conversation.tracker.status == "I"
        if wrap_one:
            await self._begin(conversation, run)
        done, relay = await self._guarded_simple(conversation, binding, match, statement)
        run.out += relay
        if done is FAILED:
            return False
        if isinstance(done, Done):
            (run.in_ours if run.ours_open else self.uncommitted).append(done)
        if wrap_one:
            await self._commit(conversation, run)
        return True

    async def _begin(self, conversation: Conversation, run: _Query) -> None:
        await self._run(conversation, "BEGIN")
        run.ours_open = True

    async def _commit(self, conversation: Conversation, run: _Query) -> None:
        """COMMIT our transaction; if it rolled back, relay the error, mirror as failed."""
        answers = await self._run(conversation, "COMMIT")
        run.ours_open = False
        failed = [a for a in answers if a.kind == b"E"]
        run.out += b"".join(a.raw for a in failed)
        if failed or _tag(answers) != "COMMIT":
            return  # in_ours stay, and are mirrored as failed
        for done in run.in_ours:
            failpoints.reach("sql.after_commit", done.rule)
        run.committed += run.in_ours
        run.in_ours.clear()

    async def _guarded_simple(
        self,
        conversation: Conversation,
        binding: Binding,
        match: SqlRuleMatch,
        statement: Statement,
    ) -> tuple[Done | str, bytes]:
        """Run (or replay) one guarded statement: (its Done, REPLAYED or FAILED; answers)."""
        key = match.key(statement)
        await self._ensure_schema(conversation, sync=True)
        logged = await self._mirror_pending(binding, match, key, statement)
        if not await self._record(conversation, binding, key, statement, sync=True):
            tag, answer = await self._recall(conversation, binding, key, True)
            self._replayed(binding, key, logged, tag)
            return REPLAYED, answer
        await self._run_again(binding, key, logged)
        answers = await self._run(conversation, statement.text)
        relay = b"".join(a.raw for a in answers if a.kind != b"Z")
        if any(a.kind == b"E" for a in answers):
            await self._mirror_failed(binding, key, answers)
            return FAILED, relay
        failpoints.reach("sql.after_statement", match.rule.name)
        tag = _tag(answers)
        rows = b"".join(a.raw for a in answers if a.kind == b"D")
        description = b"".join(a.raw for a in answers if a.kind == b"T")
        await self._complete(conversation, binding, key, tag, description, rows, sync=True)
        return Done(binding, key, tag, match.rule.name), relay

    # ---- extended query protocol ----------------------------------------------------

    async def execute(self, conversation: Conversation, portal: Portal, raw: bytes) -> None:
        statement = Statement.of(portal.statement.sql)
        match = self.shared.match(statement)
        assert match is not None  # the session only hands over guarded statements
        parameters = portal.bind.parameters if portal.bind else ()
        key = match.key(statement, parameters)
        try:
            binding = await self._binding()
            await self._ensure_schema(conversation, sync=False)
            logged = await self._mirror_pending(binding, match, key, statement)
            if not await self._record(conversation, binding, key, statement, sync=False):
                tag, answer = await self._recall(conversation, binding, key, False)
                self._replayed(binding, key, logged, tag)
                conversation.send_client(answer)
                return
            await self._run_again(binding, key, logged)
        except Skipped:
            return  # an earlier message of this batch failed: the server skips to Sync
        except Refused as refused:
            # Make the server fail this transaction too, so it skips the rest of the
            # agent's messages up to Sync exactly as after any error.
            await conversation.ask(*_request(REFUSED, [], sync=False))
            conversation.send_client(messages.error_response(refused.code, refused.text))
            return
        answers = await conversation.ask(raw, messages.FLUSH)
        if any(a.kind == b"E" for a in answers):
            conversation.send_client(b"".join(a.raw for a in answers))
            await self._mirror_failed(binding, key, answers)
            return
        failpoints.reach("sql.after_statement", match.rule.name)
        tag = _tag(answers)
        rows = b"".join(a.raw for a in answers if a.kind == b"D")
        await self._complete(conversation, binding, key, tag, b"", rows, sync=False)
        conversation.send_client(b"".join(a.raw for a in answers))
        self.uncommitted.append(Done(binding, key, tag, match.rule.name))

    def ready(self, status: str, committed: bool) -> None:
        if status != "I":
            return
        if self.schema_in_transaction and committed:
            self.shared.schemas_ready.add(self.database)
        self.schema_in_transaction = False
        if not self.uncommitted:
            return
        ended, self.uncommitted = self.uncommitted, []
        outcome = EffectState.COMPLETED if committed else EffectState.FAILED
        for done in ended:
            if committed:
                failpoints.reach("sql.after_commit", done.rule)
            spawn(self._mirror(done, outcome), name=f"pg-mirror:{done.key}")

    # ---- the sidecar's own statements -----------------------------------------------

    async def _run(self, conversation: Conversation, sql: str) -> list[Message]:
        return await conversation.ask(messages.query(sql))

    async def _ensure_schema(self, conversation: Conversation, *, sync: bool) -> None:
        if self.database in self.shared.schemas_ready or self.schema_in_transaction:
            return
        for sql in SCHEMA:
            answers = await conversation.ask(*_request(sql, [], sync=sync))
            _raise_on_error(answers, "cannot create the effect_sidecar schema")
        self.schema_in_transaction = True

    async def _record(
        self,
        conversation: Conversation,
        binding: Binding,
        key: str,
        statement: Statement,
        *,
        sync: bool,
    ) -> bool:
        """Insert the record; True if it is new (the statement must run)."""
        values = [binding.task, key, binding.attempt_id, str(binding.generation), statement.text]
        answers = await conversation.ask(*_request(RECORD, values, sync=sync))
        if any(
            messages.error_fields(a).get("C") == UNDEFINED_TABLE for a in answers if a.kind == b"E"
        ):
            # Dropped behind the sidecar's back (or the database was re-created): make it
            # again next time instead of failing every statement from now on.
            self.shared.schemas_ready.discard(self.database)
        _raise_on_error(answers, "cannot record the statement in effect_sidecar.effects")
        return any(a.kind == b"D" for a in answers)

    async def _complete(
        self,
        conversation: Conversation,
        binding: Binding,
        key: str,
        tag: str,
        description: bytes,
        rows: bytes,
        *,
        sync: bool,
    ) -> None:
        values = [binding.task, key, tag, _bytea(description), _bytea(rows)]
        answers = await conversation.ask(*_request(COMPLETE, values, sync=sync))
        _raise_on_error(answers, "cannot complete the record in effect_sidecar.effects")

    async def _recall(
        self, conversation: Conversation, binding: Binding, key: str, simple: bool
    ) -> tuple[str, bytes]:
        """The recorded command tag, and the answer as the agent's protocol expects it."""
        answers = await conversation.ask(*_request(RECALL, [binding.task, key], sync=simple))
        _raise_on_error(answers, "cannot read effect_sidecar.effects")
        row = next(messages.data_row_values(a) for a in answers if a.kind == b"D")
        tag = (row[0] or b"").decode()
        description = _unbytea(row[1]) if simple else b""
        return tag, description + _unbytea(row[2]) + messages.command_complete(tag)

    async def _fail_transaction(self, conversation: Conversation) -> None:
        if conversation.tracker.status == "T":
            await self._run(conversation, REFUSED)  # the agent's transaction is now failed

    # ---- binding and the mirror in the effect log ----------------------------------

    async def _binding(self) -> Binding:
        bind = self.bind
        try:
            if bind.task is None:
                raise Refused("ES428", UNBOUND)
            if bind.attempt_id is not None:
                return await self.shared.bindings.for_attempt(bind.task, bind.attempt_id)
            return await self.shared.bindings.for_task(bind.task, "pg")
        except StaleGeneration as stale:
            self.shared.metrics.stale_writes_refused.labels("postgres").inc()
            raise Refused("ES409", f"effect-sidecar: {stale.detail}") from stale
        except SidecarError as error:
            raise Refused("ES" + str(error.status), f"effect-sidecar: {error.detail}") from error

    async def _mirror_pending(
        self, binding: Binding, match: SqlRuleMatch, key: str, statement: Statement
    ) -> EffectState | None:
        """Log the effect as pending; if a previous try logged it, that try's state.

        A previous try still logged pending died before its transaction's outcome was
        mirrored: it becomes unknown, and the target database (the record there, or its
        absence) settles it.
        """
        store = self.shared.store
        try:
            await store.record_pending(
                binding.task, key, binding.attempt_id, binding.generation,
                kind="sql", rule=match.rule.name,
                fingerprint="sha256:" + hashlib.sha256(statement.normalised.encode()).hexdigest(),
                idempotency_key=None,
                request={"database": self.database, "statement": statement.normalised[:4000]},
            )  # fmt: skip
        except EffectExists as logged:
            existing = logged.existing
            if existing.state is EffectState.PENDING:
                existing = await store.transition_effect(
                    binding.task, key, binding.attempt_id, binding.generation,
                    EffectState.UNKNOWN,
                    detail="the try that logged it ended before its transaction's outcome was seen",
                )  # fmt: skip
            return existing.state
        except StaleGeneration as stale:
            raise Refused("ES409", f"effect-sidecar: {stale.detail}") from stale
        except SidecarError as error:
            raise Refused("ES503", f"effect-sidecar: {error.detail}") from error
        return None

    async def _run_again(self, binding: Binding, key: str, logged: EffectState | None) -> None:
        """No record committed in the target database: a previous try did not happen."""
        if logged not in (EffectState.UNKNOWN, EffectState.FAILED):
            if logged is EffectState.COMPLETED:
                log.warning(
                    "task %s: effect %s is completed in the effect log but has no record in "
                    "database %s (was effect_sidecar.effects emptied?): running it again",
                    binding.task, key, self.database,
                )  # fmt: skip
            return
        try:
            await self.shared.store.transition_effect(
                binding.task, key, binding.attempt_id, binding.generation, EffectState.PENDING,
                detail="no record committed in the target database: running it again",
            )  # fmt: skip
        except StaleGeneration as stale:
            raise Refused("ES409", f"effect-sidecar: {stale.detail}") from stale
        except SidecarError as error:
            raise Refused("ES503", f"effect-sidecar: {error.detail}") from error

    def _replayed(self, binding: Binding, key: str, logged: EffectState | None, tag: str) -> None:
        self.shared.metrics.effects.labels("sql", "replayed").inc()
        spawn(self._note(binding, key, logged, tag), name=f"pg-replay:{key}")

    async def _note(self, binding: Binding, key: str, logged: EffectState | None, tag: str) -> None:
        """Log a replay; a previous try's effect the log did not see commit, as completed."""
        store = self.shared.store
        try:
            if logged is EffectState.FAILED:
                await store.transition_effect(
                    binding.task, key, binding.attempt_id, binding.generation,
                    EffectState.PENDING, detail="a record committed in the target database",
                )  # fmt: skip
            if logged is not EffectState.COMPLETED:
                await store.transition_effect(
                    binding.task, key, binding.attempt_id, binding.generation,
                    EffectState.COMPLETED, response=_answered(tag),
                    detail=f"{tag}: committed in the target database",
                )  # fmt: skip
            await store.note_effect(
                binding.task, key, binding.attempt_id, binding.generation, "replayed"
            )
        except SidecarError as error:
            log.warning("replay of %s not written to the effect log: %s", key, error.detail)

    async def _mirror(self, done: Done, outcome: EffectState) -> None:
        binding = done.binding
        try:
            await self.shared.store.transition_effect(
                binding.task, done.key, binding.attempt_id, binding.generation, outcome,
                response=_answered(done.tag) if outcome is EffectState.COMPLETED else None,
                detail=done.tag if outcome is EffectState.COMPLETED else "rolled back",
            )  # fmt: skip
            self.shared.metrics.effects.labels("sql", "recorded").inc()
        except SidecarError as error:
            log.warning("effect %s not mirrored: %s", done.key, error.detail)

    async def _mirror_failed(self, binding: Binding, key: str, answers: list[Message]) -> None:
        await self._mirror(Done(binding, key, _error_text(answers)), EffectState.FAILED)


def _request(sql: str, values: list[str], *, sync: bool) -> list[bytes]:
    name = f"__effect_sidecar_{next(_names)}"
    return [
        messages.parse_message(name, sql),
        messages.bind_message(name, name, [v.encode() for v in values]),
        messages.execute_message(name),
        messages.close_message("P", name),
        messages.close_message("S", name),
        messages.SYNC if sync else messages.FLUSH,
    ]


def _raise_on_error(answers: list[Message], what: str) -> None:
    if any(a.kind == SKIPPED for a in answers):
        raise Skipped(what)
    for answer in answers:
        if answer.kind == b"E":
            raise Refused("ES500", f"effect-sidecar: {what}: {_error_text([answer])}")


def _error_text(answers: list[Message]) -> str:
    for answer in answers:
        if answer.kind == b"E":
            fields = messages.error_fields(answer)
            return f"{fields.get('C', '')} {fields.get('M', '')}".strip()
    return ""


def _tag(answers: list[Message]) -> str:
    return next((messages.command_tag(a) for a in answers if a.kind == b"C"), "")


def _answered(tag: str) -> RecordedResponse:
    """A command tag as the effect log keeps answers (HTTP-shaped: 200 and a header)."""
    return RecordedResponse(200, (("x-command-tag", tag),))


def _bytea(data: bytes) -> str:
    return "\\x" + data.hex()


def _unbytea(value: bytes | None) -> bytes:
    if not value:
        return b""
    text = value.decode()
    return bytes.fromhex(text[2:]) if text.startswith("\\x") else b""
